"""Change lists cost a fixed number of queries however many rows a page shows (no
query per row): spam rules with who added them, short links with their verdicts
(one Guard.check_many and one table query for its hits per page), the change log with
the nodes that applied each event."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from urlguard.models import NodeStatus, ShortLink
from urlguard.writepath import changes

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_guard")]


def _queries(client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return len(captured)


def _add_rules(n: int, start: int, users) -> None:
    # Rules by several users, so a per-row lookup of added_by would show.
    for i in range(start, start + n):
        changes.add_rule(f"q{i}.example.com", category="spam", actor=users[i % len(users)])


def _same_cost_for_more_rules(client, make_staff, url, assert_max) -> str:
    """Queries for a page of 2 rules (by 3 users) bound those for 62; returns the page."""
    users = [make_staff().user for _ in range(3)]
    _add_rules(2, 0, users)
    few = _queries(client, url)
    _add_rules(60, 2, users)
    with assert_max(few):
        html = client.get(url).content.decode()
    assert "q61.example.com/" in html and all(user.username in html for user in users)
    return html


def test_rule_changelist(superuser, make_staff, django_assert_max_num_queries):
    _same_cost_for_more_rules(
        superuser,
        make_staff,
        reverse("admin:urlguard_spamrule_changelist"),
        django_assert_max_num_queries,
    )


def test_short_link_changelist_with_verdicts(
    superuser, build_filter, django_assert_max_num_queries
):
    changes.add_rules([f"spam{i}.example.com" for i in range(40)], source="test")
    build_filter()
    url = reverse("admin:urlguard_shortlink_changelist")

    def links(start: int, n: int) -> None:
        ShortLink.objects.bulk_create(
            ShortLink(
                slug=f"s{i}",
                destination=(
                    f"https://www.spam{i % 40}.example.com/x"
                    if i % 2
                    else f"https://clean{i}.example.org/"
                ),
            )
            for i in range(start, start + n)
        )

    links(0, 2)
    few = _queries(superuser, url)
    links(2, 78)  # 40 of the 80 are blocked, each by its own rule
    with django_assert_max_num_queries(few):
        html = superuser.get(url).content.decode()
    assert html.count("verdict verdict-blocked") == 40


def test_change_log_list(superuser, make_staff, django_assert_max_num_queries):
    NodeStatus.objects.create(node="a", filter_path="/x", applied_seq=3)
    NodeStatus.objects.create(node="b", filter_path="/x", applied_seq=50)
    html = _same_cost_for_more_rules(
        superuser,
        make_staff,
        reverse("admin:urlguard_changeevent_changelist"),
        django_assert_max_num_queries,
    )
    assert "pending: a" in html


def test_change_set_changelist_with_its_undo_column(editor, django_assert_max_num_queries):
    from urlguard.models import ChangeSet

    url = reverse("admin:urlguard_changeset_changelist")
    changes.add_rule("first.example.com", category="spam")
    few = _queries(editor, url)
    for i in range(30):
        changes.add_rule(f"more{i}.example.com", category="spam")
    with django_assert_max_num_queries(few):
        html = editor.get(url).content.decode()
    assert html.count("changeset-undo") == ChangeSet.objects.count() == 31
