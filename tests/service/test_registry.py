"""urlguard.registry: one read-only mapping per process, never raising into a request,
logged once per condition; a bounded-wait writer."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import time

import pytest

from filterengine import ScalingCountingBloomFilter
from urlguard import registry, sync


def build(path, pairs=(), applied_seq=0):
    ScalingCountingBloomFilter.build(
        str(path), list(pairs), capacity=100_000, error_rate=0.01, applied_seq=applied_seq
    )


def test_opened_once_and_shared(filter_path):
    build(filter_path, [("a.example/", 1)])
    first = registry.get_filter()
    assert first is not None and first.readonly
    assert registry.get_filter() is first
    assert registry.get_filter(str(filter_path)) is first
    assert "a.example/" in first


def test_missing_file_is_none_and_logged_once(filter_path, caplog, monkeypatch):
    with caplog.at_level(logging.WARNING, logger="urlguard.registry"):
        assert registry.get_filter() is None
        monkeypatch.setattr(registry, "RETRY_SECONDS", 0.0)
        assert registry.get_filter() is None
        assert registry.get_filter() is None
    warnings = [r for r in caplog.records if r.name == "urlguard.registry"]
    assert len(warnings) == 1
    assert "missing" in warnings[0].getMessage() and "rebuild_filter" in warnings[0].getMessage()


def test_recovers_when_the_file_appears(filter_path, caplog, monkeypatch):
    monkeypatch.setattr(registry, "RETRY_SECONDS", 0.0)
    assert registry.get_filter() is None
    build(filter_path, [("a.example/", 1)])
    with caplog.at_level(logging.INFO, logger="urlguard.registry"):
        filt = registry.get_filter()
    assert filt is not None and "a.example/" in filt
    assert "readable again" in caplog.text


def test_retries_are_rate_limited(filter_path, monkeypatch):
    opens = []
    real_open = ScalingCountingBloomFilter.open

    def counting_open(*args, **kwargs):
        opens.append(args)
        return real_open(*args, **kwargs)

    monkeypatch.setattr(ScalingCountingBloomFilter, "open", counting_open)
    for _ in range(100):
        assert registry.get_filter() is None
    assert len(opens) == 1  # a missing filter costs a request a dict lookup, not a syscall


def test_corrupt_file_is_none_with_the_reason(filter_path, caplog):
    filter_path.write_bytes(b"this is not a filter file at all" * 10)
    with caplog.at_level(logging.WARNING, logger="urlguard.registry"):
        assert registry.get_filter() is None
    assert "unreadable" in caplog.text and str(filter_path) in caplog.text


@pytest.mark.django_db
def test_a_rebuild_is_seen_without_reopening(filter_path, monkeypatch):
    from urlguard import changes

    monkeypatch.setattr(changes, "_nudge", lambda seq: None)
    sync.rebuild(str(filter_path))
    filt = registry.get_filter()
    rule = changes.add_rule("new.example.org", category="spam")
    assert rule.expression not in filt
    sync.rebuild(str(filter_path))  # a new file replaces the old one
    assert registry.get_filter() is filt
    assert rule.expression in filt


def test_writer_changes_are_visible_to_the_reader(filter_path):
    build(filter_path)
    filt = registry.get_filter()
    with registry.writer() as w, w.change():
        w.add("x.example/", 5)
        w.applied_seq = 1
    assert "x.example/" in filt and filt.applied_seq == 1


def test_writer_waits_a_bounded_time(filter_path):
    build(filter_path)
    with registry.writer():
        started = time.monotonic()
        with (
            pytest.raises(registry.WriterBusy, match=str(filter_path)),
            registry.writer(timeout=0.3),
        ):
            pass
        assert 0.25 < time.monotonic() - started < 3


def test_writer_gets_the_lock_when_the_other_process_lets_go(filter_path):
    build(filter_path)
    code = textwrap.dedent(f"""
        import sys, time
        from filterengine import ScalingCountingBloomFilter
        f = ScalingCountingBloomFilter.open({str(filter_path)!r}, readonly=False)
        print("locked", flush=True)
        time.sleep(0.5)
        f.close()
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        started = time.monotonic()
        with registry.writer(timeout=10) as w:
            waited = time.monotonic() - started
            assert not w.readonly
        assert 0.2 < waited < 5
    finally:
        proc.wait(timeout=10)
        proc.stdout.close()


def test_open_at_startup_maps_an_existing_file_only(filter_path, caplog):
    with caplog.at_level(logging.WARNING, logger="urlguard"):
        registry.open_at_startup()
    # A missing file is the system check's news (W001), not a start-up log line.
    assert [r for r in caplog.records if r.name.startswith("urlguard")] == []
    assert registry._filters == {}
    build(filter_path)
    registry.open_at_startup()
    assert str(filter_path) in registry._filters
