"""GET/HEAD /lists/<name>: each export's lines and header (position, time, counts,
what the format could not express), the allowlist as exceptions, API keys, ETag and
Last-Modified, one render per position, and ABP differential patches that turn an
old list into the new one exactly."""

from __future__ import annotations

import base64
import re
from datetime import UTC, datetime, timedelta

import dns.zone
import pytest
from django.test import Client
from django.utils import timezone
from django.utils.http import http_date, parse_http_date

from urlguard.exports import rcs, render, views
from urlguard.exports.catalog import get_export
from urlguard.exports.projection import Position, read_allowlist
from urlguard.exports.rspamd_urls import url_pattern
from urlguard.models import AllowedHost, ChangeEvent, Source, SpamRule
from urlguard.operations import apikeys
from urlguard.writepath.changes import add_rule, remove_rule

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("prerender_inline")]


@pytest.fixture
def rules(db):
    add_rule("evil.example/", category="phishing", source="test")
    add_rule("login.bank.example/", category="malware", source="test")
    add_rule("pages.example/cheap-pills/", category="spam", source="test")
    add_rule("pages.example/bad/page.html", category="spam", source="test")
    add_rule("203.0.113.7/", category="malware", source="test")


@pytest.fixture
def allowlist(db):
    source = Source.objects.create(name="allowlist", kind="manual", is_allowlist=True)
    AllowedHost.objects.create(source=source, host="hosting.example")
    return source


@pytest.fixture
def key(db) -> str:
    return apikeys.create_api_key("resolver")[1]


@pytest.fixture
def get(key):
    client = Client()

    def get(name, *, method="get", auth=True, **headers):
        if auth:
            headers.setdefault("HTTP_AUTHORIZATION", f"Bearer {key}")
        response = getattr(client, method)(f"/lists/{name}", **headers)
        # Read whole and closed here: a test never leaves a cached file open.
        if response.streaming:
            response.body = b"".join(response.streaming_content).decode()
        else:
            response.body = response.content.decode()
        return response

    return get


def body(response) -> str:
    return response.body


def test_hosts_names_whole_host_rules_and_counts_the_rest(rules, get):
    response = get("hosts.txt")
    assert response.status_code == 200
    text = body(response)
    lines = text.splitlines()
    assert "0.0.0.0 evil.example" in lines and "0.0.0.0 login.bank.example" in lines
    assert not any("pages.example" in line or "203.0.113.7" in line for line in lines)
    head = [line for line in lines if line.startswith("#")]
    seq = ChangeEvent.objects.head()
    assert response["X-URLGuard-Position"] == str(seq)
    assert f"# Position: {seq} (urlguard change log)" in head
    assert "# Rules: 5 listed, 2 in this file, 3 not expressible in this format" in head
    assert "# Omitted: 2 path and page rules: this format names hosts only" in head
    assert "# Omitted: 1 rules on IP addresses: this format names hosts by name" in head
    assert any(line.startswith("# Time: ") for line in head)


def test_domains_and_rspamd_maps(rules, get):
    assert [x for x in body(get("domains.txt")).splitlines() if not x.startswith("#")] == [
        "evil.example",
        "login.bank.example",
    ]
    domains = body(get("rspamd-domains.map")).splitlines()
    assert "evil.example URLGUARD_PHISHING:10" in domains
    assert "203.0.113.7 URLGUARD_MALWARE:10" in domains
    urls = [x for x in body(get("rspamd-urls.map")).splitlines() if not x.startswith("#")]
    assert len(urls) == 2 and all(x.endswith(" URLGUARD_SPAM:5") for x in urls)


@pytest.mark.parametrize(
    ("expression", "url", "matches"),
    [
        ("pages.example/cheap-pills/", "http://pages.example/cheap-pills/x.html", True),
        ("pages.example/cheap-pills/", "https://a.pages.example:8443/cheap-pills/", True),
        ("pages.example/cheap-pills/", "http://notpages.example/cheap-pills/", False),
        ("pages.example/cheap-pills/", "http://pages.example/cheap-pills", False),
        ("pages.example/p.html", "http://pages.example/p.html?x=1", True),
        ("pages.example/p.html", "http://pages.example/p.htmlx", False),
        ("pages.example/p.html?id=1", "http://pages.example/p.html?id=1", True),
        ("pages.example/p.html?id=1", "http://pages.example/p.html?id=12", False),
    ],
)
def test_rspamd_url_regexp(expression, url, matches):
    pattern = url_pattern(expression).replace(r"\/", "/")
    assert bool(re.search(pattern, url, re.IGNORECASE)) is matches


def test_rpz_zone_is_a_valid_zone_with_the_position_as_serial(rules, allowlist, get):
    response = get("rpz.zone")
    zone = dns.zone.from_text(body(response), origin="rpz.urlguard.", relativize=False)
    assert zone.get_soa().serial == int(response["X-URLGuard-Position"])
    names = {str(name): rdataset for name, rdataset in zone.iterate_rdatasets("CNAME")}
    assert str(names["evil.example.rpz.urlguard."][0].target) == "."
    assert str(names["*.evil.example.rpz.urlguard."][0].target) == "."
    assert str(names["hosting.example.rpz.urlguard."][0].target) == "rpz-passthru."
    assert not any("pages.example" in n for n in names)


def test_an_allowlisted_host_the_list_blocks_whole_gets_no_exception(allowlist, get):
    add_rule("hosting.example/", category="spam", source="test")
    text = body(get("abp.txt"))
    assert "@@||hosting.example^" not in text and "||hosting.example^" in text


def test_abp_lines(rules, allowlist, get):
    add_rule("hosting.example/malware/", category="malware", source="test")
    lines = body(get("abp.txt")).splitlines()
    assert lines[0] == "[Adblock Plus 2.0]"
    assert "@@||hosting.example^" in lines
    assert "||evil.example^" in lines
    assert "||pages.example/cheap-pills/" in lines
    assert "||pages.example/cheap-pills/$document" in lines
    assert "||pages.example/bad/page.html^$document" in lines
    assert "||hosting.example/malware/$document,important" in lines
    assert "||hosting.example/malware/$important" in lines
    assert any(re.fullmatch(r"! Diff-Path: abp-\d+-[0-9a-f]{8}\.patch", x) for x in lines)


def test_allowlist_is_read_through_one_function(allowlist):
    hosts, modified = read_allowlist()
    assert hosts == ("hosting.example",) and modified is not None
    allowlist.enabled = False
    allowlist.save()
    assert read_allowlist() == ((), None)


def test_an_api_key_is_needed_unless_open(rules, get, key, settings):
    refused = get("hosts.txt", auth=False)
    assert refused.status_code == 401 and "Bearer" in refused["WWW-Authenticate"]
    assert get("hosts.txt", HTTP_AUTHORIZATION="Bearer ugk_wrong").status_code == 401
    basic = base64.b64encode(f"pihole:{key}".encode()).decode()
    assert get("hosts.txt", HTTP_AUTHORIZATION=f"Basic {basic}").status_code == 200
    assert get("hosts.txt", HTTP_AUTHORIZATION="Basic !!!").status_code == 401
    settings.URLGUARD = {**settings.URLGUARD, "EXPORTS_OPEN": True}
    response = get("hosts.txt", auth=False)
    assert response.status_code == 200 and response["Cache-Control"] == "public, max-age=300"


def test_unknown_list_and_methods(get):
    assert get("nope.txt").status_code == 404
    assert get("hosts.txt", method="post").status_code == 405


def test_conditional_get_head_and_max_age(rules, get, settings):
    settings.URLGUARD = {**settings.URLGUARD, "EXPORT_MAX_AGE": 60}
    # Settled: the second of the last change is long over.
    ChangeEvent.objects.update(created=timezone.now() - timedelta(minutes=1))
    first = get("domains.txt")
    etag, modified = first["ETag"], first["Last-Modified"]
    assert first["Cache-Control"] == "private, max-age=60"
    assert get("domains.txt", HTTP_IF_NONE_MATCH=etag).status_code == 304
    # Pi-hole's gravity: If-Modified-Since only, from its cached copy's time.
    not_modified = get("domains.txt", HTTP_IF_MODIFIED_SINCE=modified)
    assert not_modified.status_code == 304 and not_modified["ETag"] == etag
    head = get("domains.txt", method="head")
    assert head.status_code == 200 and head.content == b""
    assert head["ETag"] == etag and head["Last-Modified"] == modified
    assert int(head["Content-Length"]) == len(body(first).encode())
    add_rule("new.example/", category="spam", source="test")
    changed = get("domains.txt", HTTP_IF_MODIFIED_SINCE=http_date(0), HTTP_IF_NONE_MATCH=etag)
    assert changed.status_code == 200 and changed["ETag"] != etag
    assert "new.example" in body(changed)


def test_one_render_per_position(rules, get, monkeypatch):
    calls = []
    real = render.render
    monkeypatch.setattr(render, "render", lambda e, d: calls.append(e.name) or real(e, d))
    for _ in range(5):
        assert get("hosts.txt").status_code == 200
    assert calls.count("hosts.txt") == 1
    add_rule("new.example/", category="spam", source="test")
    assert "new.example" in get("hosts.txt").body
    get("hosts.txt")
    assert calls.count("hosts.txt") == 2


def test_old_renders_are_pruned(rules, get, settings):
    settings.URLGUARD = {**settings.URLGUARD, "EXPORT_KEEP_VERSIONS": 2}
    for n in range(4):
        add_rule(f"n{n}.example/", category="spam", source="test")
        get("hosts.txt")
    assert len(render.kept_keys(render.export_dir("hosts.txt"))) == 2


def test_abp_list_updated_by_its_patches_equals_the_fresh_list(rules, allowlist, get):
    old = body(get("abp.txt")).splitlines()
    diff_path = next(x for x in old if x.startswith("! Diff-Path: ")).split(": ", 1)[1]
    assert get(diff_path).body == ""  # nothing newer yet
    add_rule("fresh.example/", category="spam", source="test")
    add_rule("hosting.example/x/", category="spam", source="test")
    remove_rule(SpamRule.objects.get(expression="evil.example/"))
    patch = body(get(diff_path))
    assert patch.startswith(("d", "a"))
    updated = rcs.apply(old, patch)
    assert updated == body(get("abp.txt")).splitlines()
    # and again from there, the next version's own Diff-Path
    second = next(x for x in updated if x.startswith("! Diff-Path: ")).split(": ", 1)[1]
    remove_rule(SpamRule.objects.get(expression="pages.example/cheap-pills/"))
    assert rcs.apply(updated, body(get(second))) == body(get("abp.txt")).splitlines()


def test_a_patch_from_a_version_no_longer_kept_is_404(get):
    assert get("abp-7-0123abcd.patch").status_code == 404


def test_a_render_the_log_moved_under_is_done_again(rules, get, monkeypatch):
    """Without a snapshot (SQLite), a change committed mid-render makes the render
    belong to no position: it is thrown away and done again at the new one."""
    from urlguard.exports import projection

    real = projection.Snapshot.consistent
    moved = []

    def consistent(self):
        if not moved:
            moved.append(add_rule("mid-render.example/", category="spam", source="test"))
            return real(self)
        return real(self)

    monkeypatch.setattr(projection.Snapshot, "consistent", consistent)
    response = get("domains.txt")
    assert "mid-render.example" in response.body
    assert response["X-URLGuard-Position"] == str(ChangeEvent.objects.head())


def test_a_list_that_never_holds_still_is_a_503_with_retry_after(rules, get, monkeypatch):
    from urlguard.exports import projection

    monkeypatch.setattr(render, "COLD_WAIT", 0.1)
    monkeypatch.setattr(projection.Snapshot, "consistent", lambda self: False)
    response = get("domains.txt")
    assert response.status_code == 503 and response["Retry-After"] == "30"
    assert not list(render.export_dir("domains.txt").glob("*.txt"))


def test_a_poll_before_the_prerender_is_done_gets_the_newest_kept_render_at_once(
    rules, get, monkeypatch
):
    """No poll renders while a render is kept: until the node's pre-render of the new
    position is done, the last render is served at once, with its own position in
    its headers, and the pre-render is asked for (again) without waiting for it."""
    import fcntl
    import os

    from urlguard.exports import prerender

    before = get("domains.txt")
    add_rule("new.example/", category="spam", source="test")
    asked: list[None] = []
    monkeypatch.setattr(prerender, "request", lambda: asked.append(None))
    monkeypatch.setattr(render, "render", lambda *a: pytest.fail("rendered in a request"))
    lock = os.open(render.export_dir("domains.txt") / ".lock", os.O_RDWR)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the pre-render is busy with it
        during = get("domains.txt")
    finally:
        os.close(lock)
    assert asked
    assert during.status_code == 200 and during["ETag"] == before["ETag"]
    assert during["X-URLGuard-Position"] == before["X-URLGuard-Position"]
    assert during["Last-Modified"] == before["Last-Modified"]
    assert "new.example" not in during.body
    monkeypatch.undo()
    prerender.render_all()
    assert "new.example" in get("domains.txt").body


def test_a_render_killed_midway_leaves_no_file_and_is_done_by_the_next_round(rules, get):
    from urlguard.exports import prerender

    get("hosts.txt")
    add_rule("new.example/", category="spam", source="test")

    class Killed(BaseException):
        pass

    def lines(expression, category):
        raise Killed

    export = get_export("hosts.txt")
    export.rule_lines = lines
    directory = render.export_dir("hosts.txt")
    kept = sorted(p.name for p in directory.iterdir())
    with pytest.raises(Killed):
        render.render(export, directory)
    # Only a temp file at most: no render and no sidecar of the new position.
    assert sorted(p.name for p in directory.iterdir() if not p.name.startswith(".")) == [
        n for n in kept if not n.startswith(".")
    ]
    prerender.render_all()
    assert "new.example" in get("hosts.txt").body


def test_a_render_pruned_before_it_is_opened_is_found_again(rules, get, monkeypatch):
    from urlguard.exports import views

    real = views.rendered
    calls = []

    def pruned_once(export, position, **kwargs):
        result = real(export, position, **kwargs)
        calls.append(result)
        if len(calls) == 1:  # another process pruned it meanwhile
            return render.Rendered(result.path.with_name("pruned.txt"), result.position)
        return result

    monkeypatch.setattr(views, "rendered", pruned_once)
    response = get("hosts.txt")
    assert response.status_code == 200 and "evil.example" in response.body
    assert len(calls) == 2


def test_temp_files_of_renders_that_died_are_removed_and_live_ones_kept(rules, get, monkeypatch):
    """A render SIGKILLed while writing (an RPZ render is tens of MB) leaves its temp
    file; the next render's prune removes it once it is old, never a live one."""
    import os
    import time

    directory = render.export_dir("hosts.txt")
    seen: set[str] = set()
    real = render.write_aside

    def watched(target, chunks):
        def spying():
            for chunk in chunks:
                seen.update(n for n in os.listdir(target.parent) if n.endswith(".tmp"))
                yield chunk

        real(target, spying())

    with monkeypatch.context() as patched:
        patched.setattr(render, "write_aside", watched)
        assert get("hosts.txt").status_code == 200
    assert seen  # the names a render killed while writing leaves behind
    old = time.time() - 3600
    for name in seen:
        (directory / name).write_bytes(b"x" * 1000)
        os.utime(directory / name, (old, old))
    live = directory / ".99-0123abcd.txt.l1ve_now.tmp"  # another process writing it now
    live.write_bytes(b"x")
    add_rule("new.example/", category="spam", source="test")
    assert get("hosts.txt").status_code == 200
    assert not any((directory / name).exists() for name in seen)
    assert live.exists()


def test_wrong_keys_on_lists_are_limited_per_address_like_the_api(rules, get, key, settings):
    """/lists/ is no unthrottled place to guess keys: missing and wrong keys count per
    client address (IPv6: its /64) with the check API's, then 429, even with a right key."""
    settings.URLGUARD = {**settings.URLGUARD, "API_FAILED_KEY_RATE": "3/m"}
    here = {"REMOTE_ADDR": "2001:db8:1:2::10"}
    for _ in range(3):
        assert get("hosts.txt", HTTP_AUTHORIZATION="Bearer ugk_wrong", **here).status_code == 401
    refused = get("hosts.txt", HTTP_AUTHORIZATION="Bearer ugk_wrong", **here)
    assert refused.status_code == 429 and 1 <= int(refused["Retry-After"]) <= 60
    assert refused.body.startswith(
        "rate limit of 3/m requests with a wrong API key reached for this address"
    )
    assert refused["Cache-Control"] == "no-store"
    assert get("hosts.txt", **here).status_code == 429  # the right key too: no oracle
    basic = base64.b64encode(f"pihole:{key}".encode()).decode()
    neighbour = {"REMOTE_ADDR": "2001:db8:1:2:ffff::1"}
    assert get("hosts.txt", HTTP_AUTHORIZATION=f"Basic {basic}", **neighbour).status_code == 429
    assert get("hosts.txt", REMOTE_ADDR="2001:db8:1:3::10").status_code == 200
    assert get("hosts.txt", REMOTE_ADDR="198.51.100.7").status_code == 200
    # One count for both places: the check API refuses that address as well.
    api = Client().post(
        "/api/check",
        {"urls": []},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
        **here,
    )
    assert api.status_code == 429


def test_right_keys_on_lists_do_not_count_as_wrong_ones(rules, get, settings):
    settings.URLGUARD = {**settings.URLGUARD, "API_FAILED_KEY_RATE": "1/m"}
    for _ in range(3):
        assert get("hosts.txt").status_code == 200
    assert get("hosts.txt", auth=False).status_code == 401
    assert get("hosts.txt").status_code == 429


def at(second: int, fraction: float) -> datetime:
    return datetime.fromtimestamp(second + fraction, tz=UTC)


@pytest.mark.parametrize("fraction", [0.0, 0.2, 0.999])
def test_a_change_in_the_second_a_consumer_fetched_is_never_answered_304(rules, get, fraction):
    second = int(timezone.now().timestamp()) - 3600
    # The consumer fetched at second + 0.0..; the change came later in that second.
    ChangeEvent.objects.update(created=at(second, fraction))
    pihole = get("hosts.txt", HTTP_IF_MODIFIED_SINCE=http_date(second))
    assert pihole.status_code == 200 and "evil.example" in body(pihole)
    assert get("hosts.txt", HTTP_IF_MODIFIED_SINCE=http_date(second - 1)).status_code == 200
    # A fetch in any later second had the change.
    later = get("hosts.txt", HTTP_IF_MODIFIED_SINCE=http_date(second + 1))
    assert later.status_code == 304


def test_an_echoed_last_modified_is_304_only_once_no_change_can_share_its_second(rules, get):
    now = timezone.now().timestamp()
    second = int(now)
    ChangeEvent.objects.update(created=at(second, 0.1))
    fresh = get("hosts.txt")
    # The second is not over: a change later in it must not be answered 304 to an
    # echo of this Last-Modified, so it names the second itself.
    assert parse_http_date(fresh["Last-Modified"]) == second
    assert get("hosts.txt", HTTP_IF_MODIFIED_SINCE=fresh["Last-Modified"]).status_code == 200
    ChangeEvent.objects.update(created=at(second - 60, 0.1))
    settled = get("hosts.txt")
    assert parse_http_date(settled["Last-Modified"]) == second - 59
    assert get("hosts.txt", HTTP_IF_MODIFIED_SINCE=settled["Last-Modified"]).status_code == 304


def test_last_modified_names_the_second_until_it_is_settled():
    position = Position(seq=1, time=at(1_000, 0.5))
    assert views.last_modified(position, now=1_000.6) == 1_000
    assert views.last_modified(position, now=1_001 + views.SETTLE_SECONDS - 0.01) == 1_000
    assert views.last_modified(position, now=1_001 + views.SETTLE_SECONDS) == 1_001
    exact = Position(seq=1, time=at(1_000, 0.0))
    assert views.last_modified(exact, now=2_000) == 1_001


def test_allowlisting_moves_the_position_and_the_abp_patch_carries_the_exception(rules, get):
    from urlguard.writepath.allowlist import allow_host, unallow_host

    before = get("abp.txt")
    old = before.body.splitlines()
    diff_path = next(x for x in old if x.startswith("! Diff-Path: ")).split(": ", 1)[1]
    allow_host("partner.example")
    after = get("abp.txt")
    assert int(after["X-URLGuard-Position"]) == int(before["X-URLGuard-Position"]) + 1
    assert after["ETag"] != before["ETag"]
    patch = get(diff_path).body
    assert "@@||partner.example^" in patch
    assert rcs.apply(old, patch) == after.body.splitlines()
    unallow_host("partner.example")
    assert "@@||partner.example^" not in get("abp.txt").body
