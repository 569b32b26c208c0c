"""The allowlist acts at once: allowing a host withdraws the feed listings that block
it whole (in one change set, hand-listed rules shown and left), the next refresh
(304 or a body) keeps them out, and taking the host off lists them again without
waiting for the feed to change; the same from `manage.py allow_host`, from an
allowlist feed, and the migration of manual allowlist sources."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from tests.support.feedserver import lines
from urlguard.feeds.refresh import refresh_source
from urlguard.models import (
    AllowedHost,
    AllowlistRefusal,
    ChangeSet,
    RuleSource,
    Source,
    SpamRule,
)
from urlguard.writepath import changes
from urlguard.writepath.allowlist import allow_host, unallow_host
from urlguard.writepath.rules import RuleError

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("quiet_feeds")]


def rules() -> set[str]:
    return set(SpamRule.objects.values_list("expression", flat=True))


def listed(source: Source) -> set[str]:
    return set(RuleSource.objects.filter(source=source).values_list("rule__expression", flat=True))


@pytest.fixture
def hosts_feed(server) -> Source:
    url = server.serve(
        "/hosts", lines("code-host.example", "evil.example", "docs.code-host.example"), ETag='"v1"'
    )
    feed = Source.objects.create(name="hosts", kind=Source.Kind.FEED, url=url)
    assert refresh_source(feed).status == "ok"
    assert rules() == {"code-host.example/", "evil.example/", "docs.code-host.example/"}
    return feed


def test_allowing_withdraws_the_feed_listing_at_once(hosts_feed, admin_user):
    result = allow_host(
        "https://code-host.example/some/page", note="feed mistake", actor=admin_user
    )
    assert result.host == "code-host.example" and result.created
    assert rules() == {"evil.example/", "docs.code-host.example/"}  # a child host is narrower
    assert result.withdrawn == [("code-host.example/", "hosts")] and result.rules_removed == 1
    cs = result.change_set
    assert (cs.kind, cs.removed, cs.actor) == ("allowlist", 1, admin_user)
    assert "code-host.example" in cs.reason and "feed mistake" in cs.reason
    entry = AllowedHost.objects.get(host="code-host.example")
    assert (entry.source, entry.note, entry.added_by) == (None, "feed mistake", admin_user)
    assert list(AllowlistRefusal.objects.values_list("source__name", "expression")) == [
        ("hosts", "code-host.example/")
    ]


def test_a_parent_domain_rule_is_withdrawn_too(server):
    url = server.serve("/f", lines("example.org", "other.example"))
    feed = Source.objects.create(name="f", kind=Source.Kind.FEED, url=url)
    refresh_source(feed)
    allow_host("docs.example.org")
    assert rules() == {"other.example/"}


def test_the_next_refresh_keeps_it_out_whether_304_or_a_new_body(server, hosts_feed):
    allow_host("code-host.example")
    not_modified = refresh_source(hosts_feed)
    assert not_modified.status == "not-modified"
    assert "code-host.example/" not in rules()
    server.serve("/hosts", lines("code-host.example", "evil.example", "new.example"), ETag='"v2"')
    changed = refresh_source(hosts_feed)
    assert changed.status == "ok" and changed.refused == 1
    assert rules() == {"evil.example/", "new.example/"}
    # The refusal is still on record, for the day the host leaves the allowlist.
    assert AllowlistRefusal.objects.filter(expression="code-host.example/").exists()


def test_removing_the_host_lists_the_feed_again_without_a_new_body(hosts_feed, server):
    allow_host("code-host.example")
    result = unallow_host("code-host.example")
    assert result.relisted == [("code-host.example/", "hosts")] and result.rules_added == 1
    assert "code-host.example/" in listed(hosts_feed)
    assert result.change_set.kind == "allowlist" and result.change_set.added == 1
    assert not AllowlistRefusal.objects.exists()
    assert refresh_source(hosts_feed).status == "not-modified"
    assert "code-host.example/" in rules()


def test_a_refusal_the_feed_no_longer_lists_is_forgotten(server, hosts_feed):
    allow_host("code-host.example")
    server.serve("/hosts", lines("evil.example"), ETag='"v2"')
    refresh_source(hosts_feed, accept_shrink=True)
    assert not AllowlistRefusal.objects.exists()
    unallow_host("code-host.example")
    assert "code-host.example/" not in rules()


def test_a_host_listed_first_after_allowlisting_comes_in_when_it_is_removed(server):
    allow_host("code-host.example")
    url = server.serve("/f", lines("code-host.example", "evil.example"), ETag='"a"')
    feed = Source.objects.create(name="f", kind=Source.Kind.FEED, url=url)
    assert refresh_source(feed).refused == 1
    assert rules() == {"evil.example/"}
    unallow_host("code-host.example")
    assert "code-host.example/" in listed(feed)


def test_another_allowlisted_host_still_keeps_a_parent_rule_out(server):
    url = server.serve("/f", lines("example.org"))
    feed = Source.objects.create(name="f", kind=Source.Kind.FEED, url=url)
    refresh_source(feed)
    allow_host("a.example.org")
    allow_host("b.example.org")
    unallow_host("a.example.org")
    assert rules() == set()  # b.example.org still forbids example.org/
    unallow_host("b.example.org")
    assert rules() == {"example.org/"}


def test_a_rule_added_by_hand_is_shown_and_left(hosts_feed):
    rule = SpamRule.objects.get(expression="code-host.example/")
    changes.add_rules(["code-host.example"], source="admin")  # the admin lists it too
    result = allow_host("code-host.example")
    assert result.left == [rule] and "code-host.example/" in rules()
    assert listed(hosts_feed) == {"evil.example/", "docs.code-host.example/"}
    assert any("listed by hand" in line for line in result.lines())


def test_a_refresh_under_way_does_not_add_a_host_allowlisted_meanwhile(server, monkeypatch):
    from urlguard.feeds import refresh

    url = server.serve("/f", lines("code-host.example", "evil.example"))
    feed = Source.objects.create(name="f", kind=Source.Kind.FEED, url=url)
    diff = refresh._diff_and_apply

    def allow_meanwhile(*args, **kwargs):
        allow_host("code-host.example")
        return diff(*args, **kwargs)

    monkeypatch.setattr(refresh, "_diff_and_apply", allow_meanwhile)
    result = refresh_source(feed)
    assert rules() == {"evil.example/"} and result.refused == 1
    assert AllowlistRefusal.objects.filter(expression="code-host.example/").exists()


def test_bad_hosts_are_refused():
    with pytest.raises(RuleError, match="path or page"):
        allow_host("code-host.example/some/path")
    with pytest.raises(RuleError):
        allow_host("com")
    with pytest.raises(LookupError, match="not on the allowlist"):
        unallow_host("code-host.example")


def test_allowing_twice_keeps_one_entry_and_updates_the_note():
    first = allow_host("code-host.example", note="one")
    # Nothing withdrawn, but the host's entry is in the change log.
    assert first.change_set is not None
    assert [e.action for e in first.change_set.events.all()] == ["allow"]
    again = allow_host("code-host.example", note="two")
    assert not again.created and again.change_set is None
    assert list(AllowedHost.objects.values_list("host", "note")) == [("code-host.example", "two")]
    assert ChangeSet.objects.count() == 1  # the second changed nothing: no empty change set


def test_allow_host_command(hosts_feed):
    out = io.StringIO()
    call_command("allow_host", "code-host.example", "--note", "popular", stdout=out)
    text = out.getvalue()
    assert "code-host.example is on the allowlist" in text
    assert "1 feed listing withdrawn (hosts): code-host.example/" in text
    assert "code-host.example/" not in rules()
    out = io.StringIO()
    call_command("allow_host", "--remove", "code-host.example", stdout=out)
    assert "listed again (hosts): code-host.example/" in out.getvalue()
    assert "code-host.example/" in rules()
    with pytest.raises(CommandError, match="not on the allowlist"):
        call_command("allow_host", "--remove", "code-host.example")
    with pytest.raises(CommandError, match="no host to allowlist"):
        call_command("allow_host", "code-host.example/a/b")


def test_an_allowlist_feed_acts_at_once_too(server, hosts_feed):
    url = server.serve("/allow", lines("code-host.example"))
    allow = Source.objects.create(name="top", kind=Source.Kind.FEED, url=url, is_allowlist=True)
    result = refresh_source(allow)
    assert result.status == "ok"
    assert "code-host.example/" not in rules()
    assert ChangeSet.objects.get(pk=result.change_set).kind == "allowlist"
    server.serve("/allow", lines("other.example"))
    refresh_source(allow, accept_shrink=True)
    assert "code-host.example/" in rules()


def test_a_refresh_under_way_keeps_the_record_of_a_listing_withdrawn_meanwhile(
    server, hosts_feed, monkeypatch
):
    from urlguard.feeds import refresh

    server.serve("/hosts", lines("code-host.example", "evil.example", "more.example"), ETag='"v2"')
    diff = refresh._diff_and_apply

    def allow_meanwhile(*args, **kwargs):
        allow_host("code-host.example")  # after this refresh read the allowlist
        return diff(*args, **kwargs)

    monkeypatch.setattr(refresh, "_diff_and_apply", allow_meanwhile)
    refresh_source(hosts_feed)
    assert "code-host.example/" not in rules()
    unallow_host("code-host.example")
    assert "code-host.example/" in listed(hosts_feed)


def test_allowing_passes_over_a_listing_whose_source_is_gone():
    # A listing refers to its source without a database constraint: one left behind
    # (what dangling_references reports) must not stop a host being allowlisted.
    from django.db import connection

    gone = Source.objects.create(name="gone", kind=Source.Kind.FEED, url="file:///dev/null")
    feed = Source.objects.create(name="kept", kind=Source.Kind.FEED, url="file:///dev/null")
    changes.add_rules(["bad.example"], source=gone)
    changes.add_rules(["bad.example"], source=feed)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE urlguard_changeset SET source_id = NULL WHERE source_id = %s", [gone.pk]
        )
        cursor.execute("DELETE FROM urlguard_source WHERE id = %s", [gone.pk])
    result = allow_host("bad.example")
    assert result.withdrawn == [("bad.example/", "kept")]
    assert not listed(feed)
