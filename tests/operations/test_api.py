"""/api/check: GET one URL (open, rate-limited per address), POST a batch (API key,
rate-limited per key, at most API_MAX_URLS), JSON refusals with the right status."""

from __future__ import annotations

import pytest

from tests.support.webfakes import SetFilter
from urlguard.hotpath.guard import Guard
from urlguard.writepath.changes import add_rule

pytestmark = pytest.mark.django_db


@pytest.fixture
def rules(db, build_filter):
    add_rule("evil.example/", category="phishing", source="test")
    add_rule("site.example/free/", category="spam", source="test")
    build_filter()


def test_clean_url(client, rules, django_assert_num_queries):
    with django_assert_num_queries(0):
        response = client.get("/api/check", {"url": "https://WWW.Python.org/a/../b?x=1#frag"})
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response["Cache-Control"] == "no-store"
    assert response.json() == {
        "url": "https://WWW.Python.org/a/../b?x=1#frag",
        "canonical": "https://www.python.org/b?x=1",
        "blocked": False,
        "category": None,
        "rule": None,
        "reason": "",
        "degraded": False,
    }


def test_blocked_url(client, rules):
    data = client.get("/api/check", {"url": "http://login.evil.example/x"}).json()
    assert data["blocked"] is True
    assert data["category"] == "phishing"
    assert data["rule"] == "evil.example/"
    assert "evil.example/" in data["reason"]
    assert client.get("/api/check", {"url": "http://site.example/free/a"}).json()["rule"] == (
        "site.example/free/"
    )
    assert client.get("/api/check", {"url": "http://site.example/paid/"}).json()["blocked"] is False


@pytest.mark.parametrize("query", [{}, {"url": ""}, {"url": "  "}])
def test_missing_url_is_a_400(client, db, query):
    response = client.get("/api/check", query)
    assert response.status_code == 400
    assert "missing query parameter 'url'" in response.json()["error"]


@pytest.mark.parametrize(
    "url",
    [
        "javascript:alert(1)",
        "http://",
        "mailto:a@b.example",
        "not a url",  # no scheme and no plausible host
        "http://1.2.3.256/",  # a browser refuses it
        "http://example.com/" + "a" * 40_000,  # longer than canonical.MAX_URL_LENGTH
    ],
)
def test_malformed_url_is_a_400(client, db, url):
    response = client.get("/api/check", {"url": url})
    assert response.status_code == 400
    assert "not a usable http(s) URL" in response.json()["error"]


@pytest.mark.parametrize("method", ["put", "delete", "patch"])
def test_other_methods_are_a_405(client, db, method):
    response = getattr(client, method)("/api/check?url=http://a.example/")
    assert response.status_code == 405
    assert response["Allow"] == "GET, HEAD, POST"
    assert "not allowed" in response.json()["error"]


def test_degraded_answers_say_so(client, db, use_guard):
    use_guard(Guard(lambda: None, on_filter_error="open"))
    response = client.get("/api/check", {"url": "http://evil.example/"})
    assert response.status_code == 200
    assert response["X-URLGuard"] == "degraded"
    assert response.json()["degraded"] is True and "failing open" in response.json()["reason"]


def test_a_crash_is_a_json_503(use_guard, client, db, monkeypatch):
    guard = Guard(SetFilter)

    def explode(url):
        raise RuntimeError("database is gone")

    monkeypatch.setattr(guard, "check", explode)
    use_guard(guard)
    response = client.get("/api/check", {"url": "http://evil.example/"})
    assert response.status_code == 503
    assert "try again" in response.json()["error"]


# -- rate limit of the open GET --------------------------------------------------


def test_the_open_get_is_rate_limited_per_address(client, db, settings):
    settings.URLGUARD = {**settings.URLGUARD, "API_OPEN_RATE": "2/m"}
    url = {"url": "https://example.com/"}
    for _ in range(2):
        assert client.get("/api/check", url, REMOTE_ADDR="198.51.100.1").status_code == 200
    refused = client.get("/api/check", url, REMOTE_ADDR="198.51.100.1")
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert refused.json()["error"].startswith("rate limit of 2/m requests reached for this address")
    assert client.get("/api/check", url, REMOTE_ADDR="198.51.100.2").status_code == 200


def test_a_failing_cache_lets_requests_through(client, db, settings, monkeypatch, caplog):
    from django_ratelimit import core

    settings.URLGUARD = {**settings.URLGUARD, "API_OPEN_RATE": "1/m"}

    def broken(*args, **kwargs):
        raise ConnectionError("redis is down")

    monkeypatch.setattr(core.caches["default"].__class__, "add", broken)
    for _ in range(3):
        assert client.get("/api/check", {"url": "https://example.com/"}).status_code == 200
    assert [r.getMessage() for r in caplog.records if r.name == "urlguard.runtime.ratelimits"] == [
        "rate limits not applied: the cache failed"
    ]
