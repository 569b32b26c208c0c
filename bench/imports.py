"""A rule import and its revert at scale, on PostgreSQL (a throw-away database):

1. the floor: `psql \\copy` of the file's lines into a table with a bigserial key, a
   unique index and a timestamp (bench/feeds.py's), timed in the same run;
2. `manage.py import_rules FILE` of N distinct URLs (default 100,000): one change
   set, a rule, a listing and a change-log row per line;
3. `revert_change_set` of that import: a rule removed and logged per line;
4. the revert of the revert: every rule restored, with its note.

Each is printed as a ratio of the floor, with the change-log rows it wrote.

    .venv/bin/python bench/imports.py [--rules 100000] [--db NAME] [--profile FILE]

--db names the database to create and drop (default urlguard_bench_imports_<pid>);
--profile FILE writes a cProfile of the import, --profile-revert FILE one of its
revert (pstats format).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.feeds import copy_floor  # noqa: E402


def write_rules(path: Path, n: int) -> None:
    with path.open("w") as out:
        out.write("# bench import\n")
        for i in range(n):
            out.write(f"http://host{i}.bench-import{i % 977}.example/path/{i}/x.html\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rules", type=int, default=100_000)
    parser.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--db", default="", help="database to create (dropped at the end)")
    parser.add_argument("--profile", default="", help="cProfile the import into this file")
    parser.add_argument("--profile-revert", default="", help="cProfile the revert into this file")
    args = parser.parse_args()
    import psycopg

    db = args.db or f"urlguard_bench_imports_{os.getpid()}"
    with psycopg.connect(f"{args.pg}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{db}"')
    tmp = Path(tempfile.mkdtemp(prefix="urlguard-bench-imports-"))
    try:
        os.environ.update(
            DATABASE_URL=f"{args.pg}/{db}",
            URLGUARD_VAR_DIR=str(tmp / "var"),
            DJANGO_DEBUG="0",
            DJANGO_SETTINGS_MODULE="urlguard_service.settings",
        )
        os.environ.pop("CELERY_BROKER_URL", None)
        (tmp / "var").mkdir()
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        from urlguard.models import ChangeEvent, ChangeSet, SpamRule
        from urlguard.nodesync import nudge
        from urlguard.writepath import revert

        silenced = nudge.sending_to(lambda seq: None)  # no node in this run
        silenced.__enter__()
        n = args.rules
        rules = tmp / "rules.txt"
        write_rules(rules, n)
        floor_s = copy_floor(f"{args.pg}/{db}", rules)

        def timed(what, *call_args, **kwargs):
            head = ChangeEvent.objects.head()
            started = time.perf_counter()
            done = what(*call_args, **kwargs)
            took = time.perf_counter() - started
            return done, took, ChangeEvent.objects.filter(seq__gt=head).count()

        profiler = cProfile.Profile() if args.profile else None
        if profiler is not None:
            profiler.enable()
        _, import_s, import_rows = timed(
            call_command, "import_rules", str(rules), stdout=io.StringIO()
        )
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        imported = ChangeSet.objects.get(kind=ChangeSet.Kind.IMPORT)
        assert imported.added == n == SpamRule.objects.count(), (imported.added, n)
        profiler = cProfile.Profile() if args.profile_revert else None
        if profiler is not None:
            profiler.enable()
        reverted, revert_s, revert_rows = timed(revert.revert_change_set, imported)
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile_revert)
        assert reverted.removed == n and SpamRule.objects.count() == 0, reverted
        restored, restore_s, restore_rows = timed(revert.revert_change_set, reverted)
        assert restored.added == n == SpamRule.objects.count(), restored

        load = os.getloadavg()
        print(f"import and revert benchmark, PostgreSQL, {n:,} rules")
        print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} cores")
        print("| step | seconds | x floor | change-log rows |")
        print("| --- | ---: | ---: | ---: |")
        print(f"| floor: psql \\copy of the same lines | {floor_s:.2f} | 1.00 | |")
        for name, took, rows in (
            ("import_rules (one change set)", import_s, import_rows),
            ("revert of the import", revert_s, revert_rows),
            ("revert of the revert (restore)", restore_s, restore_rows),
        ):
            print(f"| {name} | {took:.2f} | {took / floor_s:.2f} | {rows:,} |")
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(f"{args.pg}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
