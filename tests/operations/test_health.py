"""GET /healthz and /readyz: alive without touching anything; ready only with a
readable filter, a lag within the settings and a database that answers, and back."""

from __future__ import annotations

import logging
import os
import time
from datetime import timedelta

import pytest
from django.db import OperationalError, connections
from django.utils import timezone

from tests.support.broker import broker
from urlguard.models import ChangeEvent
from urlguard.nodesync import nudge, registry
from urlguard.writepath.changes import add_rule

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    # The registry looks at the path at most once a second; these tests change the
    # file between two requests.
    monkeypatch.setattr(registry, "CHECK_SECONDS", 0.0)
    monkeypatch.setattr(registry, "RETRY_SECONDS", 0.0)


@pytest.fixture
def ready_node(build_filter, settings):
    settings.URLGUARD = {
        **settings.URLGUARD,
        "READY_MAX_LAG_CHANGES": 2,
        "READY_MAX_LAG_SECONDS": 60,
        "NODE_NAME": "node-a",
    }
    add_rule("evil.example/", category="phishing", source="test")
    build_filter()


def _ready(client, **extra):
    response = client.get("/readyz", **extra)
    assert response["Content-Type"] == "application/json"
    assert response["Cache-Control"] == "no-store"
    return response.status_code, response.json()


def test_healthz_touches_neither_database_nor_filter(client, django_assert_num_queries):
    # No filter file exists in this test at all.
    with django_assert_num_queries(0):
        response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "alive"}
    assert response["Cache-Control"] == "no-store"


def test_ready_node(client, ready_node):
    status, body = _ready(client)
    assert status == 200
    assert body["ready"] is True and body["failed"] == [] and body["node"] == "node-a"
    assert body["checks"]["filter"]["rules"] == 1
    assert body["checks"]["lag"]["changes"] == 0
    assert body["checks"]["database"]["log_head"] == body["checks"]["filter"]["applied_seq"]


def test_probes_answer_any_host_and_are_never_redirected(client, ready_node):
    # A prober sends the pod's address as Host: not in ALLOWED_HOSTS.
    assert client.get("/readyz", HTTP_HOST="10.1.2.3").status_code == 200
    assert client.get("/healthz", HTTP_HOST="10.1.2.3").status_code == 200
    assert client.get("/", HTTP_HOST="10.1.2.3").status_code == 400


def test_other_methods_are_a_405(client, db):
    for path in ("/healthz", "/readyz"):
        response = client.post(path)
        assert response.status_code == 405 and response["Allow"] == "GET, HEAD"


def test_removed_file_then_rebuilt(client, ready_node, build_filter, filter_path):
    os.remove(filter_path)
    status, body = _ready(client)
    assert status == 503
    assert body["ready"] is False and body["failed"] == ["filter", "lag"]
    assert str(filter_path) in body["checks"]["filter"]["error"]
    assert "missing" in body["checks"]["filter"]["error"]
    build_filter()
    assert _ready(client)[0] == 200


def test_corrupt_file_then_rebuilt(client, ready_node, build_filter, filter_path):
    garbage = filter_path.with_name("garbage")
    garbage.write_bytes(b"not a filter file" * 100)
    os.replace(garbage, filter_path)  # as `cp` or `mv` over it would
    status, body = _ready(client)
    assert status == 503 and "filter" in body["failed"]
    assert "unreadable" in body["checks"]["filter"]["error"]
    build_filter()
    assert _ready(client)[0] == 200


def test_lag_in_changes_then_caught_up(client, ready_node, sync_filter):
    for i in range(3):
        add_rule(f"spam{i}.example/", category="spam", source="test")
    status, body = _ready(client)
    assert status == 503 and body["failed"] == ["lag"]
    assert body["checks"]["lag"]["changes"] == 3
    assert "3 change(s) behind" in body["checks"]["lag"]["error"]
    sync_filter()
    assert _ready(client)[0] == 200


def test_lag_in_seconds(client, ready_node, sync_filter):
    add_rule("late.example/", category="spam", source="test")
    assert _ready(client)[0] == 200  # one change behind, just now: within bounds
    ChangeEvent.objects.filter(expression="late.example/").update(
        created=timezone.now() - timedelta(seconds=61)
    )
    status, body = _ready(client)
    assert status == 503 and body["failed"] == ["lag"]
    assert body["checks"]["lag"]["seconds"] >= 61
    sync_filter()
    assert _ready(client)[0] == 200


def test_database_unreachable_then_back(client, ready_node, monkeypatch):
    connection = connections["default"]

    def refuse():
        raise OperationalError("connection refused")

    monkeypatch.setattr(connection, "ensure_connection", refuse)
    status, body = _ready(client)
    assert status == 503 and body["failed"] == ["database", "lag"]
    assert body["checks"]["database"]["error"] == "OperationalError: connection refused"
    assert body["checks"]["filter"]["ok"] is True
    monkeypatch.undo()
    monkeypatch.setattr(registry, "CHECK_SECONDS", 0.0)
    assert _ready(client)[0] == 200


def test_a_failing_probe_is_logged_when_it_changes_not_per_request(
    client, ready_node, filter_path, build_filter, caplog
):
    os.remove(filter_path)
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            assert client.get("/readyz").status_code == 503
        build_filter()
        for _ in range(2):
            assert client.get("/readyz").status_code == 200
    mine = [r for r in caplog.records if r.name == "urlguard.operations.health"]
    assert [r.levelname for r in mine] == ["WARNING", "INFO"]
    assert "node-a is not ready: filter:" in mine[0].getMessage()
    assert not [r for r in caplog.records if r.name == "django.request"]


def test_probes_under_asgi(async_client, ready_node):
    from asgiref.sync import async_to_sync

    assert async_to_sync(async_client.get)("/healthz").json() == {"status": "alive"}
    response = async_to_sync(async_client.get)("/readyz")
    assert response.status_code == 200 and response.json()["ready"] is True


# -- what /readyz tells an address outside METRICS_ALLOWED_NETWORKS --------------------


@pytest.mark.parametrize("address", ["203.0.113.9", "2001:db8::9"])
def test_outsiders_learn_only_ready_failed_and_degraded(client, ready_node, monkeypatch, address):
    assert _ready(client, REMOTE_ADDR=address) == (
        200,
        {"ready": True, "failed": [], "degraded": []},
    )

    def refuse():
        raise OperationalError('could not connect to server "db.internal" (10.0.0.5), port 5432')

    monkeypatch.setattr(connections["default"], "ensure_connection", refuse)
    status, body = _ready(client, REMOTE_ADDR=address)
    # The exports' lag cannot be known either: they are served stale meanwhile.
    assert (status, body) == (
        503,
        {"ready": False, "failed": ["database", "lag"], "degraded": ["exports"]},
    )
    # Inside the networks (the test client's 127.0.0.1), the whole story.
    status, inside = _ready(client)
    assert inside["node"] == "node-a" and "db.internal" in inside["checks"]["database"]["error"]


def test_the_networks_and_the_token_open_the_details(client, ready_node, settings, filter_path):
    settings.URLGUARD = {
        **settings.URLGUARD,
        "METRICS_ALLOWED_NETWORKS": ["203.0.113.0/24"],
        "METRICS_TOKEN": "s3cret-token-for-the-scraper",
    }
    assert _ready(client, REMOTE_ADDR="203.0.113.9")[1]["checks"]["filter"]["path"] == str(
        filter_path
    )
    assert "checks" not in _ready(client, REMOTE_ADDR="127.0.0.1")[1]
    token = {"HTTP_AUTHORIZATION": "Bearer s3cret-token-for-the-scraper"}
    assert _ready(client, REMOTE_ADDR="198.51.100.1", **token)[1]["node"] == "node-a"


# -- a broker outage ---------------------------------------------------------------------
@pytest.fixture
def lagging_node(client, ready_node):
    _ready(client)  # mapped while current: what follows is lag, not a file moved in
    for i in range(3):
        add_rule(f"spam{i}.example/", category="spam", source="test")


@pytest.mark.parametrize("how", ["refused", "hung"])
def test_lag_while_the_shared_broker_is_down_does_not_drain_the_node(
    how,
    client,
    lagging_node,
    silent_broker,
):
    port = 1 if how == "refused" else silent_broker
    started = time.monotonic()
    with broker(f"redis://127.0.0.1:{port}/0"):
        status, body = _ready(client)
        assert time.monotonic() - started < nudge.NUDGE_TIMEOUT + 1.0
        assert status == 200 and body["ready"] and body["failed"] == []
        assert body["checks"]["broker"]["ok"] is False
        lag = body["checks"]["lag"]
        assert lag["ok"] and lag["changes"] == 3 and "error" not in lag
        assert "3 change(s) behind" in lag["warning"]
        assert "the broker shared by every node is unreachable" in lag["warning"]
        assert "`manage.py sync_filter` on each node" in lag["warning"]
        # Probed every few seconds: the broker is asked at most every 5 s.
        asked = time.monotonic()
        _ready(client)
        assert time.monotonic() - asked < 0.5


def test_lag_without_a_broker_outage_still_fails(client, lagging_node):
    # In-process tasks (no broker): the lag is this node's own.
    status, body = _ready(client)
    assert status == 503 and body["failed"] == ["lag"] and "broker" not in body["checks"]


def test_a_broker_outage_without_lag_is_not_looked_for(client, ready_node, monkeypatch):
    monkeypatch.setattr(nudge, "broker_problem", lambda: pytest.fail("asked the broker"))
    with broker("redis://127.0.0.1:1/0"):
        status, body = _ready(client)
    assert status == 200 and "broker" not in body["checks"]
