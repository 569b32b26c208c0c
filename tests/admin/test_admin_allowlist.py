"""The Allowlist admin: its own entry with host, note, who and when; adding a host
withdraws the feed listings that block it and says so (hand-listed rules are named
and left); deleting it lists them again; hosts of an allowlist feed are read-only;
and the migration that turns manual allowlist sources into allowlist entries."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.urls import reverse

from urlguard.models import AllowedHost, AllowlistRefusal, RuleSource, Source, SpamRule
from urlguard.writepath import changes

ALLOWLIST_EDITOR = ("view_allowedhost", "add_allowedhost", "delete_allowedhost", "view_spamrule")


@pytest.fixture(autouse=True)
def _quiet(quiet):
    pass


def feed_lists(*expressions: str) -> Source:
    feed = Source.objects.create(name="hosts", kind="feed", url="https://feeds.example/h")
    changes.add_rules(list(expressions), source=feed)
    return feed


@pytest.mark.django_db
def test_the_admin_index_names_the_allowlist(make_staff):
    html = make_staff(*ALLOWLIST_EDITOR).get(reverse("admin:index")).content.decode()
    assert ">Allowlist<" in html


@pytest.mark.django_db
def test_adding_a_host_withdraws_the_feed_rule_and_says_so(make_staff):
    feed_lists("github.com", "evil.example")
    changes.add_rules(["github.com"], source="admin")
    hand = SpamRule.objects.get(expression="github.com/")
    client = make_staff(*ALLOWLIST_EDITOR)
    add = reverse("admin:urlguard_allowedhost_add")
    form = client.get(add).content.decode()
    assert "Feeds may then not" in form and 'name="source"' not in form
    response = client.post(add, {"host": "https://GitHub.com/x", "note": "popular"}, follow=True)
    html = response.content.decode()
    assert "Allowlisted github.com." in html
    assert "1 feed listing withdrawn (hosts): github.com/" in html
    assert "still blocks github.com" in html and f"/spamrule/{hand.pk}/change/" in html
    entry = AllowedHost.objects.get()
    assert (entry.host, entry.note, entry.added_by) == ("github.com", "popular", client.user)
    assert not RuleSource.objects.filter(rule=hand, source__name="hosts").exists()
    listing = client.get(reverse("admin:urlguard_allowedhost_changelist")).content.decode()
    assert "github.com" in listing and "by hand" in listing and "popular" in listing
    again = client.post(add, {"host": "github.com", "note": ""}).content.decode()
    assert "already on the allowlist" in again


@pytest.mark.django_db
def test_a_path_is_refused(make_staff):
    client = make_staff(*ALLOWLIST_EDITOR)
    html = client.post(
        reverse("admin:urlguard_allowedhost_add"), {"host": "github.com/a/b", "note": ""}
    ).content.decode()
    assert "names a path or page" in html and not AllowedHost.objects.exists()


@pytest.mark.django_db
def test_deleting_a_host_lists_the_feed_again(make_staff):
    feed = feed_lists("github.com")
    client = make_staff(*ALLOWLIST_EDITOR)
    client.post(reverse("admin:urlguard_allowedhost_add"), {"host": "github.com", "note": ""})
    assert not SpamRule.objects.exists()
    entry = AllowedHost.objects.get()
    delete = reverse("admin:urlguard_allowedhost_delete", args=[entry.pk])
    html = client.post(delete, {"post": "yes"}, follow=True).content.decode()
    assert "Took github.com off the allowlist" in html and "listed again (hosts)" in html
    assert RuleSource.objects.filter(source=feed, rule__expression="github.com/").exists()
    assert not AllowlistRefusal.objects.exists()


@pytest.mark.django_db
def test_a_feeds_host_cannot_be_edited_or_deleted_here(make_staff):
    allow = Source.objects.create(
        name="top", kind="feed", url="https://x.example/t", is_allowlist=True
    )
    entry = AllowedHost.objects.create(source=allow, host="example.com")
    client = make_staff(*ALLOWLIST_EDITOR, "change_allowedhost")
    page = client.get(reverse("admin:urlguard_allowedhost_change", args=[entry.pk]))
    html = page.content.decode()
    assert "the feed" in html and 'name="note"' not in html
    delete = reverse("admin:urlguard_allowedhost_delete", args=[entry.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 403
    assert AllowedHost.objects.exists()


def _migration_names() -> tuple[str, str]:
    executor = MigrationExecutor(connection)
    ours = next(
        name
        for app, name in executor.loader.graph.nodes
        if app == "urlguard" and name == "0015_allowlist"
    )
    before = next(
        parent[1]
        for parent in executor.loader.graph.node_map[("urlguard", ours)].parents
        if parent.key[0] == "urlguard"
    )
    return before, ours


@pytest.fixture
def back_to_the_latest_schema():
    """The migration test moves the schema back; every later test needs it whole."""
    yield
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
def test_the_migration_carries_manual_allowlists_over(back_to_the_latest_schema):
    before, ours = _migration_names()
    executor = MigrationExecutor(connection)
    executor.migrate([("urlguard", before)])
    apps = executor.loader.project_state([("urlguard", before)]).apps
    OldSource = apps.get_model("urlguard", "Source")
    OldHost = apps.get_model("urlguard", "AllowedHost")
    mine = OldSource.objects.create(name="mine", kind="manual", is_allowlist=True)
    theirs = OldSource.objects.create(name="theirs", kind="manual", is_allowlist=True)
    off = OldSource.objects.create(name="off", kind="manual", is_allowlist=True, enabled=False)
    feed = OldSource.objects.create(
        name="top", kind="feed", url="https://x.example/t", is_allowlist=True
    )
    OldHost.objects.create(source=mine, host="github.com", note="ours")
    OldHost.objects.create(source=mine, host="gitlab.com")
    OldHost.objects.create(source=theirs, host="github.com")
    OldHost.objects.create(source=theirs, host="bitbucket.org", note="theirs")
    OldHost.objects.create(source=off, host="off.example")
    OldHost.objects.create(source=feed, host="feed.example")
    executor = MigrationExecutor(connection)
    executor.migrate([("urlguard", ours)])
    by_hand = dict(AllowedHost.objects.filter(source=None).values_list("host", "note"))
    assert by_hand == {
        "github.com": "ours",
        "gitlab.com": "from the allowlist 'mine'",
        "bitbucket.org": "theirs",
    }
    assert set(Source.objects.values_list("name", flat=True)) >= {"off", "top"}
    assert not Source.objects.filter(name__in=["mine", "theirs"]).exists()
    assert AllowedHost.objects.get(host="feed.example").source.name == "top"
    assert AllowedHost.objects.get(host="off.example").source.name == "off"
