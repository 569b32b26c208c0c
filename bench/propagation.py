"""Benchmark: propagation — from `add_rule` committing to the rule being blocked by a
web worker (another process, read-only filter, Guard.check) on the same node, with
the Celery worker on Redis applying the change. Target: p95 under 1 s.

Starts its own PostgreSQL database (urlguard_bench_propagation), a real
`celery -A urlguard_service worker -Q <broadcast>,celery` and a reader process, then adds
--samples rules one after the other. Beside the full path, in the same run: the
same measurement with the nudge applied in-process (the embedded default's path)
and the time a catch-up needs when the message is lost (bounded by beat's
CATCHUP_INTERVAL: shown, not waited for).

    .venv/bin/python bench/propagation.py [--samples 200] [--rules 10000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def reader(conn, env: dict) -> None:
    """A web worker of the node: read-only filter from the registry, Guard.check."""
    os.environ.update(env)
    import django

    django.setup()
    from urlguard.hotpath.guard import get_guard

    guard = get_guard()
    conn.send("ready")
    while True:
        url = conn.recv()
        if url is None:
            return
        deadline = time.monotonic() + 10
        while True:
            verdict = guard.check(url)
            if verdict.blocked:
                conn.send(time.monotonic())  # CLOCK_MONOTONIC: one clock for the machine
                break
            if time.monotonic() > deadline:
                conn.send(None)
                break
            time.sleep(0.0005)


def percentiles(values: list[float]) -> tuple[float, float, float]:
    values = sorted(values)
    p95 = values[min(len(values) - 1, int(round(0.95 * (len(values) - 1))))]
    return statistics.median(values), p95, values[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--rules", type=int, default=10_000, help="rules listed beforehand")
    parser.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--db", default="urlguard_bench_propagation")
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/14")
    args = parser.parse_args()

    import psycopg

    with psycopg.connect(f"{args.pg}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{args.db}"')
    var = Path(tempfile.mkdtemp(prefix="urlguard-bench-propagation-"))
    env = {
        "DATABASE_URL": f"{args.pg}/{args.db}",
        "URLGUARD_VAR_DIR": str(var),
        "DJANGO_SETTINGS_MODULE": "urlguard_service.settings",
        "CELERY_BROKER_URL": args.broker,
    }
    os.environ.update(env)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import transaction

    from urlguard.nodesync import sync
    from urlguard.writepath import changes

    call_command("migrate", verbosity=0)
    changes.add_rules([f"pre{i}.example{i % 89}.com" for i in range(args.rules)], source="bench")
    sync.rebuild()

    log = open(var / "worker.log", "w")  # noqa: SIM115
    from urlguard.conf import conf

    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "urlguard_service",
            "worker",
            "-B",
            "-Q",
            f"{conf.BROADCAST_QUEUE},celery",
            "--concurrency",
            "1",
            "--loglevel",
            "WARNING",
            "--schedule",
            str(var / "beat"),
            "--without-gossip",
            "--without-mingle",
        ],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=reader, args=(there, env))
    try:
        proc.start()
        assert here.recv() == "ready"
        wait_worker(var / "worker.log", worker)

        def sample(i: int, prefix: str) -> float | None:
            stamp: list[float] = []
            text = f"https://{prefix}{i}.example.net/"
            with transaction.atomic():
                # Registered first, so it runs right at the commit, before the nudge.
                transaction.on_commit(lambda: stamp.append(time.monotonic()))
                changes.add_rule(text, category="spam", source="bench")
            here.send(f"https://{prefix}{i}.example.net/some/page.html?q=1")
            blocked_at = here.recv()
            return None if blocked_at is None else blocked_at - stamp[0]

        for i in range(5):  # warm-up: connections, imports, first stage pages
            sample(i, "warm")
        redis_times = [sample(i, "r") for i in range(args.samples)]
    finally:
        here.send(None)
        proc.join(timeout=10)
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=20)
        log.close()

    # The embedded default: the nudge runs in-process at commit.
    from urlguard_service.celery import app

    app.conf.task_always_eager = True
    proc = ctx.Process(target=reader, args=(there, env))
    try:
        proc.start()
        assert here.recv() == "ready"
        eager_times = [sample(i, "e") for i in range(args.samples)]
    finally:
        here.send(None)
        proc.join(timeout=10)

    from django.db import connection

    connection.close()
    shutil.rmtree(var, ignore_errors=True)
    with psycopg.connect(f"{args.pg}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')

    print()
    print(
        f"propagation: add_rule commit -> blocked by Guard.check in another process "
        f"({args.samples} samples, {args.rules:,} rules listed before)"
    )
    print()
    print(f"| {'path':<58} | {'p50 ms':>7} | {'p95 ms':>7} | {'max ms':>7} | lost |")
    print(f"|{'-' * 60}|{'-' * 9}|{'-' * 9}|{'-' * 9}|------|")
    for name, times in (
        ("Redis broadcast -> celery worker (prefork, 1 process)", redis_times),
        ("in-process nudge (embedded default, CELERY eager)", eager_times),
    ):
        ok = [t for t in times if t is not None]
        p50, p95, worst = percentiles(ok)
        print(
            f"| {name:<58} | {p50 * 1e3:>7.1f} | {p95 * 1e3:>7.1f} | {worst * 1e3:>7.1f} | "
            f"{len(times) - len(ok):>4} |"
        )
    print(
        f"| {'lost message -> periodic catch-up (at most)':<58} | "
        f"{'':>7} | {'':>7} | {conf.CATCHUP_INTERVAL * 1e3:>7.0f} |      |"
    )
    ok = [t for t in redis_times if t is not None]
    print()
    print(f"target p95 < 1 s over Redis: {'met' if percentiles(ok)[1] < 1 else 'MISSED'}")


def wait_worker(log: Path, worker: subprocess.Popen, timeout: float = 60) -> None:
    # `ready.` is logged at INFO; WARNING level keeps the log quiet, so ask the worker.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise SystemExit(f"celery worker exited:\n{log.read_text()[-3000:]}")
        ping = subprocess.run(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "urlguard_service",
                "inspect",
                "ping",
                "--timeout",
                "1",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env=os.environ.copy(),
        )
        if "pong" in ping.stdout:
            time.sleep(0.5)
            return
        time.sleep(0.5)
    raise SystemExit(f"celery worker not ready:\n{log.read_text()[-3000:]}")


if __name__ == "__main__":
    main()
