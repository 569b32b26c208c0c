"""Where one chunk of a feed's first load goes in PostgreSQL: `changes.add_listed` of
--chunk new entries (default 50,000) on a spam table of --rules rules (default
300,000, written by add_listed itself beforehand), in a throw-away database.

Each round stages the chunk's rows as add_listed does and runs its chunk statement
under `EXPLAIN (ANALYZE, BUFFERS)` with the constraints made immediate (so each
foreign-key check shows as the trigger it is, instead of hiding in the commit), then
rolls the round back. Printed per round: the time of each part (the rule lookup,
each INSERT's own time, each constraint trigger), and the whole statement; then one
chunk written for real (statement and commit timed apart).

    .venv/bin/python bench/listed_write.py [--db NAME] [--rules 300000] [--chunk 50000]
        [--rounds 3] [--plan]

--plan prints the last round's plan as PostgreSQL wrote it.

--overlap N (instead of the above): add_listed of N new entries, read back from a
spool file as a refresh reads its staged entries, with the rows read by
add_listed's thread and inline (the thread replaced by a loop on the caller's),
alternating, --rounds pairs, each on emptied tables: the seconds, those spent
waiting on the database, and the rest (Python on the calling thread).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class _RolledBack(Exception):
    pass


def feed_rows(low: int, high: int) -> Any:
    from urlguard.models import expression_key

    for i in range(low, high):
        expression = f"host{i}.bench-feed{i % 977}.example/path/{i}/x.html"
        yield expression, "spam", expression_key(expression)


def parts(plan: dict) -> list[tuple[str, float]]:
    """(part, ms) of one chunk statement's plan: the lookup subplan, each INSERT's own
    time (its total less its input's), each constraint trigger."""
    found: list[tuple[str, float]] = []

    def walk(node: dict) -> None:
        children = node.get("Plans", [])
        if node["Node Type"] == "ModifyTable":
            feeding = sum(
                c["Actual Total Time"] * c["Actual Loops"]
                for c in children
                if c.get("Parent Relationship") == "Outer"
            )
            own = node["Actual Total Time"] * node["Actual Loops"] - feeding
            found.append((f"INSERT {node['Relation Name']} ({node['Actual Rows']:,} rows)", own))
        if node.get("Subplan Name", "").startswith("SubPlan") and "Index" in node["Node Type"]:
            found.append(
                (
                    f"look up each expression ({node['Node Type']})",
                    node["Actual Total Time"] * node["Actual Loops"],
                )
            )
        for child in children:
            walk(child)

    walk(plan["Plan"])
    for trigger in plan.get("Triggers", []):
        name = trigger.get("Constraint Name") or trigger["Trigger Name"]
        found.append((f"check {name} ({trigger['Calls']:,} calls)", trigger["Time"]))
    found.append(("whole statement (execution, triggers included)", plan["Execution Time"]))
    return found


class _Inline:
    """add_listed's _Reader without its thread: the rows read on the caller's
    thread, between the chunks."""

    def __init__(self, rows: Any, chunk_size: int):
        self._rows, self._chunk_size = rows, chunk_size

    def __iter__(self) -> Any:
        from urlguard.writepath import bulkload

        first, block = 0, []
        for row in self._rows:
            block.append(row)
            if len(block) == self._chunk_size:
                yield bulkload._Chunk(first, len(block), [block])
                first, block = first + len(block), []
        if block:
            yield bulkload._Chunk(first, len(block), [block])

    def copied(self) -> None:
        pass

    def close(self) -> None:
        pass


def overlap(n: int, rounds: int, tmp: Path) -> None:
    import numpy as np
    from django.db import connection

    from urlguard.models import Source
    from urlguard.writepath import bulkload, changes

    spool = tmp / "spool.txt"
    keys_read: list[int] = []
    with spool.open("w") as out:
        for i, (expression, category, key) in enumerate(feed_rows(0, 2 * rounds * n)):
            out.write(f"{i}\t{category}\t{expression}\n")
            keys_read.append(key)
    keys = np.array(keys_read, dtype=np.int64)

    def staged(low: int, high: int) -> Any:
        with spool.open() as lines:
            for line in lines:
                index, category, expression = line.rstrip("\n").split("\t", 2)
                if low <= int(index) < high:
                    yield expression, category, int(keys[int(index)])

    waited = [0.0]

    def clock(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        began = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            waited[0] += time.perf_counter() - began

    commit, copy_chunk = connection.commit, bulkload._copy_chunk

    def timed_commit() -> None:
        began = time.perf_counter()
        commit()
        waited[0] += time.perf_counter() - began

    def timed_copy(*args: Any) -> None:
        began = time.perf_counter()
        copy_chunk(*args)
        waited[0] += time.perf_counter() - began

    connection.commit = timed_commit  # type: ignore[method-assign]
    bulkload._copy_chunk = timed_copy
    threaded, done = bulkload._Reader, 0
    print(f"add_listed of {n:,} entries, the rows read by its thread or inline")
    for _ in range(rounds):
        for name, encoder in (("thread", threaded), ("inline", _Inline)):
            bulkload._Reader = encoder  # type: ignore[misc]
            with connection.cursor() as cursor:
                cursor.execute(
                    "TRUNCATE urlguard_rulesource, urlguard_changeevent, urlguard_spamrule CASCADE"
                )
                cursor.execute("VACUUM ANALYZE")
            source = Source.objects.create(name=f"s{done}", kind="feed", url="file:///dev/null")
            waited[0] = 0.0
            began = time.perf_counter()
            with connection.execute_wrapper(clock):
                changes.add_listed(staged(done * n, (done + 1) * n), source=source)
            took = time.perf_counter() - began
            load = os.getloadavg()[0]
            print(
                f"{name}: {took:.2f} s, waiting on the database {waited[0]:.2f} s, "
                f"the rest {took - waited[0]:.2f} s (load average {load:.2f})"
            )
            done += 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--db", default=f"urlguard_bench_listed_{os.getpid()}")
    parser.add_argument("--rules", type=int, default=300_000)
    parser.add_argument("--chunk", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plan", action="store_true")
    parser.add_argument("--overlap", type=int, default=0, metavar="N")
    args = parser.parse_args()
    import psycopg

    with psycopg.connect(f"{args.pg}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{args.db}"')
    tmp = Path(tempfile.mkdtemp(prefix="urlguard-bench-listed-"))
    try:
        os.environ.update(
            DATABASE_URL=f"{args.pg}/{args.db}",
            URLGUARD_VAR_DIR=str(tmp),
            DJANGO_DEBUG="0",
            DJANGO_SETTINGS_MODULE="urlguard_service.settings",
        )
        os.environ.pop("CELERY_BROKER_URL", None)
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        call_command("migrate", verbosity=0)
        from urlguard.models import Source
        from urlguard.nodesync import nudge
        from urlguard.writepath import changes

        silenced = nudge.sending_to(lambda seq: None)  # no node in this run
        silenced.__enter__()  # for the run: held, as one collected would be left
        if args.overlap:
            overlap(args.overlap, args.rounds, Path(tmp))
            return
        source = Source.objects.create(name="bench", kind="feed", url="file:///dev/null")
        started = time.perf_counter()
        changes.add_listed(feed_rows(0, args.rules), source=source)
        took = time.perf_counter() - started
        print(f"{args.rules:,} rules written by add_listed in {took:.1f} s")
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE")
        plans: list[dict] = []

        def explain(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            if "INSERT INTO" not in sql or "WITH" not in sql:
                return execute(sql, params, many, context)
            cursor = context["cursor"].cursor  # psycopg's own: past the wrappers
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
            plan = cursor.fetchone()[0]
            plans.append(plan[0] if isinstance(plan, list) else json.loads(plan)[0])
            raise _RolledBack

        low = args.rules
        for _ in range(args.rounds):
            with connection.execute_wrapper(explain), contextlib.suppress(_RolledBack):
                changes.add_listed(
                    feed_rows(low, low + args.chunk), source=source, chunk_size=args.chunk
                )
        load = os.getloadavg()
        print(
            f"one add_listed chunk of {args.chunk:,} new entries at {args.rules:,} rules; "
            f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
        )
        rows = [dict(parts(plan)) for plan in plans]
        names = list(rows[0])
        print("| part | " + " | ".join(f"round {i + 1} ms" for i in range(len(rows))) + " |")
        print("| --- |" + " ---: |" * len(rows))
        for name in names:
            print(f"| {name} | " + " | ".join(f"{r.get(name, 0):,.0f}" for r in rows) + " |")

        # One chunk for real: the statement, then the commit (deferred checks, if any).
        timed: dict[str, float] = {}

        def clock(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            began = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                if "INSERT INTO" in sql and "WITH" in sql:
                    timed["statement"] = time.perf_counter() - began

        commit = connection.commit

        def timed_commit() -> None:
            began = time.perf_counter()
            commit()
            timed["commit"] = timed.get("commit", 0.0) + time.perf_counter() - began

        connection.commit = timed_commit  # type: ignore[method-assign]
        began = time.perf_counter()
        with connection.execute_wrapper(clock):
            changes.add_listed(
                feed_rows(low, low + args.chunk), source=source, chunk_size=args.chunk
            )
        whole = time.perf_counter() - began
        print(
            f"written for real: add_listed {whole * 1000:,.0f} ms, of which the chunk "
            f"statement {timed['statement'] * 1000:,.0f} ms and the commits "
            f"{timed['commit'] * 1000:,.0f} ms"
        )
        if args.plan:
            print(json.dumps(plans[-1], indent=1))
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(f"{args.pg}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')


if __name__ == "__main__":
    main()
