"""Without prometheus_client (the `metrics` extra not installed) the guard counts
nothing and says so at /metrics, instead of failing to import."""

from __future__ import annotations

import pytest

from urlguard.runtime import metrics


@pytest.fixture
def no_prometheus(monkeypatch):
    monkeypatch.setattr(metrics, "HAVE_PROMETHEUS", False)
    monkeypatch.setattr(metrics, "_metrics", None)
    monkeypatch.setattr(metrics, "_tally", metrics.CheckTally())


def test_recording_counts_nothing_and_raises_nothing(no_prometheus):
    metrics.warned("rule")
    metrics.continued()
    metrics.changes_applied(3)
    metrics.stats_written("clicks", 2)
    metrics._tally.counts[0] += 5
    metrics.flush()
    assert isinstance(metrics._metrics, metrics._Uncounted)


def test_the_metrics_page_says_what_to_install(no_prometheus, client):
    response = client.get("/metrics")
    assert response.status_code == 501
    assert "urlguard[metrics]" in response.json()["error"]
