"""Without prometheus_client (the `metrics` extra not installed) the guard counts
nothing and says so at /metrics, instead of failing to import."""

from __future__ import annotations

import pytest

from urlguard.runtime import metrics


@pytest.fixture
def no_prometheus(monkeypatch):
    monkeypatch.setattr(metrics, "HAVE_PROMETHEUS", False)
    # This process's real metrics stay registered; these stand in for the test.
    with metrics.registered.use(None), metrics.tally.use(metrics.CheckTally()):
        yield


def test_recording_counts_nothing_and_raises_nothing(no_prometheus):
    metrics.warned("rule")
    metrics.continued()
    metrics.changes_applied(3)
    metrics.stats_written("clicks", 2)
    metrics.tally.get().counts[0] += 5
    metrics.flush()
    assert isinstance(metrics.registered.get(), metrics._Uncounted)


def test_the_metrics_page_says_what_to_install(no_prometheus, client):
    response = client.get("/metrics")
    assert response.status_code == 501
    assert "urlguard[metrics]" in response.json()["error"]
