"""Allowlist changes are change-log rows (`allow`, `unallow`, the host as expression),
written with the allowlist's own change through changes.record_allowlist: the exports'
positions carry them (RPZ serial and IXFR, in test_serve_dns; ABP patches and ETags,
in test_exports), nodes pass over them (the filter holds rules only), and reverting a
change set holding them still works."""

from __future__ import annotations

import pytest

from tests.support.feedserver import lines
from urlguard.feeds.refresh import refresh_source
from urlguard.models import ChangeEvent, Source, SpamRule
from urlguard.nodesync import sync
from urlguard.writepath import changes
from urlguard.writepath.allowlist import allow_host, unallow_host
from urlguard.writepath.revert import revert_change_set

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("quiet_feeds")]


def allowlist_rows(after: int = 0) -> list[tuple[str, str]]:
    rows = ChangeEvent.objects.filter(seq__gt=after, action__in=["allow", "unallow"])
    return list(rows.order_by("seq").values_list("action", "expression"))


def test_allowing_and_unallowing_a_host_are_rows_of_its_change_set(admin_user):
    allowed = allow_host("partner.example", actor=admin_user)
    assert allowlist_rows() == [("allow", "partner.example")]
    event = allowed.change_set.events.get()
    assert (event.actor, event.source, event.category) == (admin_user, "allowlist", "")
    assert ChangeEvent.objects.head() == event.seq  # the position moved
    allow_host("partner.example", note="again")  # no change: no row
    assert changes.record_allowlist(["partner.example"]) == 0
    removed = unallow_host("partner.example")
    assert allowlist_rows() == [("allow", "partner.example"), ("unallow", "partner.example")]
    assert [e.action for e in removed.change_set.events.all()] == ["unallow"]


def test_an_allowlist_feed_and_turning_its_source_off_and_on_are_logged(server):
    url = server.serve("/allow", lines("a.example", "b.example"), ETag='"1"')
    feed = Source.objects.create(name="partners", kind=Source.Kind.FEED, url=url, is_allowlist=True)
    assert refresh_source(feed).status == "ok"
    assert allowlist_rows() == [("allow", "a.example"), ("allow", "b.example")]
    head = ChangeEvent.objects.head()
    server.serve("/allow", lines("b.example", "c.example"), ETag='"2"')
    assert refresh_source(feed, accept_shrink=True).status == "ok"
    assert allowlist_rows(head) == [("unallow", "a.example"), ("allow", "c.example")]
    # A person's entry keeps a host in force when the feed drops it.
    allow_host("b.example")
    head = ChangeEvent.objects.head()
    Source.objects.filter(pk=feed.pk).update(enabled=False)  # what the admin's action does
    assert changes.record_allowlist() == 1  # every host: only c.example left the allowlist
    assert allowlist_rows(head) == [("unallow", "c.example")]


def test_nodes_pass_over_allowlist_rows(filter_path, sync_filter):
    changes.add_rule("evil.example/", category="malware", source="test")
    first = sync_filter()
    entries = sync.registry.get_filter(str(filter_path)).info()["stages"][0]["count"]
    allow_host("partner.example")
    unallow_host("partner.example")
    result = sync_filter()
    assert result.applied == 2 and not result.rebuilt
    assert result.applied_seq == ChangeEvent.objects.head() > first.applied_seq
    filt = sync.registry.get_filter(str(filter_path))
    assert filt.info()["stages"][0]["count"] == entries and "evil.example/" in filt
    assert sync.verify(str(filter_path)).missing == 0


def test_reverting_an_allowlisting_still_brings_back_what_it_withdrew(server):
    url = server.serve("/hosts", lines("code-host.example", "evil.example"), ETag='"v1"')
    feed = Source.objects.create(name="hosts", kind=Source.Kind.FEED, url=url)
    refresh_source(feed)
    allowed = allow_host("code-host.example")
    assert [e.action for e in allowed.change_set.events.order_by("seq")] == ["allow", "remove"]
    revert = revert_change_set(allowed.change_set)
    assert (revert.added, revert.removed) == (1, 0)
    assert SpamRule.objects.filter(expression="code-host.example/").exists()


def test_the_admin_logs_an_allowlist_source_turned_off_and_on(server, make_staff):
    from django.urls import reverse

    url = server.serve("/allow", lines("a.example", "b.example"), ETag='"1"')
    feed = Source.objects.create(name="partners", kind=Source.Kind.FEED, url=url, is_allowlist=True)
    refresh_source(feed)
    admin = make_staff(superuser=True)
    changelist = reverse("admin:urlguard_source_changelist")
    head = ChangeEvent.objects.head()
    admin.post(changelist, {"action": "disable", "_selected_action": [feed.pk]})
    assert allowlist_rows(head) == [("unallow", "a.example"), ("unallow", "b.example")]
    head = ChangeEvent.objects.head()
    admin.post(changelist, {"action": "enable", "_selected_action": [feed.pk]})
    assert allowlist_rows(head) == [("allow", "a.example"), ("allow", "b.example")]


def test_the_admin_logs_a_source_turned_off_in_a_filtered_list_or_its_form(server, make_staff):
    from django.urls import reverse

    url = server.serve("/allow", lines("a.example"), ETag='"1"')
    feed = Source.objects.create(name="partners", kind=Source.Kind.FEED, url=url, is_allowlist=True)
    refresh_source(feed)
    admin = make_staff(superuser=True)
    # The list shows enabled sources only: after the update the filter selects none.
    changelist = reverse("admin:urlguard_source_changelist") + "?enabled__exact=1"
    head = ChangeEvent.objects.head()
    admin.post(changelist, {"action": "disable", "_selected_action": [feed.pk]})
    assert allowlist_rows(head) == [("unallow", "a.example")]
    Source.objects.filter(pk=feed.pk).update(enabled=True)
    changes.record_allowlist(["a.example"])
    head = ChangeEvent.objects.head()
    change = reverse("admin:urlguard_source_change", args=[feed.pk])
    form = admin.get(change).context["adminform"].form
    data = {name: value for name, value in form.initial.items() if value is not None}
    data.update({"enabled": "", "is_allowlist": "on", "_save": "Save"})
    data.update({"allowed_hosts-TOTAL_FORMS": "0", "allowed_hosts-INITIAL_FORMS": "0"})
    response = admin.post(change, data)
    assert response.status_code == 302, response.content[:2000]
    assert allowlist_rows(head) == [("unallow", "a.example")]


@pytest.fixture
def back_to_the_latest_schema():
    """The migration test moves the schema back; every later test needs it whole."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    yield
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
def test_the_migration_logs_the_hosts_in_force(back_to_the_latest_schema):
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    from urlguard.exports.rpzjournal import UPGRADE_SOURCE

    before, ours = ("urlguard", "0017_hit_events"), ("urlguard", "0018_allowlist_events")
    executor = MigrationExecutor(connection)
    executor.migrate([before])
    apps = executor.loader.project_state([before]).apps
    OldSource = apps.get_model("urlguard", "Source")
    OldHost = apps.get_model("urlguard", "AllowedHost")
    on = OldSource.objects.create(
        name="on", kind="feed", url="https://x.example/a", is_allowlist=True
    )
    off = OldSource.objects.create(
        name="off", kind="feed", url="https://x.example/b", is_allowlist=True, enabled=False
    )
    OldHost.objects.create(source=None, host="by-hand.example")
    OldHost.objects.create(source=on, host="feed.example")
    OldHost.objects.create(source=on, host="by-hand.example")
    OldHost.objects.create(source=off, host="off.example")
    executor = MigrationExecutor(connection)
    executor.migrate([ours])
    rows = ChangeEvent.objects.filter(source=UPGRADE_SOURCE).order_by("seq")
    assert list(rows.values_list("action", "expression")) == [
        ("allow", "by-hand.example"),
        ("allow", "feed.example"),
    ]
    # From here a host's latest row says whether it is allowlisted.
    assert changes.record_allowlist() == 0
    unallow_host("by-hand.example")  # the feed still lists it: still in force
    assert changes.record_allowlist() == 0
    assert allowlist_rows(rows.last().seq) == []


def test_the_admin_change_log_shows_allowlist_rows(make_staff):
    from django.urls import reverse

    event = allow_host("partner.example").change_set.events.get()
    admin = make_staff(superuser=True)
    page = admin.get(reverse("admin:urlguard_changeevent_changelist"))
    assert page.status_code == 200
    assert "partner.example" in page.content.decode() and "Allowlist" in page.content.decode()
    detail = admin.get(reverse("admin:urlguard_changeevent_change", args=[event.seq]))
    assert detail.status_code == 200 and "partner.example" in detail.content.decode()
