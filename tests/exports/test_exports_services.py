"""Exports on PostgreSQL: a render reads one REPEATABLE READ snapshot, so a change
committed while it runs belongs to the next position, never half to this one."""

from __future__ import annotations

import socket
import threading

from django.db import connections
from django.test import Client

from tests.support.services import LIVE
from urlguard.exports import prerender
from urlguard.exports.domains import DomainsExport
from urlguard.models import ChangeEvent
from urlguard.operations import apikeys
from urlguard.writepath.changes import add_rule

pytestmark = LIVE


def test_a_change_committed_during_a_render_is_in_the_next_position(monkeypatch, prerender_inline):
    add_rule("first.example/", category="spam", source="test")
    before = ChangeEvent.objects.head()
    key = apikeys.create_api_key("svc")[1]
    real = DomainsExport.rule_lines
    committed = []

    def rule_lines(self, expression, category):
        if not committed:  # another process commits while this render reads

            def other():
                add_rule("during.example/", category="spam", source="test")
                committed.append(ChangeEvent.objects.head())
                connections.close_all()

            thread = threading.Thread(target=other)
            thread.start()
            thread.join()
            # Not seen from inside the render's snapshot:
            assert ChangeEvent.objects.head() == before
        return real(self, expression, category)

    monkeypatch.setattr(DomainsExport, "rule_lines", rule_lines)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    first = client.get("/lists/domains.txt")
    text = b"".join(first.streaming_content).decode()
    assert first["X-URLGuard-Position"] == str(before)
    assert "first.example" in text and "during.example" not in text
    second = client.get("/lists/domains.txt")
    assert second["X-URLGuard-Position"] == str(committed[0]) != str(before)
    assert "during.example" in b"".join(second.streaming_content).decode()


def free_port() -> int:
    """A loopback TCP port nothing listens on (bound, then let go)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_with_postgresql_refusing_connections_the_newest_render_is_served_stale(settings):
    """A real refused connection (psycopg's OperationalError), not an injected one:
    each list is served from its newest render, said to be stale; one never rendered
    is a 503."""
    settings.URLGUARD = {**settings.URLGUARD, "EXPORTS_PRERENDER": ["hosts.txt"]}
    add_rule("evil.example/", category="spam", source="test")
    prerender.render_all()
    key = apikeys.create_api_key("resolver")[1]
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    before = client.get("/lists/hosts.txt")
    body = b"".join(before.streaming_content)
    database = connections["default"].settings_dict
    port = database["PORT"]
    connections.close_all()
    database["PORT"] = str(free_port())
    try:
        during = client.get("/lists/hosts.txt")
        missing = client.get("/lists/domains.txt")
        assert during.status_code == 200 and b"".join(during.streaming_content) == body
        assert during["X-URLGuard-Position"] == before["X-URLGuard-Position"]
        assert during["Warning"] == '110 urlguard "Response is Stale"'
        assert missing.status_code == 503 and missing["Retry-After"] == "30"
    finally:
        connections.close_all()
        database["PORT"] = port
    after = client.get("/lists/hosts.txt")
    assert b"".join(after.streaming_content) == body and after["X-URLGuard-Lag-Changes"] == "0"
