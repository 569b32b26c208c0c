"""urlguard.writepath.rules: what a pasted URL, host or expression becomes as a rule, the
roll-up levels offered for it, public-suffix refusal, and matching."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from urlguard.hotpath.canonical import expressions
from urlguard.hotpath.rollup import public_suffixes, registrable_domain, rule_level
from urlguard.writepath import rules
from urlguard.writepath.rules import (
    MAX_RULE_LENGTH,
    RuleCandidate,
    RuleError,
    normalize_rule,
    rule_candidates,
    rule_matches,
)


@pytest.mark.parametrize(
    ("text", "expression"),
    [
        ("https://Evil.EXAMPLE.com/x/y.html#frag", "evil.example.com/x/y.html"),
        ("evil.example.com", "evil.example.com/"),
        ("evil.example.com/", "evil.example.com/"),
        ("  EVIL.example.com.  ", "evil.example.com/"),
        ("example.com/path/", "example.com/path/"),
        ("http://example.com/path/page.html", "example.com/path/page.html"),
        ("http://example.com/page.html?id=3&b=2", "example.com/page.html?id=3&b=2"),
        ("example.com/page.html?", "example.com/page.html"),  # a bare '?' adds nothing
        ("https://user:pw@example.com:8443/a/../b/", "example.com/b/"),
        ("*.example.com", "example.com/"),
        ("https://*.example.com/", "example.com/"),
        ("*.2.1", "2.0.0.1/"),  # what is left after "*." is canonicalized in turn
        (".example.com", "example.com/"),
        ("example.com/dir/*", "example.com/dir/"),
        ("http://B\u00fccher.example/", "xn--bcher-kva.example/"),
        ("1.2.3.4", "1.2.3.4/"),
        ("http://3279880203/x", "195.127.0.11/x"),
        ("[2001:db8::1]/a/", "[2001:db8::1]/a/"),
        ("2001:DB8:0::1", "[2001:db8::1]/"),
        ("user.github.io", "user.github.io/"),  # github.io is a (private) public suffix
        ("example.co.uk", "example.co.uk/"),
        ("paypal.com.login.secure.verify.evil.com", "paypal.com.login.secure.verify.evil.com/"),
    ],
)
def test_normalize_rule(text, expression):
    assert normalize_rule(text) == expression


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("com", "top-level domain"),
        ("com/", "top-level domain"),
        ("localhost", "top-level domain"),
        ("co.uk/", "public suffix"),
        ("http://co.uk/path/", "public suffix"),
        ("github.io/", "public suffix"),
        ("https://GitHub.IO", "public suffix"),
        ("*.co.uk", "public suffix"),
        ("foo.kawasaki.jp", "public suffix"),  # a wildcard rule of the list
        ("", "empty rule"),
        ("   ", "empty rule"),
        ("mailto:abuse@example.com", "only http and https"),
        ("javascript:alert(1)", "only http and https"),
        ("ftp://example.com/", "only http and https"),
        ("/just/a/path", "no host"),
        ("http://", "no host"),
        ("http://a*b.example.com/", "cannot contain '\\*'"),
        ("http://example.com:notaport/", "invalid port"),
        ("example.com/" + "a" * MAX_RULE_LENGTH, "limit"),
        ("http://%20leadingspace.com/", "no browser accepts"),
        ("http://host%23.com/", "no browser accepts"),
        ("http://evil.com%2F.good.com/", "no browser accepts"),
        ("http://\x01\x80.com/", "no browser accepts"),
        ("http://W!eird<>Ho$^.com/", "no browser accepts"),
        ("||example.com^", "no browser accepts"),
    ],
)
def test_normalize_rule_refuses_with_a_reason(text, reason):
    with pytest.raises(RuleError, match=reason):
        normalize_rule(text)


def test_rule_error_is_a_value_error():
    assert issubclass(RuleError, ValueError)
    with pytest.raises(RuleError):
        normalize_rule(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("expression", "level"),
    [
        ("example.com/", "domain"),
        ("example.co.uk/", "domain"),
        ("user.github.io/", "domain"),
        ("1.2.3.4/", "domain"),
        ("[2001:db8::1]/", "domain"),
        ("sub.example.com/", "subdomain"),
        ("a.b.example.co.uk/", "subdomain"),
        ("example.com/path/", "path"),
        ("sub.example.com/a/b/c/", "path"),
        ("example.com/a/b/c/d/", "page"),  # deeper than lookups roll up: matches only itself
        ("example.com/path/page.html", "page"),
        ("example.com/page.html?id=3", "page"),
        ("example.com/?id=3", "page"),
        ("example.com/dir/?x=1", "page"),
    ],
)
def test_rule_level(expression, level):
    assert rule_level(expression) == level


def test_rule_level_needs_a_host():
    with pytest.raises(ValueError, match="no host"):
        rule_level("/path/")


def test_rule_candidates_for_a_pasted_url():
    candidates = rule_candidates("https://www.Shop.example.co.uk/a/b/c/d/page.html?id=3#top")
    assert [(c.level, c.expression) for c in candidates] == [
        ("domain", "example.co.uk/"),
        ("subdomain", "www.shop.example.co.uk/"),
        ("path", "www.shop.example.co.uk/a/"),
        ("path", "www.shop.example.co.uk/a/b/"),
        ("path", "www.shop.example.co.uk/a/b/c/"),
        ("page", "www.shop.example.co.uk/a/b/c/d/page.html"),
        ("page", "www.shop.example.co.uk/a/b/c/d/page.html?id=3"),
    ]
    assert all(isinstance(c, RuleCandidate) and c.description for c in candidates)
    url = "https://www.shop.example.co.uk/a/b/c/d/page.html?id=3"
    # every candidate blocks the pasted URL: each is one of its expressions
    assert all(rule_matches(c.expression, url) for c in candidates)


def test_rule_candidates_for_a_bare_host_and_directories():
    assert [(c.level, c.expression) for c in rule_candidates("example.com")] == [
        ("domain", "example.com/")
    ]
    assert [(c.level, c.expression) for c in rule_candidates("sub.example.com/a/b/")] == [
        ("domain", "example.com/"),
        ("subdomain", "sub.example.com/"),
        ("path", "sub.example.com/a/"),
        ("path", "sub.example.com/a/b/"),
    ]
    # a directory deeper than lookups roll up to is offered as a page (exact) rule
    assert [(c.level, c.expression) for c in rule_candidates("example.com/a/b/c/d/")] == [
        ("domain", "example.com/"),
        ("path", "example.com/a/"),
        ("path", "example.com/a/b/"),
        ("path", "example.com/a/b/c/"),
        ("page", "example.com/a/b/c/d/"),
    ]
    assert [(c.level, c.expression) for c in rule_candidates("http://1.2.3.4/x.html")] == [
        ("domain", "1.2.3.4/"),
        ("page", "1.2.3.4/x.html"),
    ]


def test_rule_candidates_say_when_subdomains_are_not_covered():
    candidates = rule_candidates("http://paypal.com.login.secure.verify.evil.com/")
    assert [c.level for c in candidates] == ["domain", "subdomain"]
    assert "not covered" in candidates[1].description
    assert "and all its subdomains" in candidates[0].description


def test_rule_candidates_refuse_public_suffixes_and_junk():
    for text in ("https://github.io/", "co.uk", "mailto:x@example.com", ""):
        with pytest.raises(RuleError):
            rule_candidates(text)


@pytest.mark.parametrize(
    ("expression", "url", "blocked"),
    [
        ("example.com/", "https://example.com/", True),
        ("example.com/", "http://www.EXAMPLE.com:8080/any/page?x=1#f", True),
        ("example.com/", "https://a.b.c.d.example.com/", True),
        ("example.com/", "https://example.com.evil.net/", False),
        ("example.com/", "https://notexample.com/", False),
        ("sub.example.com/", "https://x.sub.example.com/p", True),
        ("sub.example.com/", "https://example.com/", False),
        ("sub.example.com/", "https://other.example.com/", False),
        ("example.com/path/", "https://www.example.com/path/deeper/page.html", True),
        ("example.com/path/", "https://example.com/path", False),
        ("example.com/path/", "https://example.com/pathology/", False),
        ("example.com/path/page.html", "https://example.com/path/page.html?any=query", True),
        ("example.com/path/page.html", "https://example.com/path/page.htm", False),
        ("example.com/p.html?id=3", "https://example.com/p.html?id=3", True),
        ("example.com/p.html?id=3", "https://example.com/p.html?id=4", False),
        ("1.2.3.4/", "http://1.2.3.4/x", True),
        ("1.2.3.4/", "http://0x01020304/x", True),
        ("1.2.3.4/", "http://1.2.3.5/x", False),
        ("1.2.3.4/", "http://1.2.3.4.nip.example/x", False),
        # the exact host always counts, however deep
        ("a.b.c.d.e.f.g/", "http://a.b.c.d.e.f.g/x", True),
        ("a.b.c.d.e.f.g/", "http://z.a.b.c.d.e.f.g/x", False),
    ],
)
def test_rule_matches(expression, url, blocked):
    assert rule_matches(expression, url) is blocked


def test_rule_matches_raises_for_a_bad_url():
    with pytest.raises(ValueError):
        rule_matches("example.com/", "javascript:alert(1)")


def test_registrable_domain():
    assert registrable_domain("www.example.co.uk") == "example.co.uk"
    assert registrable_domain("a.user.github.io") == "user.github.io"
    assert registrable_domain("1.2.3.4") == "1.2.3.4"
    assert registrable_domain("co.uk") is None


_HOSTS = st.lists(
    st.sampled_from(["a", "b", "www", "xn--bcher-kva", "x_y", "1", "0x1f"]), min_size=1, max_size=8
).map(lambda labels: ".".join(labels + ["example.com"]))
_PATHS = st.lists(
    st.sampled_from(["a", "b.html", "..", ".", "", "%2E", "%41", "c d", "\u00fc"]), max_size=7
).map("/".join)
_QUERIES = st.one_of(st.none(), st.text(alphabet="ab=&%2F?#", max_size=8))


@settings(max_examples=400, deadline=None)
@given(_HOSTS, _PATHS, _QUERIES)
def test_every_rule_blocks_what_it_was_made_from(host, path, query):
    url = f"http://{host}/{path}" + ("" if query is None else f"?{query}")
    expression = normalize_rule(url)
    assert normalize_rule(expression) == expression
    assert expression in expressions("http://" + expression)
    assert rule_matches(expression, url)
    assert rule_level(expression) in ("domain", "subdomain", "path", "page")
    for candidate in rule_candidates(url):
        assert rule_matches(candidate.expression, url), candidate
        assert normalize_rule(candidate.expression) == candidate.expression
        assert rule_level(candidate.expression) == candidate.level, candidate


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=60), st.text(alphabet="*.:/?#@%[]\\|^ax1\u00fc", max_size=20)))
def test_any_text_is_a_rule_or_a_rule_error(text):
    try:
        expression = normalize_rule(text)
    except RuleError as exc:
        assert str(exc)
        with pytest.raises(RuleError):
            rule_candidates(text)
        return
    assert expression in {c.expression for c in rule_candidates(text)}
    assert normalize_rule(expression) == expression


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("bad_host!.example/", "not a valid host name label"),
        ("-x.example.com", "not a valid host name label"),
        ("x-.example.com", "not a valid host name label"),
        ("a" * 64 + ".example.com", "64 characters long; the limit is 63"),
        (".".join(["abcdefghi"] * 26) + ".com", "DNS allows at most 253"),
        ("xn--zz.example", "not valid IDNA"),
        ("1.2.3.4.5", "ends in a number"),
        ("10.1.2.3", "private address"),
        ("172.16.0.1", "private address"),
        ("100.64.0.1", "private address"),
        ("[fd00::1]", "private address"),
        ("[::ffff:192.168.1.1]", "private address"),
        ("127.0.0.1/admin", "loopback address"),
        ("[::1]", "loopback address"),
        ("169.254.0.1", "link-local address"),
        ("[fe80::1]", "link-local address"),
        ("0.0.0.0", "unspecified address"),
        ("0.1.2.3", "this-network"),
        ("224.0.0.1", "multicast address"),
        ("[ff02::1]", "multicast address"),
        ("240.0.0.1", "reserved address"),
        ("255.255.255.255", "broadcast address"),
        ("198.18.0.1", "benchmark-testing address"),
        ("[2002:7f00:1::1]", "loopback address"),  # 6to4 around 127.0.0.1
        ("[2002:c0a8:101::1]", "private address"),  # 6to4 around 192.168.1.1
        ("[2001:0:4136:e378:8000:63bf:80ff:fffe]", "loopback address"),  # Teredo
        ("192.0.2.0/24", "CIDR notation"),  # not a page rule on the path /24
        ("10.0.0.0/8", "CIDR notation"),
        ("[2001:db8::]/32", "CIDR notation"),
    ],
)
def test_unreachable_hosts_are_refused(text, reason):
    with pytest.raises(RuleError, match=reason):
        normalize_rule(text)


@pytest.mark.parametrize(
    ("text", "expression"),
    [
        ("ad_server.example.com", "ad_server.example.com/"),  # resolvers accept '_'
        ("a" * 63 + ".example.com", "a" * 63 + ".example.com/"),
        ("ab--cd.example.com", "ab--cd.example.com/"),
        ("8.8.8.8/x", "8.8.8.8/x"),
        ("[2001:db8::1]", "[2001:db8::1]/"),  # documentation range: not private
    ],
)
def test_reachable_hosts_are_accepted(text, expression):
    assert normalize_rule(text) == expression


def test_private_addresses_are_accepted_when_the_setting_allows(settings):
    settings.URLGUARD = {**settings.URLGUARD, "ALLOW_PRIVATE_ADDRESS_RULES": True}
    assert normalize_rule("192.168.0.1/admin") == "192.168.0.1/admin"
    assert normalize_rule("127.0.0.1") == "127.0.0.1/"


def _full_path(text: str) -> str | None:
    """What normalize_rule gives without its fast path for plain texts (None: refused)."""
    try:
        expression = rules._expression(rules._parse(text))
    except RuleError:
        return None
    return expression if len(expression) <= MAX_RULE_LENGTH else None


_PLAIN_LABELS = st.text(alphabet="aZ09-x", min_size=1, max_size=5) | st.sampled_from(
    ["xn--bcher-kva", "a" * 63, "a" * 64, "com", "co", "uk", "github", "io", "ck", "www", "1"]
)
_PLAIN_HOSTS = st.lists(_PLAIN_LABELS, min_size=1, max_size=5).map(".".join)
_PLAIN_PATHS = st.lists(st.text(alphabet="a.~_-Z9/%?#", max_size=6), max_size=4).map(
    lambda segments: "".join("/" + s for s in segments)
)
_PLAIN_SCHEMES = st.sampled_from(["", "http://", "https://", "HTTP://", "ftp://", "//"])


@settings(max_examples=1000, deadline=None)
@given(_PLAIN_SCHEMES, _PLAIN_HOSTS, _PLAIN_PATHS, st.sampled_from(["", ".", ":80", " "]))
@example("http://", "host1.bench-feed1.example", "/path/1/x.html", "")
@example("", "co.uk", "", "")
@example("", "foo.ck", "", "")  # wildcard: *.ck
@example("", "www.ck", "", "")  # its exception: !www.ck
@example("", "a.foo.ck", "", "")
@example("", "s3.amazonaws.com", "", "")
@example("", "kawasaki.jp", "", "")  # a wildcard's own root: *.kawasaki.jp
@example("", "a-.example", "/", "")
@example("", "a.example", "/.x", "")
@example("", "a.example", "/a//b", "")
def test_the_fast_path_for_plain_texts_gives_what_the_full_path_gives(scheme, host, path, tail):
    text = f"{scheme}{host}{tail}{path}"
    plain = rules._plain_expression(text)
    assert rules.plain_expressions([text, text.upper()]) == [
        plain,
        rules._plain_expression(text.upper()),
    ]
    if plain is not None:
        assert plain == _full_path(text)
    try:
        assert normalize_rule(text) == _full_path(text)
    except RuleError:
        assert _full_path(text) is None


@pytest.mark.parametrize(
    "text",
    [
        "http://host1.bench-feed1.example/path/1/x.html",
        "https://Evil.Example.com/a-b/c_d~e.html",
        "evil.example.com",
        "evil.example.com/dir/",
    ],
)
def test_plain_texts_take_the_fast_path(text):
    assert rules._plain_expression(text) == _full_path(text) is not None


@pytest.mark.parametrize(
    ("host", "public"),
    [("com", True), ("co.uk", True), ("github.io", True), ("foo.ck", True), ("kawasaki.jp", True)]
    + [("www.ck", False), ("example.co.uk", False), ("a.b.example", False)],
)
def test_the_public_suffix_precheck_never_passes_a_public_suffix(host, public):
    assert public_suffixes().is_public(host) is public
    if public:
        assert rules._may_be_public(host)
    assert rules._may_be_public("a.b.example") is False


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.sampled_from(["ck", "www", "jp", "kawasaki", "city", "uk", "co", "io", "github", "a"]),
        min_size=1,
        max_size=4,
    ).map(".".join)
)
def test_a_host_the_precheck_passes_is_no_public_suffix(host):
    if not rules._may_be_public(host):
        assert not public_suffixes().is_public(host)
