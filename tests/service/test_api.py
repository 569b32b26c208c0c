"""GET /api/check?url=: the verdict as JSON, clear 400s, 405 for other methods."""

from __future__ import annotations

import pytest

from tests.service.webfakes import SetFilter
from urlguard import guard as guard_module
from urlguard.changes import add_rule
from urlguard.guard import Guard

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


@pytest.mark.parametrize("method", ["post", "put", "delete", "patch"])
def test_other_methods_are_a_405(client, db, method):
    response = getattr(client, method)("/api/check?url=http://a.example/")
    assert response.status_code == 405
    assert response["Allow"] == "GET, HEAD"
    assert "not allowed" in response.json()["error"]


def test_degraded_answers_say_so(client, db, monkeypatch):
    monkeypatch.setattr(guard_module, "_guard", Guard(lambda: None, on_filter_error="open"))
    response = client.get("/api/check", {"url": "http://evil.example/"})
    assert response.status_code == 200
    assert response["X-URLGuard"] == "degraded"
    assert response.json()["degraded"] is True and "failing open" in response.json()["reason"]


def test_a_crash_is_a_json_503(client, db, monkeypatch):
    guard = Guard(SetFilter)

    def explode(url):
        raise RuntimeError("database is gone")

    monkeypatch.setattr(guard, "check", explode)
    monkeypatch.setattr(guard_module, "_guard", guard)
    response = client.get("/api/check", {"url": "http://evil.example/"})
    assert response.status_code == 503
    assert "try again" in response.json()["error"]
