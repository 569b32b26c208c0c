"""A node whose exports fall behind says so: each export's headers carry its lag
behind the change log (and `Warning: 110` past EXPORT_MAX_LAG_SECONDS), /readyz names
the exports degraded with the reason (still 200: the guard answers right), /metrics has
the lag per export. With the database away, the newest complete render is served with
its own position and said to be stale (a 503 only where none is kept)."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.db import OperationalError
from django.test import Client
from django.utils import timezone

from tests.support.fullfs import fill, small_filesystem  # noqa: F401  (a fixture)
from tests.support.metrics import scrape, value
from urlguard.exports import prerender, render
from urlguard.models import ChangeEvent
from urlguard.operations import apikeys
from urlguard.writepath.changes import add_rule, add_rules

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def exports_only(monkeypatch):
    """The round's other projections (the Safe Browsing lists) are not the exports'."""
    monkeypatch.setattr(prerender, "AFTER_RENDERS", [])


@pytest.fixture
def key() -> str:
    return apikeys.create_api_key("pihole")[1]


@pytest.fixture
def get(key):
    client = Client()

    def get(name: str, **headers):
        headers.setdefault("HTTP_AUTHORIZATION", f"Bearer {key}")
        response = client.get(f"/lists/{name}", **headers)
        response.body = (
            b"".join(response.streaming_content).decode()
            if response.streaming
            else response.content.decode()
        )
        return response

    return get


def only(settings, *names: str, **values) -> None:
    settings.URLGUARD = {**settings.URLGUARD, "EXPORTS_PRERENDER": list(names), **values}


def age_the_log(seconds: float) -> None:
    """The changes logged so far, as if logged `seconds` ago."""
    ChangeEvent.objects.update(created=timezone.now() - timedelta(seconds=seconds))


def readyz() -> dict:
    response = Client().get("/readyz")
    assert response.status_code == 200
    return response.json()


def test_a_current_export_says_it_lags_by_nothing(settings, get, build_filter):
    only(settings, "hosts.txt")
    add_rule("evil.example/", category="spam", source="test")
    build_filter()
    prerender.render_all()
    response = get("hosts.txt")
    assert response.status_code == 200
    assert response["X-URLGuard-Lag-Changes"] == "0"
    assert response["X-URLGuard-Lag-Seconds"] == "0"
    assert not response.has_header("Warning") and not response.has_header("X-URLGuard-Stale")
    assert readyz()["degraded"] == []


def test_an_export_behind_by_a_full_disk_says_so_everywhere(
    settings,
    get,
    build_filter,
    small_filesystem,  # noqa: F811  (the imported fixture)
    caplog,
):
    data = small_filesystem(256 * 1024)
    only(settings, "hosts.txt", DATA_DIR=str(data))
    add_rules([f"host{i}.example/" for i in range(1000)], source="test")
    prerender.render_all()
    before = get("hosts.txt")
    fill(data)
    add_rule("new.example/", category="spam", source="test")
    build_filter()  # the filter is current (on another disk): the node is ready
    with pytest.raises(prerender.PrerenderFailed, match="No space left on device"):
        prerender.render_all()
    # Behind, but not for long yet: the headers say how far, nothing is stale.
    during = get("hosts.txt")
    assert during["X-URLGuard-Position"] == before["X-URLGuard-Position"]
    assert during["X-URLGuard-Lag-Changes"] == "1" and not during.has_header("Warning")
    assert readyz()["degraded"] == []

    age_the_log(3600)
    stale = get("hosts.txt")
    assert stale.status_code == 200 and stale.body == before.body
    assert stale["X-URLGuard-Lag-Changes"] == "1"
    assert int(stale["X-URLGuard-Lag-Seconds"]) >= 3600
    assert stale["Warning"] == '110 urlguard "Response is Stale"'
    assert stale["X-URLGuard-Stale"].startswith("1 change(s) behind the change log")
    with caplog.at_level(logging.WARNING, "urlguard.operations.health"):
        answer = readyz()
        readyz()
    assert answer["ready"] is True and answer["degraded"] == ["exports"]
    error = answer["checks"]["exports"]["error"]
    assert error.startswith("hosts.txt is 1 change(s) behind the change log, the oldest 36")
    assert f"bytes free in {data}" in error
    assert answer["checks"]["exports"]["exports"]["hosts.txt"]["changes"] == 1
    # Said once in the log, not per probe.
    assert len([r for r in caplog.records if "is degraded" in r.getMessage()]) == 1
    # Outside the metrics networks, the names only.
    outside = Client().get("/readyz", REMOTE_ADDR="203.0.113.9").json()
    assert outside == {"ready": True, "failed": [], "degraded": ["exports"]}
    samples = scrape(Client())
    assert value(samples, "urlguard_export_lag_changes", export="hosts.txt") == 1
    assert value(samples, "urlguard_export_lag_seconds", export="hosts.txt") >= 3600
    assert value(samples, "urlguard_export_render_bytes", export="hosts.txt") > 20_000
    assert value(samples, "urlguard_ready_check", check="exports") == 0

    (data / "ballast").unlink()  # the operator makes room
    prerender.render_all()
    after = get("hosts.txt")
    assert "new.example" in after.body and after["X-URLGuard-Lag-Changes"] == "0"
    assert not after.has_header("Warning")
    assert readyz()["degraded"] == []


def test_with_the_database_away_the_newest_render_is_served_and_said_stale(
    settings, get, key, database_fails, caplog
):
    only(settings, "hosts.txt", "abp.txt")
    add_rule("evil.example/", category="spam", source="test")
    prerender.render_all()
    before = get("hosts.txt")
    abp = get("abp.txt")
    diff_path = next(x for x in abp.body.splitlines() if x.startswith("! Diff-Path: "))
    database_fails(OperationalError("connection refused"))
    caplog.set_level(logging.ERROR, "django.request")
    with caplog.at_level(logging.ERROR, "urlguard.exports.views"):
        responses = [get("hosts.txt") for _ in range(5)]
    for during in responses:
        assert during.status_code == 200 and during.body == before.body
        assert during["X-URLGuard-Position"] == before["X-URLGuard-Position"]
        assert during["ETag"] == before["ETag"]
        assert during["Warning"] == '110 urlguard "Response is Stale"'
        assert "database cannot be reached" in during["X-URLGuard-Stale"]
    assert len([r for r in caplog.records if r.name == "urlguard.exports.views"]) == 1
    # A consumer holding it gets its 304; the ABP patch from it is empty.
    assert get("hosts.txt", HTTP_IF_NONE_MATCH=before["ETag"]).status_code == 304
    patch = get(diff_path.split(": ", 1)[1])
    assert patch.status_code == 200 and patch.body == ""
    # No render kept of a list: nothing to serve.
    missing = get("domains.txt")
    assert missing.status_code == 503 and missing["Retry-After"] == "30"
    assert "keeps no render of domains.txt" in missing.body
    # A key this process never saw cannot be looked up: 503, not a wrong 401.
    other = get("hosts.txt", HTTP_AUTHORIZATION="Bearer ugk_never-seen")
    assert other.status_code == 503 and "no key can be looked up" in other.body
    # The outage's 503s are logged once a minute above, not each by django.request.
    assert not [r for r in caplog.records if r.name == "django.request"]


def test_with_the_database_away_an_open_list_is_served_stale_too(settings, database_fails):
    only(settings, "hosts.txt", EXPORTS_OPEN=True)
    add_rule("evil.example/", category="spam", source="test")
    prerender.render_all()
    database_fails(OperationalError("connection refused"))
    response = Client().get("/lists/hosts.txt")
    assert response.status_code == 200 and response.has_header("X-URLGuard-Stale")
    assert b"evil.example" in b"".join(response.streaming_content)
    assert render.newest(render.export_dir("hosts.txt")) is not None


def test_a_list_rendered_on_demand_whose_render_loses_the_database_is_served_stale(
    settings, get, monkeypatch
):
    only(settings)  # none pre-rendered: the first poll of a position renders it
    add_rule("evil.example/", category="spam", source="test")
    before = get("domains.txt")
    add_rule("new.example/", category="spam", source="test")
    lost = OperationalError("server closed the connection unexpectedly")
    monkeypatch.setattr(render, "render", lambda *a: (_ for _ in ()).throw(lost))
    during = get("domains.txt")
    assert during.status_code == 200 and during.body == before.body
    assert during["X-URLGuard-Position"] == before["X-URLGuard-Position"]
    assert "database cannot be reached" in during["X-URLGuard-Stale"]
