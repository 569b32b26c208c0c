"""Feed refresh at scale, on PostgreSQL (a throw-away database of its own):

1. parse rate of an N-entry plain URL feed (default 1,000,000) on its own;
2. first load of that feed through refresh_source (fetch from file://, parse, diff,
   add_rules in chunks): target < 60 s end to end;
3. a refresh with 1% churn (1% of the entries gone, 1% new): target < 5 s, and only
   the changed rules written (ChangeEvents counted);
4. peak RSS of this process (it did both refreshes): target < 300 MB;
5. with --redis: a Celery worker on Redis as a second node (its own filter file); the
   time from the churn refresh's commit until that node's file holds the new rules and
   no longer the removed ones.

6. the floor: `psql \\copy` of the same lines into a table with a bigserial key, a
   unique index and a timestamp, timed in the same run; the first load and the churn
   refresh are printed as ratios of it.

    .venv/bin/python bench/feeds.py [--entries 1000000] [--redis redis://127.0.0.1:6379/14]
        [--db NAME] [--profile FILE] [--profile-churn FILE]

--profile FILE writes a cProfile of the first load to FILE (pstats format),
--profile-churn FILE one of the churn refresh (the figures printed are then the
profiled run's).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def peak_rss_mb(field: str = "VmHWM") -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) // 1024
    return 0


def by_step(started: float, stages: dict[str, float], ended: float) -> str:
    """How long each reported step lasted (until the next one began)."""
    marks = [("start", started), *stages.items(), ("end", ended)]
    return ", ".join(
        f"{name} {(marks[i + 1][1] - at) * 1000:,.0f} ms" for i, (name, at) in enumerate(marks[:-1])
    )


def write_feed(path: Path, ids: Iterable[int]) -> None:
    with path.open("w") as out:
        out.write("# bench feed\n")
        for i in ids:
            out.write(f"http://host{i}.bench-feed{i % 977}.example/path/{i}/x.html\n")


def copy_floor(url: str, feed: Path) -> float:
    """Seconds `psql \\copy` takes to store the feed's lines in a table with a
    bigserial key, a unique index and a timestamp: what PostgreSQL itself needs."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE bench_floor (id bigserial PRIMARY KEY, expression text NOT NULL "
            "UNIQUE, created timestamptz NOT NULL DEFAULT now())"
        )
    lines = feed.with_suffix(".lines")
    with feed.open() as src, lines.open("w") as out:
        for line in src:
            if not line.startswith("#"):
                out.write(line)
    started = time.perf_counter()
    subprocess.run(
        ["psql", url, "-q", "-c", f"\\copy bench_floor (expression) FROM '{lines}'"],
        check=True,
    )
    floor = time.perf_counter() - started
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE bench_floor")
    lines.unlink()
    return floor


def profiled(path: str) -> cProfile.Profile | None:
    """A running profiler when `path` asks for one."""
    if not path:
        return None
    profiler = cProfile.Profile()
    profiler.enable()
    return profiler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--redis", default="", help="e.g. redis://127.0.0.1:6379/14")
    parser.add_argument("--db", default="", help="database to create (dropped at the end)")
    parser.add_argument("--profile", default="", help="cProfile the first load into this file")
    parser.add_argument("--profile-churn", default="", help="cProfile the churn into this file")
    parser.add_argument("--churns", type=int, default=3, help="1%% churn refreshes in a row")
    args = parser.parse_args()
    import psycopg

    db = args.db or f"urlguard_bench_feeds_{os.getpid()}"
    with psycopg.connect(f"{args.pg}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{db}"')
    tmp = Path(tempfile.mkdtemp(prefix="urlguard-bench-feeds-"))
    worker = None
    try:
        os.environ.update(
            DATABASE_URL=f"{args.pg}/{db}",
            URLGUARD_VAR_DIR=str(tmp / "var"),
            DJANGO_DEBUG="0",
            DJANGO_SETTINGS_MODULE="urlguard_service.settings",
        )
        if args.redis:
            os.environ["CELERY_BROKER_URL"] = args.redis
        else:
            os.environ.pop("CELERY_BROKER_URL", None)
        (tmp / "var").mkdir()
        import django
        from django.conf import settings

        # The feed is served from a file beneath the run's folder.
        settings.URLGUARD["FEED_FILE_ROOT"] = str(tmp)
        django.setup()
        from django.core.management import call_command
        from django.db import connection

        call_command("migrate", verbosity=0)
        from urlguard.feeds import formats
        from urlguard.feeds.decoding import open_text
        from urlguard.feeds.refresh import refresh_source
        from urlguard.models import ChangeEvent, Source, SpamRule
        from urlguard.nodesync import nudge, registry

        if not args.redis:
            silenced = nudge.sending_to(lambda seq: None)  # no node in this run
            silenced.__enter__()  # for the run: held, as one collected would be left
        n = args.entries
        feed = tmp / "feed.txt"
        write_feed(feed, range(n))
        size = feed.stat().st_size

        started = time.perf_counter()
        with feed.open("rb") as body, open_text(body, limit=1 << 40) as text:
            _, entries = formats.parse(text, "urls", "spam")
            parsed = sum(1 for e in entries if e.expression)
        parse_s = time.perf_counter() - started

        floor_s = copy_floor(f"{args.pg}/{db}", feed)

        source = Source.objects.create(name="bench", kind="feed", url=f"file://{feed}")
        profiler = profiled(args.profile)
        started = time.perf_counter()
        first_stages: dict[str, float] = {}
        first = refresh_source(
            source, progress=lambda stage, *_: first_stages.setdefault(stage, time.perf_counter())
        )
        load_s = time.perf_counter() - started
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        first_steps = by_step(started, first_stages, started + load_s)
        assert first.status == "ok", first.error
        rss_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

        node_path = tmp / "node-b" / "filter.bin"
        if args.redis:
            env = {
                **os.environ,
                "URLGUARD_FILTER_PATH": str(node_path),
                "URLGUARD_NODE_NAME": f"bench-{uuid.uuid4().hex[:6]}",
            }
            log = (tmp / "worker.log").open("w")
            worker = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "urlguard_service", "worker", "-Q",
                 "urlguard.broadcast", "--pool", "solo", "--loglevel", "WARNING",
                 "--without-gossip", "--without-mingle"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            head = ChangeEvent.objects.head()
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                f = registry.get_filter(str(node_path)) if node_path.exists() else None
                if f is not None and f.applied_seq >= head:
                    break
                time.sleep(0.2)

        # A refresh minutes after a load finds the load's tables vacuumed and analyzed;
        # right after it, autovacuum would start on them at some moment of the churn.
        with connection.cursor() as cursor:
            cursor.execute("VACUUM (ANALYZE)")
        churn = n // 100
        write_feed(feed, range(churn, n + churn))
        os.utime(feed, (1, 1))
        head_before = ChangeEvent.objects.head()
        started = time.perf_counter()
        stages: dict[str, float] = {}
        high_water: dict[str, int] = {}

        def mark(stage: str, *_: int) -> None:
            if stage not in stages:
                stages[stage] = time.perf_counter()
                high_water[stage] = peak_rss_mb()

        rss_before = peak_rss_mb("VmRSS")
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # VmHWM from here on: this refresh's own peak
        profiler = profiled(args.profile_churn)
        second = refresh_source(source, progress=mark)
        churn_s = time.perf_counter() - started
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile_churn)
        committed = time.monotonic()
        written = ChangeEvent.objects.filter(seq__gt=head_before).count()
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        assert second.status == "ok" and second.added == second.removed == churn, second

        propagation = None
        if args.redis:
            added = f"host{n}.bench-feed{n % 977}.example/path/{n}/x.html"
            removed = "host0.bench-feed0.example/path/0/x.html"
            head = ChangeEvent.objects.head()
            while time.monotonic() - committed < 120:
                f = registry.get_filter(str(node_path))
                if f is not None and f.applied_seq >= head:
                    assert added in f and removed not in f
                    propagation = time.monotonic() - committed
                    break
                time.sleep(0.005)

        # The same churn again (the window of ids moved on by 1% each time): the
        # figure is the median, as one refresh shares the machine with whatever runs.
        churns = [churn_s]
        for round_ in range(2, args.churns + 1):
            write_feed(feed, range(round_ * churn, n + round_ * churn))
            os.utime(feed, (round_, round_))
            began = time.perf_counter()
            again = refresh_source(source)
            churns.append(time.perf_counter() - began)
            assert again.status == "ok" and again.added == again.removed == churn, again
        churn_median = statistics.median(churns)

        load = os.getloadavg()
        print(f"feed refresh benchmark, PostgreSQL, {n:,} entries ({size / 1e6:.0f} MB)")
        print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} cores")
        print("| step | figure | target |")
        print("| --- | --- | --- |")
        print(f"| parse only | {parsed / parse_s:,.0f} entries/s ({parse_s:.1f} s) | |")
        print(f"| floor: psql \\copy of the same lines | {floor_s:.2f} s | |")
        print(
            f"| first load | {load_s:.1f} s = {load_s / floor_s:.2f}x floor "
            f"({first.rules_added:,} rules written) | <= 2.5x floor |"
        )
        print(
            f"| 1% churn refresh, median of {len(churns)} | {churn_median:.2f} s = "
            f"{churn_median / floor_s:.3f}x floor ({', '.join(f'{c:.2f}' for c in churns)} s; "
            f"the first +{second.added:,} -{second.removed:,}, {written:,} change-log rows "
            f"written) | <= 0.25x floor, ~{2 * churn:,} rows |"
        )
        print(f"| first load, by step | {first_steps} | |")
        print(f"| first churn refresh, by step | {by_step(started, stages, started + churn_s)} | |")
        marks = ", ".join(f"{name} {mb} MB" for name, mb in high_water.items())
        print(
            f"| churn refresh: RSS before, peak as each step began | {rss_before} MB; {marks} | |"
        )
        print(f"| peak RSS after first load | {rss_load:.0f} MB | < 300 MB |")
        print(f"| peak RSS of the process | {rss:.0f} MB | < 300 MB |")
        if args.redis:
            shown = "did not arrive in 120 s" if propagation is None else f"{propagation:.2f} s"
            print(f"| commit -> second node's file (Redis + worker) | {shown} | |")
        print(f"rules in table: {SpamRule.objects.count():,}")
    finally:
        if worker is not None:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(30)
        from django.db import connections

        connections.close_all()
        with psycopg.connect(f"{args.pg}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        shutil.rmtree(tmp, ignore_errors=True)  # the feed, its copy and the memo


if __name__ == "__main__":
    main()
