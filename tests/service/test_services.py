"""The change path on real services: PostgreSQL, Redis and a Celery worker process
(the node), with a read-only filter in this process (a web worker of the same node).

Run by `make test-live` (DATABASE_URL and CELERY_BROKER_URL set). The worker uses
the test database pytest-django creates, so the tests use committed transactions."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from django.db import connections

from tests.support.services import LIVE, Worker, reachable, unavailable, wait_for
from urlguard.models import ChangeEvent, NodeStatus, SpamRule
from urlguard.nodesync import registry, sync, tasks
from urlguard.writepath import changes

pytestmark = LIVE


def applied_seq(path) -> int:
    filt = registry.get_filter(str(path))
    return -1 if filt is None else filt.applied_seq


def test_a_worker_with_a_wrong_setting_refuses_to_start(tmp_path, filter_path):
    # Celery runs the system checks itself but carries on whatever they find.
    worker = Worker(
        filter_path,
        tmp_path / "refused.log",
        env={"DJANGO_SECRET_KEY": "short", "DJANGO_DEBUG": "0"},
    )
    try:
        assert worker.proc.wait(timeout=60) == 1
    finally:
        worker.stop()
    text = worker.log.read_text()
    assert "not starting" in text and "urlguard.E100" in text, text[-3000:]
    assert " ready." not in text
    assert not filter_path.exists()  # no boot-time catch-up built a file


def test_add_and_remove_reach_the_reader_through_the_worker(start_worker, filter_path):
    worker = start_worker()
    # The worker's boot-time catch-up built the (empty) file.
    wait_for(lambda: filter_path.exists(), what="the boot-time build", log=worker.log)
    rule = changes.add_rule("https://evil.example.org/login", category="phishing")
    wait_for(
        lambda: rule.expression in (registry.get_filter() or ()),
        what="the worker to apply the addition",
        log=worker.log,
    )
    changes.remove_rule(rule)
    head = sync.log_head()
    wait_for(lambda: applied_seq(filter_path) >= head, what="the removal", log=worker.log)
    filt = registry.get_filter()
    assert sum(s["count"] for s in filt.info()["stages"]) == 0
    # is_clean is False for the instant between the worker's change and its flush.
    wait_for(lambda: filt.is_clean, what="the worker to flush", log=worker.log)
    wait_for(
        lambda: NodeStatus.objects.filter(node=worker.node, applied_seq=head).exists(),
        what="the node's status report",
        log=worker.log,
    )


def test_every_node_gets_every_change(start_worker, tmp_path):
    """Two nodes, each with its own file and worker: one broadcast nudge reaches both."""
    paths = [tmp_path / "node-a" / "filter.bin", tmp_path / "node-b" / "filter.bin"]
    workers = [start_worker(path) for path in paths]
    for path, worker in zip(paths, workers, strict=True):
        wait_for(path.exists, what=f"{path} built at boot", log=worker.log)
    rule = changes.add_rule("everywhere.example.org", category="malware")
    for path, worker in zip(paths, workers, strict=True):
        wait_for(
            lambda p=path: rule.expression in (registry.get_filter(str(p)) or ()),
            what=f"{path} to get the rule",
            log=worker.log,
        )
    head = sync.log_head()
    wait_for(
        lambda: (
            set(NodeStatus.objects.filter(applied_seq=head).values_list("node", flat=True))
            >= {w.node for w in workers}
        ),
        what="both nodes to report",
    )


def test_missed_messages_are_caught_up_at_boot_and_by_beat(start_worker, filter_path, nudges):
    # Every nudge is lost (captured in `nudges`, never delivered).
    before = changes.add_rule("before-boot.example.org", category="spam")
    worker = start_worker(catchup_interval=1.0)
    wait_for(
        lambda: before.expression in (registry.get_filter() or ()),
        what="the boot-time catch-up",
        log=worker.log,
    )
    during = changes.add_rule("while-up.example.org", category="spam")
    wait_for(
        lambda: during.expression in (registry.get_filter() or ()),
        timeout=10,
        what="the periodic (beat) catch-up",
        log=worker.log,
    )
    assert "catch_up" in worker.log.read_text()


def test_duplicate_nudges_do_not_double_count(start_worker, filter_path):
    worker = start_worker()
    wait_for(lambda: filter_path.exists(), what="the boot-time build", log=worker.log)
    rule = changes.add_rule("dup.example.org", category="spam")
    seq = sync.log_head()
    for _ in range(3):  # redelivered, and an old one late
        tasks.apply_changes.apply_async(kwargs={"up_to_seq": seq})
    tasks.apply_changes.apply_async(kwargs={"up_to_seq": 1})
    wait_for(lambda: rule.expression in (registry.get_filter() or ()), log=worker.log)
    time.sleep(0.5)
    assert sum(s["count"] for s in registry.get_filter().info()["stages"]) == 1


def test_postgres_commits_change_events_in_seq_order():
    """Writers are serialized, so a reader never sees a seq commit below one it has
    already seen (which would make a node skip it forever)."""
    stop = threading.Event()
    violations: list[str] = []
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(15):
                changes.add_rule(f"w{n}-{i}.example.org", category="spam")
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    def reader() -> None:
        seen: set[int] = set()
        high = 0
        try:
            while not stop.is_set():
                now = set(ChangeEvent.objects.values_list("seq", flat=True))
                late = {s for s in now - seen if s < high}
                if late:
                    violations.append(f"seq {sorted(late)} appeared after seq {high}")
                seen, high = now, max(now, default=0)
        finally:
            connections.close_all()

    watcher = threading.Thread(target=reader)
    watcher.start()
    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watcher.join()
    assert not errors, errors
    assert violations == []
    assert ChangeEvent.objects.count() == 60


def test_rebuilds_under_concurrent_writes_count_every_rule_once(filter_path, nudges, monkeypatch):
    """A rebuild reads the table and max(seq) in one snapshot (REPEATABLE READ), then
    replays the log after it: with writers committing throughout, the file ends
    with every rule exactly once (a double-applied add would show in the count)."""
    changes.add_rules([f"base{i}.example.org" for i in range(2000)], source="test")
    stream = sync._stream_rules

    def slow_stream(using):
        # Writers commit between reading max(seq) and reading the rows: only a
        # snapshot keeps those commits out of the rows (the replay adds them).
        time.sleep(0.2)
        yield from stream(using)

    monkeypatch.setattr(sync, "_stream_rules", slow_stream)
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            i = 0
            while not stop.is_set():
                rule = changes.add_rule(f"c{n}-{i}.example.org", category="spam")
                if i % 3 == 0:
                    changes.remove_rule(rule)
                i += 1
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    try:
        for _ in range(4):
            sync.sync(path=str(filter_path), force_rebuild="test")
            # Never "the file disagrees with the log" (a removal it cannot honour).
            assert sync.sync(path=str(filter_path)).rebuilt == ""
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors
    sync.sync(path=str(filter_path))
    filt = registry.get_filter(str(filter_path))
    live = list(SpamRule.objects.values_list("expression", flat=True))
    assert filt.applied_seq == sync.log_head()
    assert filt.count == len(live) > 2000
    assert filt.contains_many(live).all()


class PrivateRedis:
    """A redis-server of this test's own, to stop and start again (the shared one is
    never stopped: other people's tests run against it)."""

    PORT = 18310

    def __init__(self, log: Path) -> None:
        self.proc: subprocess.Popen | None = None
        self.url = f"redis://127.0.0.1:{self.PORT}/0"
        self.log = log

    def start(self) -> None:
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen(
                ["redis-server", "--port", str(self.PORT), "--bind", "127.0.0.1", "--save", ""]
                + ["--appendonly", "no", "--dir", str(self.log.parent)],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 10
        while reachable(self.url, self.PORT):
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


@pytest.fixture
def private_redis(tmp_path):
    if not shutil.which("redis-server"):
        unavailable("needs redis-server on PATH for a broker of its own")
    redis = PrivateRedis(tmp_path / "redis.log")
    redis.start()
    yield redis
    redis.stop()


def test_a_worker_catches_up_as_soon_as_its_broker_is_back(
    start_worker, filter_path, private_redis
):
    worker = start_worker(broker_url=private_redis.url, catchup_interval=3600)
    wait_for(lambda: filter_path.exists(), what="the boot-time build", log=worker.log)
    private_redis.stop()
    # Committed while the node's broker is away: its nudge never reaches the node.
    rule = changes.add_rule("outage.example.org", category="spam")
    private_redis.start()
    back = time.monotonic()
    try:
        wait_for(
            lambda: "broker-reconnect catch-up" in worker.log.read_text(),
            timeout=40,
            what="the catch-up after the reconnect",
            log=worker.log,
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nredis-server:\n{private_redis.log.read_text()}") from None
    # Celery's reconnect back-off, not CATCHUP_INTERVAL (an hour here).
    assert time.monotonic() - back < 35
    assert rule.expression in registry.get_filter(), private_redis.log.read_text()


def _holds(path: Path, expression: str) -> bool:
    """The file at `path` now (not this process's mapping) holds `expression`."""
    from filterengine import ScalingCountingBloomFilter

    try:
        with ScalingCountingBloomFilter.open(str(path), readonly=True) as f:
            return expression in f
    except (OSError, ValueError):
        return False


def test_a_backup_moved_over_the_file_is_caught_up_by_the_worker_at_once(
    start_worker, filter_path, tmp_path
):
    # Beat's catch-up far away: what catches the file up is the worker's watch.
    worker = start_worker(catchup_interval=600)
    first = changes.add_rule("first.example.org", category="spam")
    wait_for(lambda: _holds(filter_path, first.expression), log=worker.log)
    backup = tmp_path / "backup.bin"
    subprocess.run(["cp", str(filter_path), str(backup)], check=True)
    later = changes.add_rule("later.example.org", category="spam")
    wait_for(lambda: _holds(filter_path, later.expression), log=worker.log)
    assert registry.get_filter() is not None  # this process maps the current file
    subprocess.run(["mv", str(backup), str(filter_path)], check=True)
    assert not _holds(filter_path, later.expression)
    started = time.monotonic()
    wait_for(
        lambda: _holds(filter_path, later.expression),
        timeout=10,
        what="the worker's watch to catch the backup up",
        log=worker.log,
    )
    assert time.monotonic() - started < 5
    wait_for(lambda: later.expression in (registry.get_filter() or ()), log=worker.log)
