"""The live services a test runs against (PostgreSQL, Redis) and the Celery worker it
starts: `LIVE` is the pytestmark of a module of live tests (the fixtures here reach the
tests through tests/support/fixtures.py). Under CI, a live test that cannot reach its
services fails instead of skipping."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest
from django.conf import settings as django_settings
from django.db import connection

from urlguard.conf import conf

ROOT = Path(__file__).resolve().parents[2]


def reachable(url: str, default_port: int) -> str:
    parts = urlparse(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or default_port
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError as exc:
        return f"{host}:{port} unreachable ({exc})"
    return ""


def skip_reason() -> str:
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
            reachable(f"postgres://{db['HOST']}:{db['PORT'] or 5432}", 5432),
            reachable(broker, 6379),
        )
        if p
    ]
    return "; ".join(problems)


# Decided before any fixture runs: with PostgreSQL down, creating the test database
# would fail instead of skipping.
SKIP = skip_reason()
# Under CI a live test that cannot reach its services fails instead: a green run
# with the several-node tests skipped would prove nothing (.ci/run starts them).
MUST_RUN = bool(os.environ.get("CI"))
LIVE = [
    pytest.mark.live,
    pytest.mark.usefixtures("services_available"),
    pytest.mark.skipif(bool(SKIP) and not MUST_RUN, reason=SKIP),
    pytest.mark.django_db(transaction=True),
]


def live(test):
    """LIVE's marks on one test, in a module whose other tests need no services."""
    for mark in LIVE:
        test = mark(test)
    return test


def unavailable(reason: str) -> None:
    """Skip for `reason`, or under CI fail for it."""
    if MUST_RUN:
        pytest.fail(f"{reason} (CI is set: live tests must run, not skip)")
    pytest.skip(reason)


@pytest.fixture
def services_available():
    """Skips, or under CI fails, a test whose services are down (LIVE uses it; its
    skipif skips first, before the test database would be created)."""
    if SKIP:
        unavailable(SKIP)


WORKER_SECRET_KEY = secrets.token_urlsafe(50)


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
            "DJANGO_SECRET_KEY": WORKER_SECRET_KEY,
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
