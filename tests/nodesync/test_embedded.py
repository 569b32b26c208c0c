"""urlguard.nodesync.embedded: without a broker, a serving process catches up by itself."""

from __future__ import annotations

import time

import pytest

from urlguard.nodesync import embedded, registry
from urlguard.writepath import changes


@pytest.mark.django_db(transaction=True)
def test_a_serving_process_catches_up_a_lost_change_without_a_broker(
    settings, client, filter_path, nudges
):
    # The nudge is lost (captured in `nudges`, never delivered).
    settings.URLGUARD = {**settings.URLGUARD, "CATCHUP_INTERVAL": 0.05}
    embedded.install()
    try:
        rule = changes.add_rule("lost.example.org", category="spam", source="test")
        time.sleep(0.2)
        assert registry.get_filter(str(filter_path)) is None  # nothing runs before a request
        client.get("/")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            filt = registry.get_filter(str(filter_path))
            if filt is not None and rule.expression in filt:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the embedded catch-up never applied the lost change")
    finally:
        embedded.stop()


@pytest.mark.django_db
def test_the_thread_starts_once_and_stops(settings, client):
    settings.URLGUARD = {**settings.URLGUARD, "CATCHUP_INTERVAL": 3600}
    embedded.install()
    try:
        client.get("/api/check?url=http://a.example/")
        first = embedded.upkeep.thread
        client.get("/api/check?url=http://a.example/")
        assert first is not None and first.is_alive() and embedded.upkeep.thread is first
    finally:
        embedded.stop()
    assert embedded.upkeep.thread is None and not first.is_alive()
