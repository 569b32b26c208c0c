"""Benchmark: `rebuild_filter` for 1,000,000 rules from PostgreSQL. Target: under 60 s.

Creates its own database (urlguard_bench_rebuild, dropped and re-created), loads the
rules with COPY (seeding is not what is measured), then times the rebuild as the
command runs it (stream the table in one snapshot, build the file aside, atomic
replace, replay the log after the snapshot), and beside it, in the same run, its two
halves on their own: streaming the rows out of PostgreSQL, and building the file
from an in-memory list; plus the per-change path (applying the same rules as
ChangeEvents in APPLY_CHUNK batches), which a rebuild replaces.

Also: `manage.py import_rules` of --import-rules (100,000) rules on the embedded
default (SQLite, Celery in-process so the filter follows each chunk), the write path
that must stay well under 60 s.

    .venv/bin/python bench/rebuild.py [--rules 1000000] [--import-rules 100000]
                                      [--pg postgres://postgres@127.0.0.1:5432]
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rules", type=int, default=1_000_000)
    parser.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--db", default="urlguard_bench_rebuild")
    parser.add_argument(
        "--skip-apply", action="store_true", help="do not time the per-change replay of every rule"
    )
    parser.add_argument(
        "--import-rules",
        type=int,
        default=100_000,
        help="rules for the SQLite import_rules run (0: skip it)",
    )
    args = parser.parse_args()
    imported = import_on_sqlite(args.import_rules) if args.import_rules else None

    import psycopg

    with psycopg.connect(f"{args.pg}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{args.db}"')

    var = Path(tempfile.mkdtemp(prefix="urlguard-bench-rebuild-"))
    os.environ.update(
        DATABASE_URL=f"{args.pg}/{args.db}",
        URLGUARD_VAR_DIR=str(var),
        DJANGO_SETTINGS_MODULE="urlguard_service.settings",
    )
    os.environ.pop("CELERY_BROKER_URL", None)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from filterengine import ScalingCountingBloomFilter
    from urlguard.conf import conf
    from urlguard.nodesync import sync

    call_command("migrate", verbosity=0)
    try:
        rows = seed(connection, args.rules)
        path = conf.FILTER_PATH

        # 1. What `manage.py rebuild_filter` does.
        started = time.perf_counter()
        result = sync.sync(path=path, force_rebuild="benchmark")
        rebuild_s = time.perf_counter() - started
        size = os.path.getsize(path)
        started = time.perf_counter()
        with ScalingCountingBloomFilter.open(path, readonly=True) as filt:
            open_s = time.perf_counter() - started
            stages = len(filt.info()["stages"])
            sample = [r[0] for r in rows[:: max(1, len(rows) // 10_000)]]
            held_ok = bool(filt.contains_many(sample).all())

        # 2. Its halves on their own.
        started = time.perf_counter()
        streamed = sum(1 for _ in sync._stream_rules("default"))
        stream_s = time.perf_counter() - started
        aside = str(var / "aside.bin")
        started = time.perf_counter()
        ScalingCountingBloomFilter.build(
            aside, rows, capacity=conf.FILTER_CAPACITY, error_rate=conf.FILTER_ERROR_RATE
        )
        build_s = time.perf_counter() - started

        # 3. The per-change path over the same rules (what a rebuild saves).
        apply_s = None
        if not args.skip_apply:
            replay = str(var / "replay.bin")
            ScalingCountingBloomFilter.build(
                replay, [], capacity=conf.FILTER_CAPACITY, error_rate=conf.FILTER_ERROR_RATE
            )
            started = time.perf_counter()
            with ScalingCountingBloomFilter.open(replay, readonly=False) as filt:
                res = sync.SyncResult(path=replay)
                sync._apply_pending(filt, res)
                filt.flush()
            apply_s = time.perf_counter() - started
    finally:
        connection.close()
        shutil.rmtree(var, ignore_errors=True)
        with psycopg.connect(f"{args.pg}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')

    n = len(rows)
    print()
    print(
        f"rebuild_filter from PostgreSQL: {n:,} rules, capacity {conf.FILTER_CAPACITY:,}, "
        f"error rate {conf.FILTER_ERROR_RATE}"
    )
    print()
    print(f"| {'what':<56} | {'seconds':>8} | {'rules/s':>10} |")
    print(f"|{'-' * 58}|{'-' * 10}|{'-' * 12}|")
    line = "| {:<56} | {:>8.2f} | {:>10,.0f} |"
    print(
        line.format("rebuild_filter (stream + build + replace + replay)", rebuild_s, n / rebuild_s)
    )
    print(
        line.format(
            "  stream rows from PostgreSQL (values_list iterator)", stream_s, streamed / stream_s
        )
    )
    print(line.format("  build the file from a list in memory", build_s, n / build_s))
    if apply_s is not None:
        print(
            line.format(
                "apply the same rules as ChangeEvents (per-change path)", apply_s, n / apply_s
            )
        )
    if imported is not None:
        count, seconds, summary = imported
        print(
            line.format(
                f"import_rules {count:,} rules, SQLite + in-process apply", seconds, count / seconds
            )
        )
        print(f"  ({summary})")
    print()
    print(
        f"target < 60 s: {'met' if rebuild_s < 60 else 'MISSED'}; file {size / 2**20:.1f} MiB, "
        f"{stages} stages, {size / n:.2f} bytes/rule, open() {open_s * 1e3:.2f} ms, "
        f"sampled rules all present: {held_ok}, applied_seq {result.applied_seq:,}"
    )


def import_on_sqlite(n: int) -> tuple[int, float, str]:
    """`manage.py import_rules` in a fresh var dir on the embedded defaults: the
    wall time a person waits, Django start-up included."""
    var = Path(tempfile.mkdtemp(prefix="urlguard-bench-import-"))
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env["URLGUARD_VAR_DIR"] = str(var)
    try:
        manage = [sys.executable, str(ROOT / "manage.py")]
        subprocess.run([*manage, "migrate", "-v0"], env=env, check=True, cwd=ROOT)
        source = var / "list.txt"
        with source.open("w") as fh:
            for i in range(n):
                fh.write(
                    f"https://spam{i}.example{i % 97}.com/\n"
                    if i % 3
                    else f"0.0.0.0 ads{i}.tracker{i % 31}.net\n"
                )
        started = time.perf_counter()
        done = subprocess.run(
            [*manage, "import_rules", str(source)],
            env=env,
            check=True,
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - started
        verify = subprocess.run(
            [*manage, "verify_filter"], env=env, cwd=ROOT, capture_output=True, text=True
        )
        summary = (
            done.stdout.strip().splitlines()[-1].rstrip(".")
            + "; verify_filter: "
            + (verify.stdout.strip() or verify.stderr.strip()).splitlines()[-1][:80]
        )
        return n, seconds, summary
    finally:
        shutil.rmtree(var, ignore_errors=True)


def seed(connection, n: int) -> list[tuple[str, int]]:
    """n rules and their ChangeEvents, loaded with COPY. Most rules are domains, as in
    real lists; the rest paths and pages."""
    base = 1_700_000_000_000_000
    rows = []
    for i in range(n):
        kind = i % 10
        if kind < 7:
            expr = f"spam{i}.example{i % 97}.com/"
        elif kind < 9:
            expr = f"host{i % 5000}.bad{i % 13}.net/path{i}/"
        else:
            expr = f"www.shop{i % 701}.org/offer/{i}.html"
        rows.append((expr, base + i))
    started = time.perf_counter()
    with connection.cursor() as cursor:
        raw = cursor.connection
        with raw.cursor() as cur:
            with cur.copy(
                "COPY urlguard_spamrule (expression, category, added_at, source, note,"
                " created, updated) FROM STDIN"
            ) as copy:
                buf = io.StringIO()
                for expr, added_at in rows:
                    buf.write(f"{expr}\tspam\t{added_at}\tbench\t\t2026-01-01\t2026-01-01\n")
                copy.write(buf.getvalue())
            with cur.copy(
                "COPY urlguard_changeevent (action, expression, added_at, category,"
                " source, created) FROM STDIN"
            ) as copy:
                buf = io.StringIO()
                for expr, added_at in rows:
                    buf.write(f"add\t{expr}\t{added_at}\tspam\tbench\t2026-01-01\n")
                copy.write(buf.getvalue())
        raw.commit()
        cursor.execute("ANALYZE urlguard_spamrule")
        cursor.execute("ANALYZE urlguard_changeevent")
    print(f"seeded {n:,} rules with COPY in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return rows


if __name__ == "__main__":
    main()
