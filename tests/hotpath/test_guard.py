"""Guard.check / check_many: what each rule level blocks (and does not), the
one-query confirmation, the clean cache, and the ON_FILTER_ERROR policies."""

from __future__ import annotations

import io
import logging
import re

import pytest
from django.core.management import CommandError, call_command

from tests.support.webfakes import BrokenFilter, SetFilter
from urlguard.hotpath import guard as guard_module
from urlguard.hotpath.canonical import expressions
from urlguard.hotpath.cleancache import LRUCleanCache
from urlguard.hotpath.guard import Guard, InvalidURL, get_guard
from urlguard.writepath.changes import add_rule

pytestmark = pytest.mark.django_db


def listed(*rules: tuple[str, str], filt: SetFilter | None = None):
    """Add rules through the one write path and mirror them into the fake filter."""
    made = []
    for text, category in rules:
        rule = add_rule(text, category=category, source="test")
        if filt is not None:
            filt.add(rule.expression)
        made.append(rule)
    return made


@pytest.fixture(autouse=True)
def _no_leaked_guard():
    guard_module.reset_guard()
    guard_module.log_limited._last.clear()
    yield
    guard_module.reset_guard()


@pytest.mark.parametrize(
    ("rule", "blocked", "allowed"),
    [
        (  # a domain rule covers the domain and every subdomain
            "evil.example/",
            [
                "http://evil.example/",
                "https://a.b.evil.example/x/y.html?q=1",
                "http://EVIL.example./login",
            ],
            ["http://notevil.example/", "http://evil.example.org/", "http://example/evil.example/"],
        ),
        (  # a subdomain rule covers that subdomain (and below) only
            "login.bank.example/",
            ["https://login.bank.example/", "https://x.login.bank.example/verify?id=3"],
            [
                "https://bank.example/",
                "https://www.bank.example/login.bank.example/",
                "https://login2.bank.example/",
            ],
        ),
        (  # a path rule covers that directory and below
            "site.example/free/",
            [
                "http://site.example/free/",
                "http://site.example/free/gift.html?x=1",
                "http://www.site.example/free/a/b",
            ],
            [
                "http://site.example/",
                "http://site.example/freedom/",
                "http://site.example/free",
                "http://site.example/other/free/",
            ],
        ),
        (  # a page rule covers that page, with or without a query
            "site.example/a/page.html",
            ["http://site.example/a/page.html", "http://site.example/a/page.html?utm=1#top"],
            [
                "http://site.example/a/",
                "http://site.example/a/page.htm",
                "http://site.example/a/page.html/x",
            ],
        ),
    ],
)
def test_each_rule_level_blocks_what_it_should_and_nothing_else(rule, blocked, allowed):
    filt = SetFilter()
    (made,) = listed((rule, "phishing"), filt=filt)
    guard = Guard(lambda: filt)
    for url in blocked:
        verdict = guard.check(url)
        assert verdict.blocked, url
        assert verdict.rule == made and verdict.category == "phishing"
        assert made.expression in verdict.reason
    for url in allowed:
        assert not guard.check(url).blocked, url


def test_clean_urls_never_touch_the_database(django_assert_num_queries):
    filt = SetFilter()
    listed(("evil.example/", "spam"), filt=filt)
    guard = Guard(lambda: filt)
    with django_assert_num_queries(0):
        for url in [
            "https://www.python.org/",
            "http://a.b.c.d.example.com/1/2/3/4?x=y",
            "https://evil.example.com/",
        ]:
            verdict = guard.check(url)
            assert not verdict.blocked and verdict.maybe == () and verdict.reason == ""


def test_a_hit_is_confirmed_with_exactly_one_query(django_assert_num_queries):
    filt = SetFilter()
    listed(
        ("evil.example/", "spam"),
        ("x.evil.example/", "malware"),
        ("evil.example/a/", "phishing"),
        filt=filt,
    )
    guard = Guard(lambda: filt)
    with django_assert_num_queries(1):
        verdict = guard.check("http://x.evil.example/a/b")
    # The most specific rule wins: the longest host, then the longest path.
    assert verdict.rule.expression == "x.evil.example/"
    assert set(verdict.maybe) == {"evil.example/", "x.evil.example/", "evil.example/a/"}
    assert guard.check("http://y.evil.example/a/b").rule.expression == "evil.example/a/"
    assert guard.check("http://y.evil.example/b").rule.expression == "evil.example/"


def test_filter_false_positive_is_never_a_block_and_is_cached(django_assert_num_queries):
    filt = SetFilter(everything=True)  # says "maybe" to every expression
    listed(("evil.example/", "spam"))  # in the table only: the fake says maybe anyway
    guard = Guard(lambda: filt)
    url = "https://www.python.org/downloads/"
    with django_assert_num_queries(1):
        first = guard.check(url)
    assert not first.blocked and first.reason == "filter false positive"
    assert first.maybe == tuple(expressions(url))
    with django_assert_num_queries(0):  # a popular false positive stops costing a query
        again = guard.check(url)
    assert not again.blocked and "cached" in again.reason
    assert guard.check("http://evil.example/").blocked


def test_clean_cache_is_cleared_when_the_filter_changes(django_assert_num_queries):
    filt = SetFilter(everything=True)
    guard = Guard(lambda: filt)
    url = "http://victim.example/page"
    assert not guard.check(url).blocked  # cached as clean
    (rule,) = listed(("victim.example/", "malware"), filt=filt)  # bumps applied_seq
    with django_assert_num_queries(1):
        verdict = guard.check(url)
    assert verdict.blocked and verdict.rule == rule

    filt2 = SetFilter(everything=True)
    guard2 = Guard(lambda: filt2)
    assert not guard2.check("http://other.example/").blocked
    filt2.generation += 1  # a rebuild replaced the file
    with django_assert_num_queries(1):
        guard2.check("http://other.example/")


def test_clean_cache_is_bounded():
    cache = LRUCleanCache(maxsize=2)
    for key in "abc":
        cache.add(key)
    assert "a" not in cache and "b" in cache and "c" in cache
    cache.clear()
    assert "b" not in cache


@pytest.mark.parametrize(
    "url",
    [
        "",
        "   ",
        "javascript:alert(1)",
        "mailto:a@b.example",
        "http://",
        "data:text/html,hi",
        "/relative/path",
    ],
)
def test_unusable_urls_raise_invalid_url(url):
    with pytest.raises(InvalidURL, match="not a usable http"):
        Guard(SetFilter).check(url)


def test_unknown_policy_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="database, open, closed"):
        Guard(SetFilter, on_filter_error="maybe")


@pytest.mark.parametrize("broken", [None, BrokenFilter()], ids=["unopenable", "read-error"])
def test_database_policy_answers_from_the_table(broken, django_assert_num_queries, caplog):
    listed(("evil.example/", "phishing"))
    guard = Guard(lambda: broken, on_filter_error="database")
    with django_assert_num_queries(1):
        bad = guard.check("http://www.evil.example/x")
    assert bad.blocked and bad.degraded and bad.rule.expression == "evil.example/"
    assert "spam table only" in bad.reason
    good = guard.check("http://good.example/")
    assert not good.blocked and good.degraded
    errors = [r for r in caplog.records if r.name == "urlguard.hotpath.guard"]
    assert len(errors) == 1 and errors[0].levelno == logging.ERROR  # rate-limited: one line
    assert "ON_FILTER_ERROR='database'" in errors[0].getMessage()


@pytest.mark.parametrize(("policy", "blocked"), [("open", False), ("closed", True)])
def test_open_and_closed_policies(policy, blocked, django_assert_num_queries, caplog):
    listed(("evil.example/", "phishing"))
    guard = Guard(lambda: None, on_filter_error=policy)
    with django_assert_num_queries(0):
        for url in ["http://evil.example/", "http://good.example/"]:
            verdict = guard.check(url)
            assert verdict.blocked is blocked and verdict.degraded and verdict.rule is None
            assert f"failing {policy}" in verdict.reason
    assert any("could not be opened" in r.getMessage() for r in caplog.records)


def test_check_many_batches_one_probe_and_one_query(django_assert_num_queries):
    filt = SetFilter()
    listed(("evil.example/", "spam"), ("site.example/free/", "phishing"), filt=filt)
    filt.keys.add("fp.example/")  # a key in the filter with no table row
    guard = Guard(lambda: filt)
    urls = [
        "http://a.evil.example/",
        "https://www.python.org/",
        "mailto:x@y.example",
        "http://site.example/free/x",
        "http://fp.example/",
        "http://site.example/",
    ]
    with django_assert_num_queries(1):
        verdicts = guard.check_many(urls)
    assert filt.calls == 1
    assert [v.url for v in verdicts] == urls
    assert [v.blocked for v in verdicts] == [True, False, False, True, False, False]
    assert verdicts[0].rule.expression == "evil.example/"
    assert verdicts[3].category == "phishing"
    assert verdicts[2].error and not verdicts[2].canonical
    assert verdicts[4].reason == "filter false positive" and verdicts[4].maybe == ("fp.example/",)
    # The same answers as one check at a time.
    for url, verdict in zip(urls, verdicts, strict=True):
        if not verdict.error:
            single = guard.check(url)
            assert (single.blocked, single.rule) == (verdict.blocked, verdict.rule)


def test_check_many_chunks_its_queries(monkeypatch, django_assert_num_queries):
    monkeypatch.setattr(guard_module, "QUERY_CHUNK", 3)
    guard = Guard(lambda: SetFilter(everything=True))
    urls = [f"http://h{i}.example/p" for i in range(4)]  # 2 expressions each: 8 hits
    with django_assert_num_queries(3):
        assert not any(v.blocked for v in guard.check_many(urls))


def test_check_many_gives_what_check_gives_for_each_url():
    filt = SetFilter()
    listed(("evil.example/", "spam"), ("site.example/free/", "phishing"), filt=filt)
    filt.keys.add("fp.example/a/")  # a key in the filter with no table row
    urls = [
        "https://www.shop.example/c/s/item.html?ref=1",
        "http://a.evil.example/x",
        "http://site.example/free/gift.html?x=1",
        "http://fp.example/a/b",
        "http://a.evil.example/x",  # twice in one batch
        "http://1.2.3.4/free/",
        "http://b\u00fccher.example/x/../y",
        "HTTP://EVIL.example./%41",
        "javascript:alert(1)",
        "",
        "https://www.shop.example/c/s/item.html?ref=1",
    ]
    batch = Guard(lambda: filt).check_many(urls)
    for url, verdict in zip(urls, batch, strict=True):
        try:
            # A new guard each time: the clean cache would say "(cached)".
            single = Guard(lambda: filt).check(url)
        except InvalidURL as exc:
            assert verdict.error and str(exc) == verdict.error and not verdict.blocked
        else:
            assert verdict == single, url
    assert [v.blocked for v in batch][:4] == [False, True, True, False]
    assert batch[3].maybe == ("fp.example/a/",)


def test_a_clean_verdict_of_a_batch_is_a_verdict_like_any_other():
    from urlguard.hotpath.guard import Verdict, _clean

    made = _clean("http://A.example/", "http://a.example/")
    built = Verdict(url="http://A.example/", canonical="http://a.example/", blocked=False)
    assert made == built and hash(made) == hash(built) and type(made) is Verdict
    with pytest.raises(AttributeError):
        made.blocked = True


def test_check_judges_the_reading_it_is_given(monkeypatch):
    from urlguard.hotpath import canonical

    filt = SetFilter()
    listed(("evil.example/", "spam"), filt=filt)
    guard = Guard(lambda: filt)
    target = canonical.browser_target("http://EVIL.example/x/../y")
    reads = []
    original_read = canonical._read
    monkeypatch.setattr(canonical, "_read", lambda url: reads.append(url) or original_read(url))
    verdict = guard.check(target.url, target.canonical)
    assert verdict.blocked and verdict.canonical == "http://evil.example/y"
    assert reads == []  # read once, by browser_target, not again here
    # Without a reading the guard makes its own, from the URL alone.
    canonical._cache.clear()
    assert guard.check("http://evil.example:8080/").blocked
    assert reads == ["http://evil.example:8080/"]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("database", [True, False]), ("open", [False, False]), ("closed", [True, True])],
)
def test_check_many_degraded(policy, expected):
    listed(("evil.example/", "spam"))
    verdicts = Guard(lambda: None, on_filter_error=policy).check_many(
        ["http://evil.example/", "http://good.example/"]
    )
    assert [v.blocked for v in verdicts] == expected
    assert all(v.degraded for v in verdicts)


@pytest.mark.parametrize("policy", ["database", "open", "closed"])
@pytest.mark.parametrize("filt", [None, BrokenFilter()], ids=["missing", "broken"])
def test_check_and_check_many_give_the_same_degraded_verdicts(policy, filt):
    listed(("evil.example/", "spam"))
    guard = Guard(lambda: filt, on_filter_error=policy)
    urls = ["http://evil.example/", "http://good.example/"]
    assert guard.check_many(urls) == [guard.check(url) for url in urls]


def test_get_guard_is_process_wide_and_follows_settings(settings):
    assert get_guard() is get_guard()
    settings.URLGUARD = {**settings.URLGUARD, "ON_FILTER_ERROR": "closed"}
    assert get_guard().on_filter_error == "closed"


def run_check_url(url: str) -> str:
    out = io.StringIO()
    call_command("check_url", url, stdout=out, no_color=True)
    return out.getvalue()


def test_check_url_command_explains_each_step(build_filter):
    listed(("evil.example/", "phishing"))
    build_filter()
    out = run_check_url("http://LOGIN.evil.example/a?b=1")
    assert "canonical  http://login.evil.example/a?b=1" in out
    assert re.search(r"evil\.example/\s+maybe\s+listed: phishing", out)
    assert re.search(r"login\.evil\.example/a\?b=1\s+no\s+-", out)
    assert "verdict    BLOCKED: matches the rule evil.example/" in out
    assert "verdict    allowed" in run_check_url("https://www.python.org/")


def test_check_url_command_spots_a_filter_behind_the_table(build_filter):
    build_filter()
    listed(("late.example/", "spam"))  # committed, not yet applied to this node's file
    out = run_check_url("http://late.example/")
    assert "behind the change log" in out and "sync_filter" in out


def test_check_url_command_refuses_a_non_web_url():
    with pytest.raises(CommandError, match="not a usable http"):
        run_check_url("javascript:alert(1)")


def test_check_url_command_explains_a_filter_that_fails_to_read(use_guard):
    listed(("evil.example/", "phishing"))
    use_guard(Guard(BrokenFilter))
    out = run_check_url("http://evil.example/")
    assert "filter     unreadable: simulated: the mapped file went away" in out
    assert re.search(r"evil\.example/\s+\?\s+listed: phishing", out)
    assert "verdict    BLOCKED" in out and "spam table only" in out
