"""urlguard.hotpath.warning: the pages the guard shows in place of a redirect answer
with headers that keep them from being framed, sniffed, cached or scripted."""

from __future__ import annotations

import base64
import hashlib
import re
from urllib.parse import urlencode

import pytest
from django.http import HttpResponse
from django.urls import include, path

from tests.support.webfakes import SetFilter
from urlguard.hotpath.guard import Guard
from urlguard.writepath.changes import add_rule


def raw_response(request):
    response = HttpResponse("body", status=302)
    response["Location"] = request.GET["to"]
    return response


urlpatterns = [path("raw", raw_response), path("", include("urlguard.urls"))]

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]


@pytest.fixture
def filt(use_guard):
    fake = SetFilter()
    use_guard(Guard(lambda: fake))
    fake.add(add_rule("evil.example/", category="malware", source="test").expression)
    return fake


def assert_protected(response):
    assert response["X-Frame-Options"] == "DENY"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Cross-Origin-Opener-Policy"] == "same-origin"
    assert response["Cache-Control"] == "no-store"
    policy = dict(
        (directive.split(" ", 1) + [""])[:2]
        for directive in response["Content-Security-Policy"].split("; ")
    )
    assert policy["frame-ancestors"] == "'none'"
    assert policy["default-src"] == "'none'"
    assert "unsafe-inline" not in response["Content-Security-Policy"]
    return policy


def _redirect(client, to):
    return client.get("/raw?" + urlencode({"to": to}))


@pytest.mark.parametrize(
    ("to", "status"),
    [
        ("http://evil.example/", 403),  # on the list
        ("javascript:alert(1)", 403),  # not a web page
        ("http://0x100.0/", 403),  # not a valid address
    ],
)
def test_every_warning_page_refuses_to_be_framed(client, filt, to, status):
    response = _redirect(client, to)
    assert response.status_code == status
    assert_protected(response)


def test_the_page_cannot_be_checked_page_too(use_guard, client, monkeypatch):
    guard = Guard(SetFilter, on_filter_error="closed")
    monkeypatch.setattr(guard, "check", lambda url: 1 / 0)
    use_guard(guard)
    response = _redirect(client, "https://www.python.org/")
    assert response.status_code == 503
    assert_protected(response)
    monkeypatch.setattr(
        "urlguard.hotpath.middleware.warning_response",
        lambda request, **kwargs: 1 / 0,  # even the plain-text last resort
    )
    response = _redirect(client, "https://www.python.org/")
    assert response.status_code == 503 and response["Content-Type"].startswith("text/plain")
    assert_protected(response)


def test_a_refused_continue_token_page_too(client, db):
    response = client.get("/continue", {"token": "forged"})
    assert response.status_code == 400
    assert_protected(response)


def test_the_policy_allows_exactly_the_pages_own_style_and_no_script(client, filt):
    response = _redirect(client, "http://evil.example/")
    policy = assert_protected(response)
    html = response.content.decode()
    styles = re.findall(r"<style>(.*?)</style>", html, re.DOTALL)
    assert styles
    hashes = {
        "'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'"
        for s in styles
    }
    assert set(policy["style-src"].split()) == hashes
    # What the policy would silently block must not be on the page at all.
    assert "<script" not in html
    assert not re.search(r"\sstyle=", html)
    assert not re.search(r"\son[a-z]+=", html)
