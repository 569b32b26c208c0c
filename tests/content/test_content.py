"""urlguard.content: every link a reader could follow in plain text (any top-level domain
of the public suffix list, `www.` and bare hosts with paths, any letter case, IDN,
inside parentheses, before punctuation), checked in one batch through the guard;
text over CONTENT_MAX_CHARS refused; hostile text scanned in linear time."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import pytest
from linkify_it import LinkifyIt

from tests.support.spellings import BROWSER_MAPPED_HOSTS
from urlguard.content import TextTooLong, check_text, find_links, listed_links
from urlguard.content.links import prefix_tree_pattern, top_level_domains
from urlguard.hotpath.canonical import browser_url
from urlguard.hotpath.guard import Guard
from urlguard.models import HitEvent
from urlguard.runtime import stats
from urlguard.writepath.changes import add_rule


@pytest.mark.parametrize(
    ("text", "links"),
    [
        ("see https://example.com/a?b=1 now", ["https://example.com/a?b=1"]),
        ("HTTP://EXAMPLE.COM/A and hTtPs://MiXeD.example.org/", None),
        ("go to www.example.com today", ["http://www.example.com"]),
        ("cheap pills at example.top/promo/ !", ["http://example.top/promo/"]),
        ("win.xyz/a and prize.click/b and deal.shop/c", None),
        ("WINNER.XYZ/A", ["http://WINNER.XYZ/A"]),
        ("(see evil.xyz/a)", ["http://evil.xyz/a"]),
        (
            "read https://en.wikipedia.org/wiki/Foo_(bar).",
            ["https://en.wikipedia.org/wiki/Foo_(bar)"],
        ),
        ("it is at https://example.com/x, https://example.com/y; and https://example.com/z.", None),
        ("IDN: bücher.de/x and пример.рф/путь", ["http://bücher.de/x", "http://пример.рф/путь"]),
        ("punycode xn--80ak6aa92e.com/x", ["http://xn--80ak6aa92e.com/x"]),
        ("an address 203.0.113.7/x", ["http://203.0.113.7/x"]),
        ("scheme-relative //evil.example/x", ["https://evil.example/x"]),
        ("line\nhttps://a.example/1\n\thttps://b.example/2", None),
        ("mail me at a@b.com, mailto:c@d.com, ftp://files.example/x", []),
        ("Plain prose. E.g. this, i.e. that... Nothing to follow.", []),
        ("", []),
        (
            '<a href="http://evil.top/x">x</a> [md](https://md.top/y) <b>www.bold.top</b>',
            ["http://evil.top/x", "https://md.top/y", "http://www.bold.top"],
        ),
    ],
)
def test_find_links(text, links):
    found = find_links(text)
    if links is None:  # every word with a dot is the link, as written, with a scheme
        links = [w.strip(",;.") for w in text.split() if "." in w and "/" in w]
        links = [link if "://" in link else f"http://{link}" for link in links]
    assert found == links


@pytest.mark.parametrize("text", BROWSER_MAPPED_HOSTS, ids=ascii)
def test_a_host_spelled_with_what_the_browser_maps_away_is_found(text):
    [link] = find_links(text)
    assert urlsplit(browser_url(link)).hostname in ("evil.top", "www.evil.top", "evil.com"), link


def test_an_escaped_host_in_html_or_markdown_source_is_found_as_the_browser_reads_it():
    # Chromium follows each href to evil.top; the scan found "http://65vil.top/x".
    for text in ['<a href="http://%65vil.top/x">x</a>', "[x](http://%65%76il.top/x)"]:
        assert find_links(text) == ["http://evil.top/x"]
    # Escapes of what no host holds stay as written.
    assert find_links("http://a.example/%20%2F%3F%25/x") == ["http://a.example/%20%2F%3F%25/x"]


def test_a_host_written_with_character_references_in_html_or_markdown_is_found():
    # HTML and CommonMark decode them before the URL is read: Chromium goes to
    # evil.top; the scan found "http://vil.top/x" and "http://evil".
    for text in ['<a href="http://&#101;vil.top/x">x</a>', "[x](http://evil&#46;top/x)"]:
        assert find_links(text) == ["http://evil.top/x"]
    # A name without its ";" is no reference in an attribute: the query stays as written.
    assert find_links("http://a.example/?a=1&para=2&amp;b") == ["http://a.example/?a=1&para=2&b"]


@pytest.mark.parametrize(
    "text", ["[x](http:evil.top/x)", '<a href="https:/evil.top/x">x</a>', "HTTP:\\evil.top/x"]
)
def test_a_web_scheme_without_its_slashes_is_a_link(text):
    # On a page of the other scheme Chromium follows each to evil.top.
    assert [urlsplit(link).hostname for link in find_links(text)] == ["evil.top"]


def test_every_top_level_domain_of_the_public_suffix_list_counts():
    tlds = set(top_level_domains())
    assert {"top", "xyz", "click", "com", "uk", "рф", "xn--p1ai"} <= tlds and len(tlds) > 1400
    # The linkifier's own short list misses the ones spammers buy.
    assert LinkifyIt().match("example.top/promo/") is None
    assert find_links("example.top/promo/") == ["http://example.top/promo/"]
    assert find_links("example.notatld/promo/") == []


def test_the_prefix_tree_matches_exactly_its_words():
    import re

    words = ["co", "com", "coop", "c", "xyz", "xn--p1ai"]
    pattern = re.compile(f"(?:{prefix_tree_pattern(words)})")
    for word in [*words, "cop", "coo", "comm", "x", ""]:
        assert bool(pattern.fullmatch(word)) == (word in words), word


def test_text_over_the_bound_is_refused_before_any_scan(settings):
    settings.URLGUARD = {**settings.URLGUARD, "CONTENT_MAX_CHARS": 100}
    assert find_links("x" * 100) == []
    with pytest.raises(TextTooLong, match="101 characters long; at most 100"):
        find_links("x" * 101)


HOSTILE = {
    "100,000 dots": "." * 100_000,
    "100,000 dots between letters": "a." * 100_000,
    "dots and slashes": "a.b/" * 50_000,
    "nested parentheses": "(" * 100_000 + "a.top" + ")" * 100_000,
    "nested parentheses in a URL": "http://a.example/" + "(" * 100_000 + ")" * 100_000,
    "a 1 MB URL": "http://a.example/" + "a" * 1_000_000,
    "a 1 MB host": "http://" + "a." * 500_000 + "com/",
    "100,000 links": "a.top/ " * 100_000,
    "schemes back to back": "http://" * 100_000,
    "schemes without slashes": "http:" * 100_000,
    "character references": "http://" + "&#101;" * 100_000 + ".top/ " + "&" * 100_000,
    "100,000 escapes in a host": "http://" + "%65" * 100_000 + ".top/",
    "100,000 zero-width spaces": "http://e" + "\u200b" * 100_000 + "vil.top/",
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_text_is_scanned_in_linear_time(settings, name):
    """About a second for a megabyte here; a scan quadratic in the text would take
    hours. The bound leaves room for a loaded machine."""
    text = HOSTILE[name]
    settings.URLGUARD = {**settings.URLGUARD, "CONTENT_MAX_CHARS": len(text)}
    started = time.perf_counter()
    find_links(text)
    assert time.perf_counter() - started < 20 * len(text) / 1_000_000 + 2


@pytest.mark.django_db
def test_check_text_checks_every_link_in_one_batch(build_filter, fresh_guard, monkeypatch):
    add_rule("spam.top/", category="phishing", source="test")
    add_rule("evil.example/bad/", category="malware", source="test")
    build_filter()
    calls = []
    original = Guard.check_many
    monkeypatch.setattr(
        Guard, "check_many", lambda self, urls: calls.append(list(urls)) or original(self, urls)
    )
    verdicts = check_text(
        "Great post! See WWW.SPAM.TOP/win, https://news.example/ok and "
        "(https://evil.example/bad/x). Again: www.spam.top/win"
    )
    assert len(calls) == 1
    assert [(v.url, v.blocked, v.category) for v in verdicts] == [
        ("http://WWW.SPAM.TOP/win", True, "phishing"),
        ("https://news.example/ok", False, ""),
        ("https://evil.example/bad/x", True, "malware"),
        ("http://www.spam.top/win", True, "phishing"),
    ]
    assert [v.rule.expression for v in listed_links(verdicts)] == [
        "spam.top/",
        "evil.example/bad/",
        "spam.top/",
    ]
    assert check_text("nothing here") == [] and len(calls) == 1


@pytest.mark.django_db
def test_a_listed_link_in_text_is_a_hit_of_its_own_kind(build_filter, fresh_guard):
    rule = add_rule("spam.top/", category="phishing", source="test")
    build_filter()
    check_text("buy at spam.top/x", where="comment 7")
    stats.flush()
    assert list(HitEvent.objects.values_list("action", "where", "host", "rule_id")) == [
        ("text", "comment 7", "spam.top", rule.pk)
    ]
    assert HitEvent.Action.TEXT.label == "Blocked (posted text)"


@pytest.mark.django_db
def test_the_admins_hit_log_shows_and_filters_the_posted_text_kind(
    build_filter, fresh_guard, superuser
):
    add_rule("spam.top/", category="phishing", source="test")
    build_filter()
    check_text("buy at spam.top/x", where="comment 7")
    stats.flush()
    page = superuser.get("/admin/urlguard/hitevent/", {"action__exact": "text"})
    assert page.status_code == 200
    html = page.content.decode()
    assert "Blocked (posted text)" in html and "comment 7" in html and "spam.top" in html
