"""The audit trail: ChangeEvent and NodeStatus are read-only; each event says which
nodes have applied it."""

from __future__ import annotations

import pytest
from django.urls import reverse

from urlguard.models import ChangeEvent, NodeStatus
from urlguard.writepath import changes

pytestmark = pytest.mark.django_db

EVENTS = reverse("admin:urlguard_changeevent_changelist")


def test_events_list_who_what_when_and_where_applied(superuser, django_assert_max_num_queries):
    for i in range(5):
        changes.add_rule(f"r{i}.example.com/", category="spam", actor=superuser.user)
    rule = changes.add_rule("gone.example.com/", category="malware")
    changes.remove_rule(rule, actor=superuser.user)
    NodeStatus.objects.create(node="node-a", filter_path="/x", applied_seq=7)
    NodeStatus.objects.create(node="node-b", filter_path="/x", applied_seq=3)
    # One NodeStatus query per page, not one per row.
    with django_assert_max_num_queries(12):
        page = superuser.get(EVENTS)
    html = page.content.decode()
    assert page.status_code == 200
    assert "gone.example.com/" in html and "remove" in html.lower()
    assert superuser.user.username in html
    events = {e.seq: e for e in page.context["cl"].result_list}
    assert events[7].applied_nodes_ == ["node-a"] and events[7].pending_nodes_ == ["node-b"]
    assert events[3].applied_nodes_ == ["node-a", "node-b"]
    assert events[4].pending_nodes_ == ["node-b"]


def test_event_detail_is_read_only(superuser):
    changes.add_rule("r.example.com/", category="spam")
    event = ChangeEvent.objects.get()
    page = superuser.get(reverse("admin:urlguard_changeevent_change", args=[event.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    assert "no node has reported yet" in html and 'name="_save"' not in html
    assert (
        superuser.post(
            reverse("admin:urlguard_changeevent_change", args=[event.pk]), {"expression": "x"}
        ).status_code
        == 403
    )
    assert superuser.get(reverse("admin:urlguard_changeevent_add")).status_code == 403
    assert (
        superuser.post(
            reverse("admin:urlguard_changeevent_delete", args=[event.pk]), {"post": "yes"}
        ).status_code
        == 403
    )
    assert ChangeEvent.objects.get().expression == "r.example.com/"


def test_events_need_view_permission(viewer, make_staff):
    assert viewer.get(EVENTS).status_code == 403
    assert make_staff("view_changeevent").get(EVENTS).status_code == 200


def test_node_status_is_read_only(superuser):
    node = NodeStatus.objects.create(node="n", filter_path="/x")
    assert superuser.get(reverse("admin:urlguard_nodestatus_changelist")).status_code == 200
    assert (
        superuser.post(
            reverse("admin:urlguard_nodestatus_change", args=[node.pk]), {"node": "m"}
        ).status_code
        == 403
    )
