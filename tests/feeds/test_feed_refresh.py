"""urlguard.feeds.refresh against a local HTTP server: the first refresh lists
everything, later ones apply exactly the difference, a rule stays while any source
lists it, a conditional GET costs nothing, a broken upstream changes nothing, a big
shrink is held until accepted, the allowlist refuses whole-host rules, concurrent
refreshes do not double-apply, and the filter agrees with the table after it all."""

from __future__ import annotations

import gzip
import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from tests.support.feedserver import admit_loopback, fixture
from urlguard.feeds import listing, memo, staging
from urlguard.feeds import refresh as refreshing
from urlguard.feeds.refresh import RefreshStatus, refresh_source
from urlguard.models import (
    AllowedHost,
    ChangeEvent,
    ChangeSet,
    FeedRefresh,
    RuleSource,
    Source,
    SpamRule,
)
from urlguard.writepath import changes

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def quiet(nudges, settings):
    settings.URLGUARD = {**settings.URLGUARD, "FEED_READ_TIMEOUT": 0.5, "FEED_CONNECT_TIMEOUT": 1}
    admit_loopback(settings)


def lines(*hosts: str) -> bytes:
    return "".join(f"{h}\n" for h in hosts).encode()


def make_feed(url: str, name: str = "feed-a", **fields) -> Source:
    return Source.objects.create(name=name, kind=Source.Kind.FEED, url=url, **fields)


def listed(source: Source) -> set[str]:
    return set(RuleSource.objects.filter(source=source).values_list("rule__expression", flat=True))


def rules() -> set[str]:
    return set(SpamRule.objects.values_list("expression", flat=True))


@pytest.mark.usefixtures("whole_and_in_partitions")
def test_first_refresh_lists_everything(server):
    feed = make_feed(server.serve("/openphish.txt", fixture("openphish.txt")))
    result = refresh_source(feed)
    assert result.status == "ok", result.error
    assert (result.entries, result.added, result.removed, result.refused) == (8, 8, 0, 1)
    assert result.rules_added == 8 and len(rules()) == 8 and listed(feed) == rules()
    feed.refresh_from_db()
    assert (feed.last_status, feed.last_entries, feed.last_http_status) == ("ok", 8, 200)
    assert feed.last_success_at is not None and feed.failures == 0
    cs = ChangeSet.objects.get(pk=result.change_set)
    assert (cs.kind, cs.source, cs.added, cs.removed, cs.refused) == ("refresh", feed, 8, 0, 1)
    history = FeedRefresh.objects.get()
    assert history.refusals[0][0] == 10 and "one URL per line" in history.refusals[0][2]


@pytest.mark.usefixtures("whole_and_in_partitions")
def test_second_version_applies_exactly_the_difference(server):
    url = server.serve("/list.txt", lines("a.example", "b.example", "c.example", "d.example"))
    feed = make_feed(url)
    refresh_source(feed)
    first_seq = ChangeEvent.objects.head()
    server.serve("/list.txt", lines("a.example", "b.example", "c.example", "e.example"))
    result = refresh_source(feed)
    assert (result.added, result.removed, result.unchanged) == (1, 1, 3)
    events = ChangeEvent.objects.filter(seq__gt=first_seq).order_by("seq")
    assert [(e.action, e.expression) for e in events] == [
        ("add", "e.example/"),
        ("remove", "d.example/"),
    ]
    assert rules() == {"a.example/", "b.example/", "c.example/", "e.example/"}


@pytest.mark.usefixtures("whole_and_in_partitions")
def test_a_rule_listed_elsewhere_survives_when_one_source_drops_it(server):
    changes.add_rule("hand.example/", category="spam", note="mine")
    a = make_feed(server.serve("/a", lines("hand.example", "both.example", "a-only.example")))
    b = make_feed(server.serve("/b", lines("both.example")), name="feed-b")
    refresh_source(a)
    refresh_source(b)
    assert ChangeEvent.objects.filter(expression="both.example/").count() == 1
    server.serve("/a", lines("other.example"))
    # Dropping three of three is over the shrink threshold: accept it.
    result = refresh_source(a, accept_shrink=True)
    assert result.removed == 3 and result.rules_removed == 1
    assert rules() == {"hand.example/", "both.example/", "other.example/"}
    hand = SpamRule.objects.get(expression="hand.example/")
    assert hand.note == "mine"
    assert set(hand.listings.values_list("source__name", flat=True)) == {"admin"}


def test_conditional_get_and_not_modified(server):
    feed = make_feed(server.serve("/l", lines("a.example", "b.example"), ETag='"v1"'))
    refresh_source(feed)
    feed.refresh_from_db()
    assert feed.etag == '"v1"'
    before = ChangeEvent.objects.head()
    result = refresh_source(feed)
    assert result.status == "not-modified" and result.http_status == 304
    assert server.requests[-1][1].get("If-None-Match") == '"v1"'
    assert ChangeEvent.objects.head() == before and len(rules()) == 2
    feed.refresh_from_db()
    assert feed.last_status == "not-modified" and feed.last_entries == 2


def test_last_modified_is_sent_back(server):
    stamp = "Sun, 22 Nov 2026 04:05:03 GMT"
    feed = make_feed(server.serve("/l", lines("a.example"), Last_Modified=stamp))
    refresh_source(feed)
    refresh_source(feed)
    assert server.requests[-1][1].get("If-Modified-Since") == stamp


def never_answer(server):
    def handler(request):
        server.release.wait(10)

    return handler


def cut_short(request):
    # Promises more than it sends, then closes the connection.
    request.send_response(200)
    request.send_header("Content-Length", "100000")
    request.end_headers()
    request.wfile.write(b"a.example\n")
    request.close_connection = True


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("500", "HTTP 500"),
        ("404", "HTTP 404"),
        ("timeout", "timed out|Read timed out"),
        ("truncated-gzip", "truncated"),
        ("cut-short", "cut short"),
        ("empty", "no entries"),
        ("only-bad-lines", "no entries"),
        ("html", "HTML"),
        ("binary", "not UTF-8"),
        ("refused", "cannot fetch"),
    ],
)
def test_a_broken_upstream_changes_nothing(server, case, match):
    feed = make_feed(server.serve("/l", lines("a.example", "b.example", "c.example")))
    refresh_source(feed)
    before = (rules(), ChangeEvent.objects.head())
    big = gzip.compress(lines(*(f"h{i}.example" for i in range(5000))))
    answers = {
        "500": (500, {}, b"oops"),
        "404": (404, {}, b"gone"),
        "timeout": never_answer(server),
        "truncated-gzip": (200, {}, big[: len(big) // 2]),
        "cut-short": cut_short,
        "empty": (200, {}, b""),
        "only-bad-lines": (200, {}, b"# nothing\nnot a url at all\ncom\n"),
        "html": (200, {}, b"<!doctype html>\n<html><body>Maintenance</body></html>\n"),
        "binary": (200, {}, b"\xff\xfe\x00\x01" * 100),
    }
    if case == "refused":
        feed.url = "http://127.0.0.1:1/l"  # nothing listens there
        feed.save()
    else:
        server.routes["/l"] = answers[case]
    result = refresh_source(feed)
    assert result.status == "failed"
    assert __import__("re").search(match, result.error), result.error
    assert (rules(), ChangeEvent.objects.head()) == before
    feed.refresh_from_db()
    assert feed.last_status == "failed" and feed.failures == 1 and match.split("|")[0][:4]
    assert feed.last_entries == 3  # the last good refresh's figures stay
    assert FeedRefresh.objects.filter(status="failed").count() == 1
    assert result.transient == (case in ("500", "timeout", "cut-short", "refused"))


@pytest.mark.usefixtures("whole_and_in_partitions")
def test_a_big_shrink_is_held_until_accepted(server):
    hosts = [f"h{i}.example" for i in range(10)]
    feed = make_feed(server.serve("/l", lines(*hosts)))
    refresh_source(feed)
    server.serve("/l", lines(hosts[0]))  # 90% gone
    before = ChangeEvent.objects.head()
    held = refresh_source(feed)
    assert held.status == "held" and held.removed == 9
    assert ChangeEvent.objects.head() == before and len(rules()) == 10
    feed.refresh_from_db()
    assert (feed.last_status, feed.held_removed, feed.held_entries) == ("held", 9, 1)
    assert feed.etag == "" and feed.held_at is not None
    # Held again on the next refresh: nothing is applied by waiting.
    assert refresh_source(feed).status == "held"
    accepted = refreshing.accept_held(feed)
    assert accepted.status == "ok" and accepted.rules_removed == 9
    assert rules() == {"h0.example/"}
    feed.refresh_from_db()
    assert feed.held_at is None and feed.last_status == "ok"
    assert "shrink accepted" in ChangeSet.objects.get(pk=accepted.change_set).reason


@pytest.mark.usefixtures("whole_and_in_partitions")
def test_a_feed_drained_a_little_at_a_time_is_held_against_its_high_water_mark(server):
    # 49% a refresh stays under the threshold each time; once drained 100 -> 2 in
    # 7 refreshes, never held.
    hosts = [f"h{i}.example" for i in range(100)]
    feed = make_feed(server.serve("/l", lines(*hosts)))
    refresh_source(feed)
    server.serve("/l", lines(*hosts[:51]))
    assert refresh_source(feed).status == "ok"
    server.serve("/l", lines(*hosts[:27]))  # 47% of 51, but 27 of the 100 listed
    held = refresh_source(feed)
    assert held.status == "held" and len(rules()) == 51
    accepted = refreshing.accept_held(feed)
    assert accepted.status == "ok" and len(rules()) == 27
    # An accepted shrink sets a new mark: the same list is not held again.
    server.serve("/l", lines(*hosts[:26]))
    assert refresh_source(feed).status == "ok"


def test_the_shrink_window_is_a_setting(server, settings):
    settings.URLGUARD = {**settings.URLGUARD, "FEED_SHRINK_WINDOW": 0}
    hosts = [f"h{i}.example" for i in range(100)]
    feed = make_feed(server.serve("/l", lines(*hosts)))
    for keep in (51, 27, 14):
        server.serve("/l", lines(*hosts[:keep]))
        assert refresh_source(feed).status == "ok"
    FeedRefresh.objects.update(at=timezone.now() - timedelta(days=30))
    settings.URLGUARD = {**settings.URLGUARD, "FEED_SHRINK_WINDOW": 86400}
    server.serve("/l", lines(*hosts[:8]))
    assert refresh_source(feed).status == "ok"  # the marks are older than the window


def test_shrink_threshold_is_a_setting(server, settings):
    settings.URLGUARD = {**settings.URLGUARD, "FEED_SHRINK_THRESHOLD": 0.95}
    hosts = [f"h{i}.example" for i in range(10)]
    feed = make_feed(server.serve("/l", lines(*hosts)))
    refresh_source(feed)
    server.serve("/l", lines(hosts[0]))
    assert refresh_source(feed).status == "ok"


@pytest.mark.usefixtures("whole_and_in_partitions")
def test_allowlist_refuses_whole_host_rules_but_not_narrower_ones(server):
    allow = make_feed(
        server.serve("/allow", lines("www.bigplatform.example", "docs.example.org")),
        name="allow",
        is_allowlist=True,
    )
    assert refresh_source(allow).status == "ok"
    assert set(AllowedHost.objects.values_list("host", flat=True)) == {
        "www.bigplatform.example",
        "docs.example.org",
    }
    assert not SpamRule.objects.exists()  # an allowlist lists no rules
    feed = make_feed(
        server.serve(
            "/feed",
            lines(
                "www.bigplatform.example",  # the allowlisted host: refused
                "bigplatform.example",  # a parent of it: refused
                "www.bigplatform.example/user/evil/",  # a path on it: accepted
                "docs.example.org/d/phish",  # a page: accepted
                "evil.docs.example.org",  # a child host is narrower: accepted
                "evil.example",
            ),
        )
    )
    result = refresh_source(feed)
    assert result.refused == 2
    assert rules() == {
        "www.bigplatform.example/user/evil/",
        "docs.example.org/d/phish",
        "evil.docs.example.org/",
        "evil.example/",
    }
    reasons = [r[2] for r in result.refusals]
    assert all("allowlist" in r for r in reasons)
    assert ChangeSet.objects.get(pk=result.change_set).refused == 2


@pytest.mark.usefixtures("whole_and_in_partitions")
def test_a_host_allowlisted_later_leaves_the_feed_at_its_next_refresh(server):
    feed = make_feed(server.serve("/feed", lines("a.example", "b.example", "c.example")))
    refresh_source(feed)
    allow = Source.objects.create(name="allowlist", kind="manual", is_allowlist=True)
    AllowedHost.objects.create(source=allow, host="a.example")
    server.serve("/feed", lines("a.example", "b.example", "c.example", "d.example"))
    result = refresh_source(feed)
    assert (result.refused, result.removed) == (1, 1)
    assert "a.example/" not in rules()


def test_admin_warning_for_an_allowlisted_host():
    from urlguard.writepath.allowlist import warning

    allow = Source.objects.create(name="allowlist", kind="manual", is_allowlist=True)
    AllowedHost.objects.create(source=allow, host="www.example.com")
    assert "allowlisted" in warning("example.com/")
    assert warning("example.com/some/page") is None
    allow.enabled = False
    allow.save()
    assert warning("example.com/") is None


def test_a_second_refresh_while_one_runs_does_nothing(server):
    feed = make_feed(server.serve("/l", lines("a.example")))
    Source.objects.filter(pk=feed.pk).update(
        refreshing_since=__import__("django").utils.timezone.now()
    )
    result = refresh_source(feed)
    assert result.status is RefreshStatus.BUSY and not SpamRule.objects.exists()
    assert not server.requests


def _exited_process() -> str:
    """The owner string of a process of this host that has exited."""
    import subprocess
    import sys

    from urlguard.runtime import ownership

    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return f"{ownership.this_host()}:{int(done.stdout)}:1"


def test_a_claim_whose_process_died_is_taken_over_at_once(server, caplog):
    from django.utils import timezone

    feed = make_feed(server.serve("/l", lines("a.example")))
    now = timezone.now()
    Source.objects.filter(pk=feed.pk).update(
        refreshing_since=now, refresh_owner=_exited_process(), refresh_heartbeat=now
    )
    result = refresh_source(feed)
    assert result.status == "ok" and rules() == {"a.example/"}
    assert "took over the refresh claimed at" in caplog.text and "is dead" in caplog.text
    feed.refresh_from_db()
    assert (feed.refreshing_since, feed.refresh_owner, feed.refresh_heartbeat) == (None, "", None)


def test_a_claim_elsewhere_waits_for_its_heartbeat_to_stop(server, settings):
    from datetime import timedelta

    from django.utils import timezone

    settings.URLGUARD = {**settings.URLGUARD, "HEARTBEAT_TIMEOUT": 60}
    feed = make_feed(server.serve("/l", lines("a.example")))
    now = timezone.now()
    elsewhere = "worker-2.invalid:77:123 task 9a"
    Source.objects.filter(pk=feed.pk).update(
        refreshing_since=now - timedelta(minutes=5),
        refresh_owner=elsewhere,
        refresh_heartbeat=now - timedelta(seconds=5),
    )
    busy = refresh_source(feed)
    assert busy.status is RefreshStatus.BUSY and not server.requests
    assert "pid 77 on worker-2.invalid (Celery task 9a)" in busy.summary()
    assert "heartbeat 5 s ago" in busy.summary()
    Source.objects.filter(pk=feed.pk).update(refresh_heartbeat=now - timedelta(seconds=61))
    assert refresh_source(feed).status == "ok" and rules() == {"a.example/"}


def test_a_refresh_leaves_a_claim_taken_over_from_it_alone(server, monkeypatch):
    feed = make_feed(server.serve("/l", lines("a.example")))
    real = listing.listed_keys
    other = "worker-2.invalid:77:123"

    def taken_over_meanwhile(source):
        Source.objects.filter(pk=source.pk).update(refresh_owner=other)
        return real(source)

    monkeypatch.setattr(listing, "listed_keys", taken_over_meanwhile)
    refresh_source(feed)
    feed.refresh_from_db()
    assert feed.refresh_owner == other and feed.refreshing_since is not None


@pytest.mark.usefixtures("whole_and_in_partitions")
def test_an_interrupted_refresh_is_finished_in_its_own_change_set(server):
    from django.core.management import call_command

    feed = make_feed(server.serve("/l", lines("a.example", "b.example")))
    # What a refresh killed after its first chunk leaves: a rule, its listing and
    # event, and its change set unfinished, its writer dead.
    partial = ChangeSet.objects.create(
        kind="refresh", source=feed, finished=None, owner=_exited_process()
    )
    changes.add_rules(["a.example"], source=feed, change_set=partial)
    out = io.StringIO()
    call_command("feeds_info", stdout=out)
    assert "partial: 1 rules of a refresh interrupted at" in out.getvalue()
    assert f"({partial}); the next refresh finishes it" in out.getvalue()
    result = refresh_source(feed)
    assert (result.status, result.added, result.change_set) == ("ok", 1, partial.pk)
    partial.refresh_from_db()
    assert partial.finished is not None and partial.owner == "" and partial.added == 2
    assert ChangeSet.objects.filter(kind="refresh").count() == 1
    out = io.StringIO()
    call_command("feeds_info", stdout=out)
    assert "partial" not in out.getvalue()


def test_an_interrupted_refresh_that_was_reverted_is_not_written_into_again(server):
    feed = make_feed(server.serve("/l", lines("a.example", "b.example")))
    partial = ChangeSet.objects.create(
        kind="refresh", source=feed, finished=None, owner=_exited_process()
    )
    changes.add_rules(["a.example"], source=feed, change_set=partial)
    from urlguard.writepath import revert

    revert.revert_change_set(partial)
    result = refresh_source(feed)
    assert result.status == "ok" and result.change_set != partial.pk
    assert ChangeSet.objects.get(pk=result.change_set).added == 2


@pytest.mark.usefixtures("whole_and_in_partitions")
def test_two_refreshes_from_the_same_old_state_do_not_double_apply(server, monkeypatch):
    feed = make_feed(server.serve("/l", lines("a.example", "b.example", "c.example")))
    refresh_source(feed)
    stale = listing.listed_keys(feed)
    server.serve("/l", lines("a.example", "b.example", "d.example"))
    # Both refreshes diff against the state before either applied.
    monkeypatch.setattr(listing, "listed_keys", lambda source: stale)
    first = refresh_source(feed)
    second = refresh_source(feed)
    assert (first.added, first.removed, second.added, second.removed) == (1, 1, 1, 1)
    assert second.rules_added == 0 and second.rules_removed == 0
    assert ChangeEvent.objects.filter(expression="d.example/").count() == 1
    assert ChangeEvent.objects.filter(expression="c.example/").count() == 2  # add, remove
    assert rules() == {"a.example/", "b.example/", "d.example/"}


@pytest.mark.usefixtures("whole_and_in_partitions")
def test_dry_run_writes_nothing(server):
    feed = make_feed(server.serve("/l", lines("a.example", "b.example")))
    result = refresh_source(feed, dry_run=True)
    assert (result.status, result.added) == (RefreshStatus.DRY_RUN, 2)
    assert not SpamRule.objects.exists() and not FeedRefresh.objects.exists()
    feed.refresh_from_db()
    assert feed.last_status == "never"


def test_file_url_and_unchanged_file(tmp_path, settings):
    settings.URLGUARD = {**settings.URLGUARD, "FEED_FILE_ROOT": str(tmp_path)}
    path = tmp_path / "list.txt"
    path.write_bytes(lines("a.example", "b.example"))
    feed = make_feed(f"file://{path}")
    assert refresh_source(feed).added == 2
    assert refresh_source(feed).status == "not-modified"
    path.write_bytes(lines("a.example", "b.example", "c.example"))
    import os

    os.utime(path, (1, 1))
    assert refresh_source(feed).added == 1


def test_redirects_are_followed_but_bounded(server, settings):
    server.serve("/final", lines("a.example"))
    server.serve("/hop", b"", status=302, Location="/final")
    feed = make_feed(server.url("/hop"))
    assert refresh_source(feed).status == "ok"
    server.serve("/loop", b"", status=302, Location="/loop")
    feed.url = server.url("/loop")
    feed.save()
    result = refresh_source(feed)
    assert result.status == "failed" and "redirects" in result.error


def test_size_limit(server, settings):
    settings.URLGUARD = {**settings.URLGUARD, "FEED_MAX_BYTES": 1000}
    feed = make_feed(server.serve("/l", lines(*(f"h{i}.example" for i in range(500)))))
    result = refresh_source(feed)
    assert result.status == "failed" and "FEED_MAX_BYTES" in result.error


@pytest.mark.usefixtures("whole_and_in_partitions")
def test_verify_filter_passes_after_refreshes(server, sync_filter):
    a = make_feed(server.serve("/a", lines(*(f"h{i}.example" for i in range(40)))))
    b = make_feed(server.serve("/b", lines(*(f"h{i}.example" for i in range(30, 60)))), name="b")
    refresh_source(a)
    refresh_source(b)
    sync_filter()
    server.serve("/a", lines(*(f"h{i}.example" for i in range(20, 50))))
    refresh_source(a)
    server.routes["/b"] = (500, {}, b"")
    refresh_source(b)
    sync_filter()
    out = io.StringIO()
    call_command("verify_filter", stdout=out)
    assert out.getvalue().startswith("OK: all 40 rules")


@pytest.fixture
def normalized(monkeypatch) -> list[str]:
    """The texts the refresh normalizes: by normalize_rule, or read as plain URLs by
    plain_expressions (of a span of the spool, those first)."""
    calls: list[str] = []
    real, real_plain = staging.normalize_rule, staging.plain_expressions

    def counting(text: str) -> str:
        calls.append(text)
        return real(text)

    def counting_plain(texts: list[str]) -> list[str | None]:
        found = real_plain(texts)
        calls.extend(t for t, e in zip(texts, found, strict=True) if e is not None)
        return found

    monkeypatch.setattr(staging, "normalize_rule", counting)
    monkeypatch.setattr(staging, "plain_expressions", counting_plain)
    return calls


@pytest.mark.usefixtures("whole_and_in_partitions")
def test_a_refresh_normalizes_only_what_it_has_not_seen(server, normalized):
    hosts = [f"host{i}.example" for i in range(40)]
    feed = make_feed(server.serve("/list.txt", lines(*hosts, "HOST1.example")))
    refresh_source(feed)
    assert sorted(normalized) == sorted([*hosts, "HOST1.example"])
    normalized.clear()
    server.serve("/list.txt", lines(*hosts[1:], "HOST1.example", "new.example", "com"))
    result = refresh_source(feed)
    # The new entry, and the refused one (refusals are not remembered).
    assert normalized == ["new.example", "com"]
    assert (result.added, result.removed, result.unchanged, result.refused) == (1, 1, 39, 1)
    assert listed(feed) == {f"{h}/" for h in hosts[1:]} | {"new.example/"}


def test_a_lost_or_broken_memo_costs_time_not_correctness(server, normalized):
    feed = make_feed(server.serve("/list.txt", lines("a.example", "b.example")))
    refresh_source(feed)
    memo.path_for(feed.pk).write_bytes(b"not a memo")
    normalized.clear()
    server.serve("/list.txt", lines("b.example", "c.example"))
    result = refresh_source(feed)
    assert sorted(normalized) == ["b.example", "c.example"]
    assert (result.added, result.removed) == (1, 1)
    assert listed(feed) == {"b.example/", "c.example/"}
    memo.path_for(feed.pk).unlink()
    normalized.clear()
    server.serve("/list.txt", lines("b.example", "c.example", "d.example"))
    refresh_source(feed)
    assert sorted(normalized) == ["b.example", "c.example", "d.example"]
    assert listed(feed) == {"b.example/", "c.example/", "d.example/"}


def test_a_memo_of_another_normalizer_is_not_used(server, normalized, monkeypatch):
    feed = make_feed(server.serve("/list.txt", lines("a.example")))
    refresh_source(feed)
    monkeypatch.setattr(memo, "NORMALIZER_VERSION", memo.NORMALIZER_VERSION + 1)
    normalized.clear()
    server.serve("/list.txt", lines("a.example", "b.example"))
    refresh_source(feed)
    assert sorted(normalized) == ["a.example", "b.example"]


def test_a_memo_made_with_another_public_suffix_list_is_not_used(server, normalized, monkeypatch):
    # An update of the list can make an entry a public suffix, which normalize_rule
    # refuses: a memo of the old list would accept it unread.
    feed = make_feed(server.serve("/list.txt", lines("a.example")))
    refresh_source(feed)
    real = memo.normalizer_data()
    assert "public suffixes " in real and "idna " in real
    monkeypatch.setattr(memo, "normalizer_data", lambda: real.replace("public suffixes", "psl"))
    normalized.clear()
    server.serve("/list.txt", lines("a.example", "b.example"))
    refresh_source(feed)
    assert sorted(normalized) == ["a.example", "b.example"]


def test_the_public_suffix_part_of_a_memo_stamp_follows_the_list_file(tmp_path, monkeypatch):
    import publicsuffixlist

    monkeypatch.setattr(publicsuffixlist, "__file__", str(tmp_path / "__init__.py"))
    seen = []
    try:
        for content in ("com\n", "com\nexample.net\n"):
            memo.normalizer_data.cache_clear()
            (tmp_path / "public_suffix_list.dat").write_text(content)
            seen.append(memo.normalizer_data())
    finally:
        memo.normalizer_data.cache_clear()
    assert seen[0] != seen[1]


def test_a_refresh_removes_the_memos_of_deleted_sources(server):
    gone = make_feed(server.serve("/gone.txt", lines("g.example")), name="gone")
    refresh_source(gone)
    feed = make_feed(server.serve("/list.txt", lines("a.example")))
    folder = memo.path_for(feed.pk).parent
    (folder / "source-notanumber.memo.npz").write_bytes(b"")  # not a memo's name
    gone_memo = memo.path_for(gone.pk)
    assert gone_memo.exists()
    gone.delete()
    refresh_source(feed)
    assert memo.path_for(feed.pk).exists() and not gone_memo.exists()
    assert (folder / "source-notanumber.memo.npz").exists()


@pytest.mark.usefixtures("whole_and_in_partitions")
def test_a_remembered_rule_deleted_by_hand_is_listed_again(server, normalized):
    # The memo knows "a.example", but the source no longer lists its rule: the refresh
    # needs its expression to add it, so it normalizes it again.
    feed = make_feed(server.serve("/list.txt", lines("a.example", "b.example")))
    refresh_source(feed)
    changes.remove_rule(SpamRule.objects.get(expression="a.example/"))
    normalized.clear()
    server.serve("/list.txt", lines("a.example", "b.example", "c.example"))
    result = refresh_source(feed)
    assert sorted(normalized) == ["a.example", "c.example"]
    assert result.added == 2 and listed(feed) == {"a.example/", "b.example/", "c.example/"}


@pytest.mark.usefixtures("whole_and_in_partitions")
def test_a_held_refresh_then_accepted_lists_what_the_memo_already_knew(server, normalized):
    hosts = [f"h{i}.example" for i in range(10)]
    feed = make_feed(server.serve("/list.txt", lines(*hosts[:2])))
    refresh_source(feed)
    server.serve("/list.txt", lines(*hosts[5:]))  # removes 2 of 2: held
    assert refresh_source(feed).status == "held"
    assert listed(feed) == {"h0.example/", "h1.example/"}
    result = refresh_source(feed, accept_shrink=True)
    assert result.status == "ok" and listed(feed) == {f"{h}/" for h in hosts[5:]}


def test_a_setting_normalize_rule_reads_is_part_of_the_memo(server, settings):
    settings.URLGUARD = {**settings.URLGUARD, "ALLOW_PRIVATE_ADDRESS_RULES": True}
    feed = make_feed(server.serve("/list.txt", lines("10.1.2.3", "a.example")))
    assert refresh_source(feed).status == "ok"
    assert listed(feed) == {"10.1.2.3/", "a.example/"}
    settings.URLGUARD = {**settings.URLGUARD, "ALLOW_PRIVATE_ADDRESS_RULES": False}
    server.serve("/list.txt", lines("10.1.2.3", "a.example", "b.example"))
    result = refresh_source(feed)
    assert result.refused == 1 and listed(feed) == {"a.example/", "b.example/"}


@pytest.mark.usefixtures("whole_and_in_partitions")
def test_the_format_a_body_is_read_as_is_part_of_the_memo(server):
    body = b"||evil.example^$third-party\n||ok.example^\n"
    feed = make_feed(server.serve("/list.txt", body), format="urls")
    refresh_source(feed)
    assert listed(feed) == {"evil.example/", "ok.example/"}
    Source.objects.filter(pk=feed.pk).update(format="adblock")
    feed.refresh_from_db()
    server.serve("/list.txt", body + b"||new.example^\n")
    result = refresh_source(feed)
    # adblock refuses rules with options: the memo made as "urls" must not keep it.
    assert result.refused == 1 and listed(feed) == {"ok.example/", "new.example/"}


@pytest.mark.usefixtures("whole_and_in_partitions")
def test_a_line_with_a_refused_entry_is_counted_refused_every_time(server):
    body = b"0.0.0.0 good.example com\n0.0.0.0 other.example\n"
    feed = make_feed(server.serve("/hosts.txt", body), format="hosts")
    first = refresh_source(feed)
    server.serve("/hosts.txt", body + b"0.0.0.0 new.example\n")
    second = refresh_source(feed)
    assert first.refused == second.refused == 1
    assert listed(feed) == {"good.example/", "other.example/", "new.example/"}


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04cut short", b"not a memo"])
def test_a_damaged_memo_is_a_cache_miss(server, normalized, content):
    feed = make_feed(server.serve("/list.txt", lines("a.example")))
    refresh_source(feed)
    memo.path_for(feed.pk).write_bytes(content)
    normalized.clear()
    server.serve("/list.txt", lines("a.example", "b.example"))
    result = refresh_source(feed)
    assert result.status == "ok" and sorted(normalized) == ["a.example", "b.example"]
    assert listed(feed) == {"a.example/", "b.example/"}


_POOL = ["a.example", "A.example", "b.example", "http://b.example/", "c.example/x", "com"]
_POOL += ["d.example", "e.example/p?q=1", "f.example", "g.example", "h.example", "i.example"]


def _random_body(fmt: str, rnd) -> str:
    items = [rnd.choice(_POOL) for _ in range(rnd.randint(1, 12))]
    if fmt == "urls":
        texts = [*items, "# a comment", ""]
        rnd.shuffle(texts)
        return "".join(text + rnd.choice(["\n", "\r\n"]) for text in texts)
    if fmt == "hosts":
        pairs = [" ".join(items[i : i + 2]).replace("/", "") for i in range(0, len(items), 2)]
        return "".join(f"0.0.0.0 {pair}\n" for pair in pairs)
    rows = "".join(f"{i},http://{item.lower()},yes\n" for i, item in enumerate(items))
    return "phish_id,url,verified\n" + rows


@pytest.mark.parametrize("fmt", ["urls", "hosts", "phishtank-csv"])
@pytest.mark.usefixtures("whole_and_in_partitions")
def test_forty_random_refreshes_list_what_a_full_parse_finds(server, settings, fmt):
    # The memo's shortcuts against the plain truth: after each refresh (some after a
    # rule was deleted by hand), the source lists exactly what parsing it all gives.
    import io
    import random

    from urlguard.feeds import formats

    settings.URLGUARD = {**settings.URLGUARD, "FEED_SHRINK_THRESHOLD": 1.0}
    rnd = random.Random(fmt)
    feed = make_feed(server.serve("/feed", b"x\n"), format=fmt)
    for step in range(40):
        body = _random_body(fmt, rnd)
        server.serve("/feed", body.encode())
        if rnd.random() < 0.15 and SpamRule.objects.exists():
            changes.remove_rule(SpamRule.objects.order_by("pk").first())
        result = refresh_source(feed)
        _, parsed = formats.parse(io.StringIO(body), fmt, "spam")
        entries = list(parsed)
        expected = {e.expression for e in entries if e.expression}
        refused = sum(1 for e in entries if e.error)
        if not expected:  # nothing but refusals: never taken for an empty list
            assert result.status == "failed", (step, body)
            continue
        assert result.status == "ok", (step, result.error)
        assert listed(feed) == expected, (step, body)
        assert (result.entries, result.refused) == (len(expected), refused), (step, body)


def test_a_memo_save_removes_temp_files_of_saves_that_died(monkeypatch):
    """A save SIGKILLed while writing leaves its temp file; the next save removes it
    once it is old, never one a live save is writing."""
    import os
    import time

    import numpy as np

    path = memo.path_for(7)
    seen: set[str] = set()
    real = np.lib.format.write_array

    def watched(file, array, **options):
        seen.update(n for n in os.listdir(path.parent) if n != path.name)
        real(file, array, **options)

    numbers = np.arange(3, dtype=np.uint64)
    with monkeypatch.context() as patched:
        patched.setattr(np.lib.format, "write_array", watched)
        memo.save(7, "stamp", numbers, numbers, numbers.astype(np.int64))
    assert seen  # the names a save killed while writing leaves behind
    old = time.time() - 3600
    for name in seen:
        (path.parent / name).write_bytes(b"PK\x03\x04cut short")
        os.utime(path.parent / name, (old, old))
    live = path.parent / f".{path.name}.l1ve_now.tmp"
    live.write_bytes(b"PK")
    memo.save(7, "stamp", numbers, numbers, numbers.astype(np.int64))
    assert not any((path.parent / name).exists() for name in seen)
    assert live.exists()
    loaded = memo.load(7, "stamp")
    assert loaded is not None and len(loaded) == 3


def test_a_memo_is_written_an_array_at_a_time():
    # A merged memo of millions of entries is three arrays of 8 bytes an entry: a save
    # that made all three first would hold them all at once.
    import weakref

    import numpy as np

    made: list[weakref.ref] = []

    def part(values):
        def make():
            assert all(ref() is None for ref in made), "an earlier array is still held"
            array = np.array(values, dtype=np.int64)
            made.append(weakref.ref(array))
            return array

        return make

    memo.write(7, "stamp", part([1, 2, 3]), part([4, 5, 6]), part([7, 8, 9]), listed="x")
    loaded = memo.load(7, "stamp")
    assert loaded is not None and loaded.listed == "x"
    assert (loaded.high.tolist(), loaded.low.tolist(), loaded.keys.tolist()) == (
        [1, 2, 3],
        [4, 5, 6],
        [7, 8, 9],
    )
