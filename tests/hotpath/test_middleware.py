"""RedirectGuardMiddleware through the test client: which responses it looks
at, how it resolves a Location the way a browser does, what it blocks, the
scheme policy, the cache header, and that it never turns a failure into a 500."""

from __future__ import annotations

import time
from urllib.parse import urlencode

import pytest
from asgiref.sync import async_to_sync
from django.http import HttpResponse
from django.test import RequestFactory
from django.urls import include, path
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from tests.support.webfakes import SetFilter
from urlguard.hotpath import guard as guard_module
from urlguard.hotpath.canonical import browser_url, canonical_url
from urlguard.hotpath.guard import Guard
from urlguard.hotpath.middleware import RedirectGuardMiddleware, mark_confirmed, resolve_location
from urlguard.writepath.changes import add_rule


def raw_response(request):
    """Any status, any Location, exactly as given (Django's redirect classes
    would refuse some of the hostile ones we want to see the middleware handle)."""
    response = HttpResponse("body", status=int(request.GET.get("status", "302")))
    if "to" in request.GET:
        response["Location"] = request.GET["to"]
    if "cc" in request.GET:
        response["Cache-Control"] = request.GET["cc"]
    if "confirmed" in request.GET:
        mark_confirmed(response)
    return response


urlpatterns = [
    path("raw", raw_response),
    path("", include("urlguard.urls")),
]

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]


@pytest.fixture
def filt(use_guard):
    """The fake filter behind the process-wide guard, with a few rules listed."""
    fake = SetFilter()
    use_guard(Guard(lambda: fake))
    for text, category in [
        ("evil.example/", "malware"),
        ("login.bank.example/", "phishing"),
        ("site.example/free/", "spam"),
        ("site.example/a/page.html", "spam"),
    ]:
        fake.add(add_rule(text, category=category, source="test").expression)
    return fake


@pytest.fixture(autouse=True)
def _fresh_log_limits():
    guard_module.log_limited._last.clear()


def install(use_guard, filt, policy="database"):
    use_guard(Guard(lambda: filt, on_filter_error=policy))


def redirect(client, to, **params):
    return client.get("/raw?" + urlencode({"to": to, **params}))


@pytest.mark.parametrize(
    "to",
    [
        "https://www.python.org/",
        "http://bank.example/",
        "https://www.bank.example/login",
        "http://site.example/freedom/",
        "http://site.example/a/other.html",
        "http://notevil.example/",
    ],
)
def test_clean_redirect_passes_with_private_cache(client, filt, to):
    response = redirect(client, to)
    assert response.status_code == 302
    assert response["Location"] == to
    assert response["Cache-Control"] == "private, max-age=90"
    assert "X-URLGuard" not in response


@pytest.mark.parametrize(
    ("to", "host", "category"),
    [
        ("http://evil.example/", "evil.example", "malware"),
        ("https://cdn.evil.example/setup.exe", "cdn.evil.example", "malware"),
        ("https://login.bank.example/verify?id=1", "login.bank.example", "phishing"),
        ("http://site.example/free/gift.html", "site.example", "spam"),
        ("http://site.example/a/page.html?x=1", "site.example", "spam"),
    ],
)
def test_blocked_redirect_becomes_the_warning_page(client, filt, to, host, category):
    response = redirect(client, to)
    assert response.status_code == 403
    assert not response.has_header("Location")
    assert response["Cache-Control"] == "no-store"
    assert "noindex" in response["X-Robots-Tag"]
    html = response.content.decode()
    assert host in html
    assert category in html.lower()
    assert '<meta name="robots" content="noindex' in html
    assert "Back to safety" in html and "/continue?token=" in html


@pytest.mark.parametrize(
    ("to", "blocked"),
    [
        ("http://EVIL.example/x/../y?q=1", True),
        ("https://www.python.org/", False),
        ("http://a.example/" + "x" * 2000, False),  # too long for the memo
    ],
)
def test_each_destination_is_read_once_and_judged_without_a_cache(
    client, filt, monkeypatch, to, blocked
):
    from urlguard.hotpath import canonical

    monkeypatch.setattr(canonical, "_CACHE_MAX_URL", 0)  # no memo: nothing to lean on
    reads = []
    for name in ("_read", "_parse"):  # the full reading, and the one with its shortcut
        original = getattr(canonical, name)
        monkeypatch.setattr(
            canonical, name, lambda url, original=original: reads.append(url) or original(url)
        )
    response = redirect(client, to)
    assert response.status_code == (403 if blocked else 302)
    assert reads == [to]


@pytest.mark.parametrize(
    "to",
    [
        "//evil.example/x",  # scheme-relative
        "/\\evil.example/x",  # browsers read a backslash as a slash
        "///evil.example/x",  # and skip extra slashes before the host
        "https:evil.example/x",  # another special scheme: an authority follows
        "\t http://evil.example/x ",  # stripped by the browser
        "ht\ttp://ev\til.example/",  # tabs removed anywhere (newlines cannot be in a header)
    ],
)
def test_browser_style_locations_are_resolved_before_checking(client, filt, to):
    assert redirect(client, to).status_code == 403


def test_relative_location_is_resolved_against_the_request(rf, settings):
    settings.ALLOWED_HOSTS = ["shop.example"]
    request = rf.get("/a/b/c", HTTP_HOST="shop.example")
    assert resolve_location(request, "d?x=1") == ("http", "http://shop.example/a/b/d?x=1")
    # Dot segments are left to browser_url, which resolves them the browser's way.
    assert resolve_location(request, "../up") == ("http", "http://shop.example/a/b/../up")
    assert browser_url(resolve_location(request, "../up")[1]) == "http://shop.example/a/up"
    assert browser_url(resolve_location(request, "x//../y")[1]) == "http://shop.example/a/b/x/y"
    assert resolve_location(request, "http:same-scheme") == (
        "http",
        "http://shop.example/a/b/same-scheme",
    )
    assert resolve_location(request, "http:evil.example:80/x") == (
        "http",
        "http://shop.example/a/b/evil.example:80/x",
    )
    assert resolve_location(request, "http:http://[") == (
        "http",
        "http://shop.example/a/b/http://[",
    )
    # An empty reference or a fragment keeps the page's query, as in the browser.
    request = rf.get("/a/b/c?page=2", HTTP_HOST="shop.example")
    assert resolve_location(request, "#top")[1] == "http://shop.example/a/b/c?page=2#top"
    assert resolve_location(request, "?page=3")[1] == "http://shop.example/a/b/c?page=3"
    assert resolve_location(request, "MAILTO:x@y") == ("mailto", "MAILTO:x@y")
    # Plain absolute URLs mean what they say; anything a browser rewrites is rewritten.
    assert resolve_location(request, "https://a.example/x?y=1#z") == (
        "https",
        "https://a.example/x?y=1#z",
    )
    assert resolve_location(request, "HTTPS://A.example/x") == ("https", "https://A.example/x")
    assert resolve_location(request, "https://a.example\\b.example/") == (
        "https",
        "https://a.example/b.example/",
    )
    assert resolve_location(request, "https://a.exa mple/") == ("https", "https://a.exa%20mple/")


def test_internal_redirects_are_checked_only_when_configured(client, filt, settings, use_guard):
    settings.ALLOWED_HOSTS = ["site.example"]
    calls = filt.calls
    response = client.get("/raw?to=free/x", HTTP_HOST="site.example")  # → /free/x on site
    assert response.status_code == 302 and filt.calls == calls  # on-site: not checked
    settings.URLGUARD = {**settings.URLGUARD, "CHECK_INTERNAL_REDIRECTS": True}
    install(use_guard, filt)  # a URLGUARD change rebuilds the process-wide guard
    assert client.get("/raw?to=free/x", HTTP_HOST="site.example").status_code == 403
    assert client.get("/raw?to=/recipes/", HTTP_HOST="site.example").status_code == 302


@pytest.mark.parametrize(
    ("to", "sent"),
    [
        ("HTTP://WWW.Python.ORG:80/a/./b/../c?q=1#top", "http://www.python.org/a/c?q=1#top"),
        ("https://user:pw@docs.python.org:8443/3/", "https://docs.python.org:8443/3/"),
        ("http://B\u00fccher.example/caf\u00e9", "http://xn--bcher-kva.example/caf%C3%A9"),
        ("//www.python.org\\a\\b", "http://www.python.org/a/b"),
        ("http://0x7f.1/x", "http://127.0.0.1/x"),
        ("http://site.example/x//../y", "http://site.example/x/y"),
    ],
)
def test_an_allowed_redirect_leaves_as_exactly_the_url_that_was_checked(client, filt, to, sent):
    response = redirect(client, to)
    assert response.status_code == 302
    assert response["Location"] == sent


def test_a_scheme_relative_to_the_page_cannot_be_read_differently_by_the_browser(
    client, filt, settings
):
    # Behind a proxy that ends TLS, Django sees http while the browser is on https:
    # Django reads "http:evil.example/x" as a path on this site, the browser as
    # http://evil.example/x. The Location leaves as the absolute URL the guard
    # read, so the browser goes where the guard looked.
    settings.ALLOWED_HOSTS = ["site.example"]
    response = client.get("/raw?to=http:evil.example/x", HTTP_HOST="site.example")
    assert response.status_code == 302
    assert response["Location"] == "http://site.example/evil.example/x"
    # With the proxy's header trusted (README, "Deploying safely") Django knows
    # the page is https, and the Location is read as the browser reads it.
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    response = client.get(
        "/raw?to=http:evil.example/x", HTTP_HOST="site.example", HTTP_X_FORWARDED_PROTO="https"
    )
    assert response.status_code == 403


def test_a_relative_reference_to_this_site_is_left_as_written(client, filt, settings):
    # It keeps the page's scheme in every browser, proxy or not.
    settings.ALLOWED_HOSTS = ["site.example"]
    for to in ("/recipes/?page=2", "../up", "?q=1"):
        response = client.get("/raw?" + urlencode({"to": to}), HTTP_HOST="site.example")
        assert response.status_code == 302 and response["Location"] == to


@pytest.mark.parametrize(
    ("to", "rule"),
    [
        ("http://203.0x.113.7/", "203.0.113.7/"),  # a bare 0x part is 0
        ("http://[::ffff:203.0.113.7]/", "203.0.113.7/"),  # IPv4-mapped IPv6
        ("http://[::ffff:cb00:7107]/x", "203.0.113.7/"),
        ("http://bad.example/malware//../payload.exe", "bad.example/malware/"),
        ("http://bad.example/malware/x/..%2F../../payload.exe", "bad.example/malware/"),
    ],
)
def test_spellings_the_browser_reads_as_a_listed_url_are_blocked(client, filt, to, rule):
    filt.add(add_rule(rule, category="malware", source="test").expression)
    assert redirect(client, to).status_code == 403


@pytest.mark.parametrize("to", ["http://0x100.0/", "http://276.2.3/x", "http://1.2.3.256/"])
def test_hosts_a_browser_refuses_get_the_invalid_address_page(client, filt, to):
    response = redirect(client, to)
    assert response.status_code == 403
    assert "not valid" in response.content.decode()


def test_a_hostile_location_is_read_in_linear_time(rf):
    # One pattern could match "http://a???...?\\" in many ways and tried them all.
    request = rf.get("/raw", HTTP_HOST="testserver")

    def best(location):
        timings = []
        for _ in range(3):
            # CPU time of this thread: a busy machine slows neither reading.
            started = time.thread_time()
            resolve_location(request, location)
            timings.append(time.thread_time() - started)
        return min(timings)

    n = 20_000
    hostile = best("http://a" + "?" * n + "\\")
    plain = best("http://a" + "b" * n + "\\")
    assert hostile < 20 * plain + 0.005, (hostile, plain)


@pytest.mark.parametrize(
    ("status", "extra"),
    [
        (200, {"to": "http://evil.example/"}),  # not a redirect, even with a Location
        (304, {}),  # a 3xx without Location
        (404, {}),
        (201, {"to": "http://evil.example/"}),
    ],
)
def test_non_redirect_responses_are_untouched(client, filt, status, extra):
    calls = filt.calls
    response = client.get("/raw?" + urlencode({"status": status, **extra}))
    assert response.status_code == status
    assert filt.calls == calls
    assert "Cache-Control" not in response


def test_every_redirect_status_is_checked(client, filt):
    for status in (301, 302, 303, 307, 308):
        assert redirect(client, "http://evil.example/", status=status).status_code == 403


def test_a_filter_false_positive_never_shows_a_warning(client, use_guard):
    install(use_guard, SetFilter(everything=True))
    add_rule("evil.example/", category="spam", source="test")
    for to in ["https://www.python.org/", "http://good.example/a/b?c=d"]:
        response = redirect(client, to)
        assert response.status_code == 302 and response["Location"] == to
    assert redirect(client, "http://evil.example/").status_code == 403


def test_scheme_policy(client, filt, settings):
    for to in ["mailto:someone@example.com", "tel:+15551234"]:
        assert redirect(client, to).status_code == 302
    for to in [
        "javascript:alert(1)",
        " JaVa\tScript:alert(1)",
        "data:text/html,<b>x</b>",
        "ftp://files.example/",
    ]:
        response = redirect(client, to)
        assert response.status_code == 403, to
        assert "does not lead to a web page" in response.content.decode()
        assert "/continue?" not in response.content.decode()  # never one click from a script
    settings.URLGUARD = {**settings.URLGUARD, "ALLOWED_OTHER_SCHEMES": ("ftp",)}
    assert redirect(client, "ftp://files.example/").status_code == 302
    assert redirect(client, "mailto:a@b.example").status_code == 403


def test_unusable_http_destination_gets_the_warning_page(client, filt):
    response = redirect(client, "http://")
    assert response.status_code == 403
    assert "not valid" in response.content.decode()


def test_view_cache_control_is_kept_where_stricter(client, filt):
    response = redirect(client, "https://www.python.org/", cc="no-cache")
    assert "no-cache" in response["Cache-Control"]
    response = redirect(client, "https://www.python.org/", cc="private, max-age=10")
    assert response["Cache-Control"] == "private, max-age=10"


@pytest.mark.parametrize("cc", ["public, max-age=31536000", "max-age=3600", "public"])
def test_a_view_cannot_cache_an_allowed_redirect_past_a_later_block(client, filt, cc):
    response = redirect(client, "https://www.python.org/", cc=cc)
    directives = {d.strip() for d in response["Cache-Control"].split(",")}
    assert "private" in directives and "public" not in directives
    assert "max-age=90" in directives


def test_confirmed_responses_are_not_rechecked(client, filt):
    calls = filt.calls
    response = redirect(client, "http://evil.example/", confirmed="1")
    assert response.status_code == 302 and filt.calls == calls


def test_fail_open(client, use_guard):
    install(use_guard, None, policy="open")
    response = redirect(client, "http://evil.example/")
    assert response.status_code == 302
    assert response["X-URLGuard"] == "degraded"
    assert response["Cache-Control"] == "no-store"  # a degraded answer must not stick


def test_fail_closed(client, use_guard):
    install(use_guard, None, policy="closed")
    response = redirect(client, "https://www.python.org/")
    assert response.status_code == 503
    assert response["Retry-After"] == "60" and response["X-URLGuard"] == "degraded"
    html = response.content.decode()
    assert "could not check this link" in html and "/continue?token=" in html


@pytest.mark.parametrize("host_header", [{}, {"HTTP_HOST": "testserver"}])
def test_fail_closed_never_blocks_the_sites_own_redirects(client, use_guard, host_header):
    """A relative Location is this site; so is an absolute one to the request's host,
    with or without a Host header (HTTP/1.0 clients send none)."""
    install(use_guard, None, policy="closed")
    for to in ("/admin/", "http://testserver/elsewhere"):
        response = client.get("/raw?" + urlencode({"to": to}), **host_header)
        assert response.status_code == 302 and response["Location"] == to


def test_fail_to_database(client, use_guard):
    install(use_guard, None, policy="database")
    add_rule("evil.example/", category="phishing", source="test")
    blocked = redirect(client, "http://a.evil.example/")
    assert blocked.status_code == 403 and blocked["X-URLGuard"] == "degraded"
    clean = redirect(client, "http://good.example/")
    assert clean.status_code == 302 and clean["X-URLGuard"] == "degraded"


@pytest.mark.parametrize(("policy", "status"), [("open", 302), ("closed", 503), ("database", 503)])
def test_a_guard_crash_is_never_a_500(use_guard, client, monkeypatch, caplog, policy, status):
    guard = Guard(SetFilter, on_filter_error=policy)

    def explode(url):
        raise RuntimeError("database is gone")

    monkeypatch.setattr(guard, "check", explode)
    use_guard(guard)
    response = redirect(client, "https://www.python.org/")
    assert response.status_code == status
    assert response["X-URLGuard" if status == 302 else "Retry-After"]
    assert any("database is gone" in (r.exc_text or "") or r.exc_info for r in caplog.records)


def test_async_middleware_path(monkeypatch, filt):
    async def get_response(request):
        return raw_response(request)

    middleware = RedirectGuardMiddleware(get_response)
    factory = RequestFactory()
    blocked = async_to_sync(middleware)(factory.get("/raw", {"to": "http://evil.example/"}))
    assert blocked.status_code == 403
    clean = async_to_sync(middleware)(factory.get("/raw", {"to": "https://www.python.org/"}))
    assert clean.status_code == 302 and clean["Cache-Control"] == "private, max-age=90"
    untouched = async_to_sync(middleware)(factory.get("/raw", {"status": "200"}))
    assert untouched.status_code == 200


def test_middleware_is_first_after_the_proxy_address():
    """Only TrustedProxyMiddleware comes before it: that one never touches a response."""
    from django.conf import settings

    assert settings.MIDDLEWARE[:2] == [
        "urlguard.middleware.TrustedProxyMiddleware",
        "urlguard.middleware.RedirectGuardMiddleware",
    ]


@pytest.mark.parametrize("to", ["http://[::1", "https://[not-an-ip]/x"])
def test_malformed_destinations_get_a_page_not_a_crash(client, filt, to):
    response = redirect(client, to)
    assert response.status_code == 403
    assert "not valid" in response.content.decode()


_PIECES = st.sampled_from(
    [
        "",
        "/",
        "//",
        "///",
        "\\",
        "/\\",
        "http:",
        "https:",
        "HTTP://",
        "javascript:",
        "mailto:",
        " ",
        "\t",
        "%2F",
        "%00",
        "@",
        ":",
        "?",
        "#",
        "[",
        "]",
        "..",
        "evil.example",
        "good.example",
        "é",
        "\x7f",
    ]
)


@hsettings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(location=st.lists(_PIECES, max_size=8).map("".join))
def test_any_location_gets_an_answer_never_an_error(filt, location):
    request = RequestFactory().get("/raw", HTTP_HOST="testserver")
    response = HttpResponse(status=302)
    response["Location"] = location
    result = RedirectGuardMiddleware(lambda r: response).guard_response(request, response)
    assert result.status_code in (302, 403), (location, result.status_code)
    scheme, destination = resolve_location(request, location)
    if result.status_code == 302:
        assert scheme in ("http", "https", "mailto", "tel")
        if scheme in ("http", "https"):
            host = canonical_url(destination).host
            assert host != "evil.example" and not host.endswith(".evil.example"), location
    elif scheme in ("http", "https") and "evil.example" not in location:
        assert "not valid" in result.content.decode()  # refused only as unusable


def test_even_a_broken_warning_page_is_no_500(use_guard, client, monkeypatch):
    guard = Guard(SetFilter, on_filter_error="closed")
    monkeypatch.setattr(guard, "check", lambda url: 1 / 0)
    use_guard(guard)

    def broken_page(request, **kwargs):
        raise RuntimeError("template missing")

    monkeypatch.setattr("urlguard.hotpath.middleware.warning_response", broken_page)
    response = redirect(client, "https://www.python.org/")
    assert response.status_code == 503
    assert response["Content-Type"].startswith("text/plain")
    assert b"could not be checked" in response.content
