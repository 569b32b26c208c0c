"""urlguard.nodesync.registry: one read-only mapping per process, never raising into a request,
logged once per condition; a bounded-wait writer."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time

import pytest

from filterengine import ScalingCountingBloomFilter
from urlguard.nodesync import registry, sync


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
    with caplog.at_level(logging.WARNING, logger="urlguard.nodesync.registry"):
        assert registry.get_filter() is None
        monkeypatch.setattr(registry, "RETRY_SECONDS", 0.0)
        assert registry.get_filter() is None
        assert registry.get_filter() is None
    warnings = [r for r in caplog.records if r.name == "urlguard.nodesync.registry"]
    assert len(warnings) == 1
    assert "missing" in warnings[0].getMessage() and "rebuild_filter" in warnings[0].getMessage()


def test_recovers_when_the_file_appears(filter_path, caplog, monkeypatch):
    monkeypatch.setattr(registry, "RETRY_SECONDS", 0.0)
    assert registry.get_filter() is None
    build(filter_path, [("a.example/", 1)])
    with caplog.at_level(logging.INFO, logger="urlguard.nodesync.registry"):
        filt = registry.get_filter()
    assert filt is not None and "a.example/" in filt
    assert "readable again" in caplog.text


def test_retries_are_rate_limited(filter_path, monkeypatch):
    opens = []
    real_open = ScalingCountingBloomFilter.open

    def counting_open(*args, **kwargs):
        opens.append(args)
        return real_open(*args, **kwargs)

    real_stat = os.stat

    def counting_stat(*args, **kwargs):
        opens.append(args)
        return real_stat(*args, **kwargs)

    monkeypatch.setattr(ScalingCountingBloomFilter, "open", counting_open)
    monkeypatch.setattr(os, "stat", counting_stat)
    for _ in range(100):
        assert registry.get_filter() is None
    assert len(opens) == 1  # a missing filter costs a request a dict lookup, not a syscall


def test_corrupt_file_is_none_with_the_reason(filter_path, caplog):
    filter_path.write_bytes(b"this is not a filter file at all" * 10)
    with caplog.at_level(logging.WARNING, logger="urlguard.nodesync.registry"):
        assert registry.get_filter() is None
    assert "unreadable" in caplog.text and str(filter_path) in caplog.text


@pytest.mark.django_db
def test_a_rebuild_is_seen_without_reopening(filter_path, nudges):
    from urlguard.writepath import changes

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
    assert registry.mapped(str(filter_path)) is None
    build(filter_path)
    registry.open_at_startup()
    assert registry.mapped(str(filter_path)) is not None


# A reader process as a gunicorn worker has one: Django set up, the registry's
# mapping opened at start-up; it answers one line per key asked on stdin.
READER = textwrap.dedent("""
    import os, sys
    import django
    django.setup()
    from urlguard.nodesync import registry
    path = sys.argv[1]
    print("ready" if registry.mapped(path) is not None else "unmapped", flush=True)
    for line in sys.stdin:
        filt = registry.get_filter(path)
        print("none" if filt is None else ("yes" if line.strip() in filt else "no"), flush=True)
""")


# The bound is the registry's once-a-second check; the slack is for a loaded machine
# (bench/faults.py measures the real figure).
SLACK = 2.0


class Reader:
    def __init__(self, path):
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "urlguard_service.settings",
            "URLGUARD_VAR_DIR": str(path.parent),
            "URLGUARD_FILTER_PATH": str(path),
        }
        env.pop("DATABASE_URL", None)
        env.pop("CELERY_BROKER_URL", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", READER, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout.readline().strip() == "ready"

    def ask(self, key):
        self.proc.stdin.write(key + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def until(self, key, answer, timeout=5.0):
        """Seconds until the reader answers `answer` for `key` (asking every 10 ms)."""
        started = time.monotonic()
        while self.ask(key) != answer:
            assert time.monotonic() - started < timeout, f"{key}: never {answer}"
            time.sleep(0.01)
        return time.monotonic() - started

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()


@pytest.fixture
def reader(filter_path):
    build(filter_path, [("old.example/", 1)])
    proc = Reader(filter_path)
    assert proc.ask("old.example/") == "yes"
    yield proc
    proc.close()


def _rm(path):
    os.unlink(path)


def _mv_other_over(path):
    other = path.with_name("other.bin")
    build(other, [("other.example/", 1)])
    os.replace(other, path)


def _corrupt_magic(path):
    with open(path, "r+b") as f:
        f.write(b"XXXXXXXX")


@pytest.mark.parametrize("damage", [_rm, _mv_other_over, _corrupt_magic])
def test_a_reader_follows_whatever_is_at_the_path_within_a_second(reader, filter_path, damage):
    damage(filter_path)
    build(filter_path, [("old.example/", 1), ("new.example/", 2)], applied_seq=2)
    assert reader.until("new.example/", "yes") < registry.CHECK_SECONDS + SLACK
    assert reader.ask("old.example/") == "yes"


def test_a_reader_degrades_while_the_file_is_gone(reader, filter_path):
    os.unlink(filter_path)
    assert reader.until("old.example/", "none") < registry.CHECK_SECONDS + SLACK
    build(filter_path, [("new.example/", 2)])
    assert reader.until("new.example/", "yes") < registry.RETRY_SECONDS + SLACK


# A writer that dies in the middle of a change: it exits at a chosen point (no timing).
DIES_MID_CHANGE = textwrap.dedent("""
    import os, sys
    from filterengine import ScalingCountingBloomFilter
    f = ScalingCountingBloomFilter.open(sys.argv[1], readonly=False)
    with f.change():
        f.add("half.example/", 3)
        os._exit(9)
""")


def test_a_reader_degrades_on_a_dirty_file_and_maps_the_rebuilt_one(reader, filter_path):
    died = subprocess.run([sys.executable, "-c", DIES_MID_CHANGE, str(filter_path)])
    assert died.returncode == 9
    assert reader.until("old.example/", "none") < registry.CHECK_SECONDS + SLACK
    build(filter_path, [("old.example/", 1), ("half.example/", 3)], applied_seq=3)
    assert reader.until("half.example/", "yes") < registry.RETRY_SECONDS + SLACK


def test_a_live_writer_mid_change_is_not_dirty(filter_path):
    build(filter_path, [("old.example/", 1)])
    filt = registry.get_filter()
    with registry.writer() as w, w.change():
        w.add("new.example/", 2)
        assert not filt.is_clean
        registry._paths[str(filter_path)].next_check = 0.0  # the once-a-second check is due
        assert registry.get_filter() is filt
    assert registry.problem() == ""


def test_a_dirty_file_stays_degraded_while_a_writer_repairs_it(filter_path, monkeypatch):
    build(filter_path, [("old.example/", 1)])
    assert registry.get_filter() is not None
    died = subprocess.run([sys.executable, "-c", DIES_MID_CHANGE, str(filter_path)])
    assert died.returncode == 9
    monkeypatch.setattr(registry, "_torn", lambda path: False)  # whatever the format says
    registry._paths[str(filter_path)].next_check = 0.0
    assert registry.get_filter() is None and "dirty" in registry.problem()
    # The catch-up's writer now holds the lock while it rebuilds: still dirty.
    with registry.writer():
        registry._paths[str(filter_path)].retry_at = 0.0  # the retry is due
        assert registry.get_filter() is None
    build(filter_path, [("old.example/", 1)])  # the rebuild replaces it
    registry._paths[str(filter_path)].retry_at = 0.0
    assert registry.get_filter() is not None


def _held(path: str, identity: tuple[int, int]) -> list[str]:
    """The registry's module-level collections that still hold `path` or its file."""
    found = []
    for name, value in vars(registry).items():
        if not isinstance(value, (dict, set, list)):
            continue
        if any(item in (path, identity) for item in value):  # a dict's keys
            found.append(name)
    return found


@pytest.mark.parametrize("let_go", ["forget", "reset"])
def test_forget_and_reset_leave_nothing_of_a_path_behind(filter_path, monkeypatch, let_go):
    path = str(filter_path)
    monkeypatch.setattr(registry, "CHECK_SECONDS", 0.0)
    build(filter_path, [("old.example/", 1)])
    assert registry.get_filter() is not None  # mapped, its position remembered
    st = os.stat(path)
    died = subprocess.run([sys.executable, "-c", DIES_MID_CHANGE, path])
    assert died.returncode == 9
    monkeypatch.setattr(registry, "_torn", lambda path: False)  # the memory, not the format
    assert registry.get_filter() is None and "dirty" in registry.problem()
    assert _held(path, (st.st_dev, st.st_ino))  # while the process knows the path
    if let_go == "forget":
        registry.forget(path)
    else:
        registry.reset()
    assert _held(path, (st.st_dev, st.st_ino)) == []
