"""The change path on real services: PostgreSQL, Redis and a Celery worker process
(the node), with a read-only filter in this process (a web worker of the same node).

Run by `make test-live` (DATABASE_URL and CELERY_BROKER_URL set). The worker uses
the test database pytest-django creates, so the tests use committed transactions."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest
from django.conf import settings as django_settings
from django.db import connection, connections

from urlguard.conf import conf
from urlguard.models import ChangeEvent, NodeStatus, SpamRule
from urlguard.nodesync import registry, sync, tasks
from urlguard.writepath import changes

ROOT = Path(__file__).resolve().parents[2]


def _reachable(url: str, default_port: int) -> str:
    parts = urlparse(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or default_port
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError as exc:
        return f"{host}:{port} unreachable ({exc})"
    return ""


def _skip_reason() -> str:
    db = django_settings.DATABASES["default"]
    if db["ENGINE"] != "django.db.backends.postgresql":
        return (
            "needs PostgreSQL: run `make test-live` (DATABASE_URL=postgres://"
            "postgres@127.0.0.1:5432/urlguard)"
        )
    broker = django_settings.CELERY_BROKER_URL
    if not broker.startswith("redis://"):
        return "needs CELERY_BROKER_URL=redis://127.0.0.1:6379/15 (`make test-live`)"
    problems = [
        p
        for p in (
            _reachable(f"postgres://{db['HOST']}:{db['PORT'] or 5432}", 5432),
            _reachable(broker, 6379),
        )
        if p
    ]
    return "; ".join(problems)


# Decided before any fixture runs: with PostgreSQL down, creating the test database
# would fail instead of skipping.
_SKIP = _skip_reason()
# Under CI a live test that cannot reach its services fails instead: a green run
# with the several-node tests skipped would prove nothing (.ci/run starts them).
_MUST_RUN = bool(os.environ.get("CI"))
pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(bool(_SKIP) and not _MUST_RUN, reason=_SKIP),
    pytest.mark.django_db(transaction=True),
]


def unavailable(reason: str) -> None:
    """Skip for `reason`, or under CI fail for it."""
    if _MUST_RUN:
        pytest.fail(f"{reason} (CI is set: live tests must run, not skip)")
    pytest.skip(reason)


@pytest.fixture(autouse=True)
def services_available():
    """Also skips in modules that import it with the worker fixtures (here the
    pytestmark skips first, before the test database would be created)."""
    if _SKIP:
        unavailable(_SKIP)


_WORKER_SECRET_KEY = secrets.token_urlsafe(50)


class Worker:
    """A real `celery worker -B` process: one node, using this test's filter file."""

    def __init__(
        self,
        filter_path: Path,
        log: Path,
        *,
        catchup_interval: float = 60,
        broker_url: str | None = None,
        env: dict[str, str] | None = None,
    ):
        db = connection.settings_dict
        self.node = f"node-{uuid.uuid4().hex[:8]}"
        self.log = log
        environment = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.support.services_settings",
            "DATABASE_URL": (
                f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"
            ),  # the test database
            "CELERY_BROKER_URL": broker_url or django_settings.CELERY_BROKER_URL,
            "URLGUARD_FILTER_PATH": str(filter_path),
            "URLGUARD_NODE_NAME": self.node,
            "URLGUARD_CATCHUP_INTERVAL": str(catchup_interval),
            # A worker refuses the shipped default key off the embedded demo, as
            # gunicorn does.
            "DJANGO_SECRET_KEY": _WORKER_SECRET_KEY,
            **(env or {}),
        }
        queue = conf.BROADCAST_QUEUE
        self._out = open(log, "w")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "urlguard_service",
                "worker",
                "-B",
                "-Q",
                f"{queue},celery",
                "--pool",
                "solo",
                "--loglevel",
                "INFO",
                "--hostname",
                f"{self.node}@%h",
                "--schedule",
                str(log.with_suffix(".beat")),
                "--without-gossip",
                "--without-mingle",
            ],
            cwd=ROOT,
            env=environment,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log.read_text(errors="replace")
            if " ready." in text:
                # Redis fanout is pub/sub: a moment for the subscription to be live.
                time.sleep(0.3)
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"celery worker did not start:\n{self.log.read_text()[-4000:]}")

    def stop(self) -> None:
        # The whole group, even when the worker itself is gone: a worker killed by a test
        # leaves its beat child running, adopted by PID 1.
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=5)
        self._out.close()


@pytest.fixture
def start_worker(tmp_path, filter_path):
    workers: list[Worker] = []

    def start(path: Path | None = None, **kwargs) -> Worker:
        worker = Worker(path or filter_path, tmp_path / f"worker{len(workers)}.log", **kwargs)
        workers.append(worker)
        worker.wait_ready()
        return worker

    yield start
    for worker in workers:
        worker.stop()


def wait_for(predicate, timeout: float = 15, what: str = "condition", log: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    tail = log.read_text()[-3000:] if log else ""
    raise AssertionError(f"timed out waiting for {what}\n{tail}")


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
        while _reachable(self.url, self.PORT):
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
