"""The exports read by real consumers: Brave's adblock-rust (PyPI `adblock`, the
engine of Brave's shields) loads abp.txt, and a Pi-hole-style conditional fetch
(only If-Modified-Since, from the cached copy's time) gets 304."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from urlguard.models import AllowedHost, ChangeEvent, Source
from urlguard.operations import apikeys
from urlguard.writepath.changes import add_rule

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("prerender_inline")]

adblock = pytest.importorskip("adblock", reason="PyPI adblock (the dev extra) is not installed")


@pytest.fixture
def client(db):
    key = apikeys.create_api_key("consumer")[1]
    return Client(HTTP_AUTHORIZATION=f"Bearer {key}")


def fetch(client, name, **headers):
    response = client.get(f"/lists/{name}", **headers)
    if response.status_code != 200:
        return response, ""
    return response, b"".join(response.streaming_content).decode()


def test_adblock_engine_blocks_listed_host_and_page_and_passes_the_allowlisted(client):
    add_rule("evil.example/", category="phishing", source="test")
    add_rule("pages.example/bad/page.html", category="spam", source="test")
    add_rule("pages.example/pills/", category="spam", source="test")
    add_rule("hosting.example/malware/", category="malware", source="test")
    allow = Source.objects.create(name="allowlist", kind="manual", is_allowlist=True)
    AllowedHost.objects.create(source=allow, host="hosting.example")
    _, text = fetch(client, "abp.txt")
    rules = adblock.FilterSet()
    # Another list the browser also loads blocks the allowlisted host whole.
    rules.add_filter_list("||hosting.example^\n")
    rules.add_filter_list(text)
    engine = adblock.Engine(rules)

    def blocked(url, kind="document"):
        return engine.check_network_urls(url, "https://site.example/", kind).matched

    assert blocked("https://evil.example/")
    assert blocked("https://www.evil.example/login", "script")
    assert blocked("https://pages.example/bad/page.html")  # the page itself
    assert blocked("https://pages.example/bad/page.html?id=3")
    assert not blocked("https://pages.example/bad/other.html")
    assert blocked("https://pages.example/pills/buy")
    assert blocked("https://pages.example/pills/x.js", "script")
    assert not blocked("https://pages.example/")
    assert not blocked("https://hosting.example/")  # the exception wins over the other list
    assert blocked("https://hosting.example/malware/x.exe")  # ... but not over ours


def test_pihole_conditional_fetch_gets_304_until_a_change(client):
    add_rule("evil.example/", category="phishing", source="test")
    # Last-Modified has whole seconds: this change was a minute ago.
    ChangeEvent.objects.update(created=timezone.now() - timedelta(minutes=1))
    response, text = fetch(client, "hosts.txt")
    assert "0.0.0.0 evil.example" in text
    # gravity keeps the file and sends its modification time back (no ETag)
    since = response["Last-Modified"]
    again, _ = fetch(client, "hosts.txt", HTTP_IF_MODIFIED_SINCE=since)
    assert again.status_code == 304
    add_rule("new.example/", category="spam", source="test")
    changed, text = fetch(client, "hosts.txt", HTTP_IF_MODIFIED_SINCE=since)
    assert changed.status_code == 200 and "0.0.0.0 new.example" in text
