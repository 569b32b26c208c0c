"""Scaling table: what 100,000, 1,000,000 and 10,000,000 rules cost on PostgreSQL.

Per size, in a database emptied for it (created if missing; every table in it is
dropped: pass a database that is this bench's own):

1. seeding, not measured: the spam table, its provenance (RuleSource, under the
   manual source "import"), the change log (one ChangeEvent per rule, in one import
   change set) loaded with COPY as `changes.add_rules` stores them;
2. `manage.py rebuild_filter` (the command's code, in-process): seconds; the file's
   bytes, bytes per rule and stages;
3. opening the file read-only (median of 21 opens, page cache warm);
4. one `Guard.check` of a distinct clean URL (10 expressions, bench/guard.py's
   URLs) through the process-wide guard: median and p99 of 20,000, of the round
   with the lowest median of three;
5. `manage.py verify_filter`: seconds;
6. gunicorn, 2 sync workers: 10,000 `GET /api/check` answered by each worker
   (counted from the access log), then each worker's RSS, PSS (shared pages split
   among the processes that map them) and USS (its private pages), and how much of
   the filter file is resident in it (RSS) and its share of that (PSS): the file is
   one shared mapping, so PSS is about half of RSS with two workers;
7. unless --skip-feeds, in a child process on a database of its own (<db>_feed):
   a plain URL feed of the same size (bench/feeds.py's lines, read from file://):
   its floor (bench/feeds.py's: `psql \\copy` of the same lines into a table with a
   bigserial key, a unique index on the text and a timestamp), then through
   `refresh_source` the first load and a refresh with 1% churn (1% gone, 1% new):
   seconds, times the floor, and the child's peak RSS. The nodes are not nudged (as
   bench/feeds.py without --redis): the refresh's own work is measured.
   --feeds-only: this part alone (1-6 skipped).

Every part has a time limit (--part-timeout): past it, the part prints "timeout
after N s" and the parts that need it are skipped. Costs should grow linearly with
the rules (rebuild, verify, feed load) or stay flat (open, lookups): the ratios of
consecutive sizes, and of each size to 1M, are printed beside the figures with
their targets (lookups within 1.5x of 1M; rebuild, verify and the feed's first
load within 1.2x the sizes' ratio: 4.8x at 4M, 12x at 10M).

    .venv/bin/python bench/scale.py [--sizes 100k,1M,4M,10M] [--skip-feeds | --feeds-only]
        [--database-url postgres://postgres@127.0.0.1:5432/urlguard_bench_scale]
        [--part-timeout 1800] [--port 18500]

Takes, on 2 cores at a load average of 2-3: 100k 0.5 min, 1M 2 min, 10M 3.5 min
without the feeds (--skip-feeds); the feed part alone (--feeds-only) took 1.2-2, 7-9
and 16-17 min at 1M, 4M and 10M at a load average of 3-13; docs/performance.md has the
figures and the load of the last runs.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import importlib.util
import io
import itertools
import json
import os
import queue
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
GUNICORN = str(Path(sys.executable).with_name("gunicorn"))
MiB = 2**20
# Bytes of PostgreSQL per rule (rule, provenance, change-log row and their indexes,
# ~0.7 KB measured) and per feed entry, with room: a size that does not fit twice
# over is skipped rather than filling the disk.
DB_BYTES_PER_RULE = 1000
CHECKS = 20_000
ROUNDS = 3
WORKER_CHECKS = 10_000


def _bench_module(name: str) -> ModuleType:
    """Another bench script as a module (bench/ is no package), for its helpers."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


guardbench = _bench_module("guard")  # rule_expressions, clean_url, timed
feedbench = _bench_module("feeds")  # write_feed, peak_rss_mb, by_step


def parse_size(text: str) -> int:
    text = text.strip().lower().replace("_", "").replace(",", "")
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def size_label(n: int) -> str:
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n % 1_000 == 0:
        return f"{n // 1_000}k"
    return f"{n:,}"


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


class PartTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise PartTimeout in this (main) thread after `seconds`."""

    def expire(signum: int, frame: Any) -> None:
        raise PartTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Timeout:
    """A figure that was not measured: its part ran past the time limit (or a part
    it needs did)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


def timed_part(results: dict[str, Any], name: str, seconds: float, fn: Callable[[], Any]) -> Any:
    """fn() within the time limit; records Timeout under `name` when it ran past it."""
    started = time.perf_counter()
    try:
        with time_limit(seconds):
            return fn()
    except PartTimeout:
        results[name] = Timeout(f"timeout after {time.perf_counter() - started:.0f} s")
        print(f"  {name}: {results[name]}", file=sys.stderr)
        return None


# -- databases -----------------------------------------------------------------------


def split_url(url: str) -> tuple[str, str]:
    """postgres://.../name -> (postgres://.../postgres, name)"""
    parts = urllib.parse.urlsplit(url)
    name = parts.path.lstrip("/")
    if not name:
        sys.exit("--database-url must name a database (it is dropped and re-created)")
    return urllib.parse.urlunsplit(parts._replace(path="/postgres")), name


def with_name(url: str, name: str) -> str:
    return urllib.parse.urlunsplit(urllib.parse.urlsplit(url)._replace(path=f"/{name}"))


def recreate(url: str, *, drop_only: bool = False) -> None:
    """Empty the database at `url` (created if missing): its schema is dropped and made
    anew. Not DROP DATABASE: that waits until every session of the server has
    acknowledged it (ProcSignalBarrier), and on a shared server one session idle in
    COPY FROM STDIN holds it, and this bench with it, for as long as it idles.
    `drop_only`: the tables go (their disk with them), the empty database stays."""
    import psycopg

    server, name = split_url(url)
    with psycopg.connect(server, autocommit=True) as admin:
        row = admin.execute(
            "SELECT datconnlimit FROM pg_database WHERE datname = %s", [name]
        ).fetchone()
        if row is None:
            if drop_only:
                return
            admin.execute(f'CREATE DATABASE "{name}"')
        elif row[0] == -2:
            sys.exit(f"database {name} was left invalid by an interrupted DROP DATABASE: "
                     "drop it, or name another with --database-url")  # fmt: skip
        # Sessions of a part stopped at its time limit may still hold the tables.
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            [name],
        )
    with psycopg.connect(url, autocommit=True) as db:
        db.execute("DROP SCHEMA IF EXISTS public CASCADE")
        db.execute("CREATE SCHEMA public")


def free_bytes_for_postgres(url: str) -> int | None:
    """Free bytes on PostgreSQL's data directory's filesystem (None: not readable here)."""
    import psycopg

    server, _ = split_url(url)
    try:
        with psycopg.connect(server, autocommit=True) as admin:
            row = admin.execute("SHOW data_directory").fetchone()
        return shutil.disk_usage(row[0]).free if row else None
    except Exception:  # another host, or no right to read the setting
        return None


# -- seeding ---------------------------------------------------------------------------

BASE_ID = 1_700_000_000_000_000  # added_at: microsecond timestamps, one per rule
CREATED = "2026-01-01 00:00:00+00"
LABEL = "import:scale.txt"
COPY_ROWS = 50_000


SEEDED_TABLES = ("urlguard_spamrule", "urlguard_rulesource", "urlguard_changeevent")


def drop_secondary_indexes(cur: Any, tables: tuple[str, ...]) -> list[str]:
    """Drop the tables' indexes, unique and foreign-key constraints but their primary
    keys, and return the statements that make them again: a COPY of 10M rows into
    indexed tables took ~4x as long as the COPY and the index builds after it."""
    cur.execute(
        "SELECT format('ALTER TABLE %%I ADD CONSTRAINT %%I %%s', t.relname, c.conname, "
        "pg_get_constraintdef(c.oid)), format('ALTER TABLE %%I DROP CONSTRAINT %%I', "
        "t.relname, c.conname), c.contype FROM pg_constraint c "
        "JOIN pg_class t ON t.oid = c.conrelid "
        "WHERE t.relname = ANY(%s) AND c.contype IN ('u', 'f')",
        [list(tables)],
    )
    constraints = cur.fetchall()
    cur.execute(
        "SELECT indexdef, format('DROP INDEX %%I', indexname) FROM pg_indexes i "
        "WHERE tablename = ANY(%s) AND NOT EXISTS "
        "(SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname)",
        [list(tables)],
    )
    indexes = cur.fetchall()
    # Foreign keys first (one may lean on a unique constraint), then the rest.
    for _, drop, _ in sorted(constraints, key=lambda c: c[2] != "f"):
        cur.execute(drop)
    for _, drop in indexes:
        cur.execute(drop)
    return [
        *(make for make, _ in indexes),
        *(make for make, _, kind in constraints if kind == "u"),
        *(make for make, _, kind in constraints if kind == "f"),
    ]


def seed(n: int) -> None:
    """n rules with their provenance and change log, as `changes.add_rules` would
    write an import of them (one change set), loaded with COPY."""
    from django.db import connection
    from django.utils import timezone

    from urlguard.models import ChangeSet, Source, expression_key
    from urlguard.writepath.rules import normalize_rule

    source, _ = Source.objects.get_or_create(name="import", defaults={"kind": Source.Kind.MANUAL})
    cs = ChangeSet.objects.create(
        kind=ChangeSet.Kind.IMPORT, source=source, note="bench/scale.py", added=n,
        finished=timezone.now(), owner="",
    )  # fmt: skip
    sample = list(guardbench.rule_expressions(min(n, 1000)))
    assert all(normalize_rule(e) == e for e in sample), "bench rules must be normalized"

    def blocks(line: Callable[[int, str], str]) -> Iterator[str]:
        out = []
        for i, expression in enumerate(guardbench.rule_expressions(n), start=1):
            out.append(line(i, expression))
            if len(out) == COPY_ROWS:
                yield "".join(out)
                out = []
        yield "".join(out)

    copies = [
        (
            "COPY urlguard_spamrule (id, expression, category, note, added_at, source, "
            "created, updated) FROM STDIN",
            lambda i, e: f"{i}\t{e}\tspam\t\t{BASE_ID + i}\t{LABEL}\t{CREATED}\t{CREATED}\n",
        ),
        (
            'COPY urlguard_rulesource (rule_id, source_id, "key", created) FROM STDIN',
            lambda i, e: f"{i}\t{source.pk}\t{expression_key(e)}\t{CREATED}\n",
        ),
        (
            "COPY urlguard_changeevent (seq, action, expression, added_at, category, source, "
            "created, change_set_id, note) FROM STDIN",
            lambda i, e: f"{i}\tadd\t{e}\t{BASE_ID + i}\tspam\t{LABEL}\t{CREATED}\t{cs.pk}\t\n",
        ),
    ]
    raw = connection.cursor().connection
    with raw.cursor() as cur:
        remake = drop_secondary_indexes(cur, SEEDED_TABLES)
        for statement, line in copies:
            with cur.copy(statement) as copy:
                for block in blocks(line):
                    copy.write(block)
        for table, column in (
            ("urlguard_spamrule", "id"),
            ("urlguard_rulesource", "id"),
            ("urlguard_changeevent", "seq"),
        ):
            cur.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', '{column}'), "
                f"(SELECT max({column}) FROM {table}))"
            )
        cur.execute("SET maintenance_work_mem = '512MB'")  # index builds in memory
        for statement in remake:
            cur.execute(statement)
    raw.commit()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE urlguard_spamrule")
        cursor.execute("VACUUM ANALYZE urlguard_rulesource")
        cursor.execute("VACUUM ANALYZE urlguard_changeevent")


# -- the measured parts ------------------------------------------------------------------


def percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * fraction))]


def measure_open(path: str) -> float:
    from filterengine import ScalingCountingBloomFilter

    samples = []
    for _ in range(21):
        started = time.perf_counter()
        filt = ScalingCountingBloomFilter.open(path, readonly=True)
        samples.append(time.perf_counter() - started)
        filt.close()
    return statistics.median(samples)


def measure_checks() -> tuple[float, float]:
    """Median and p99 µs of one Guard.check of a distinct clean URL."""
    from urlguard.hotpath.guard import get_guard

    guard = get_guard()
    # Warm the code, not the caches: these URLs are not measured.
    for i in range(3 * CHECKS, 3 * CHECKS + 2000):
        guard.check(guardbench.clean_url(i))
    rounds = []
    for _ in range(ROUNDS):
        guard.clean_cache.clear()
        samples = sorted(
            guardbench.timed(guard.check, [guardbench.clean_url(i) for i in range(CHECKS)])
        )
        rounds.append((statistics.median(samples), percentile(samples, 0.99)))
    # Other work on the machine only ever adds time: the quietest round is the figure.
    return min(rounds)


def smaps(pid: int, filter_path: str) -> dict[str, float]:
    """RSS, PSS, USS of the process and the filter file's resident and PSS share, MiB."""
    totals: Counter[str] = Counter()
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            parts = line.split()
            if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                totals[parts[0][:-1]] += int(parts[1])
    mapped: Counter[str] = Counter()
    # Private kB per mapping (anonymous memory, the heap, a file), to say where USS is.
    private: Counter[str] = Counter()
    inside = False
    name = ""
    with open(f"/proc/{pid}/smaps") as detail:
        for line in detail:
            parts = line.split()
            if parts and "-" in parts[0] and not parts[0].endswith(":"):
                # A mapping's first line; the file is renamed over, so match its name.
                name = parts[5] if len(parts) > 5 else "[anonymous]"
                inside = os.path.basename(name) == os.path.basename(filter_path)
            elif inside and parts and parts[0] in ("Rss:", "Pss:"):
                mapped[parts[0][:-1]] += int(parts[1])
            if parts and parts[0] in ("Private_Clean:", "Private_Dirty:"):
                private[name] += int(parts[1])
    return {
        "rss": totals["Rss"] / 1024,
        "pss": totals["Pss"] / 1024,
        "uss": (totals["Private_Clean"] + totals["Private_Dirty"]) / 1024,
        "filter_rss": mapped["Rss"] / 1024,
        "filter_pss": mapped["Pss"] / 1024,
        "private_top": [(where, round(kb / 1024, 1)) for where, kb in private.most_common(3)],
    }


def free_port(ports: Iterator[int]) -> int:
    for candidate in ports:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            return candidate
    sys.exit("no free port left in this bench's range")


def stop(server: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def start_gunicorn(
    env: dict[str, str], tmp: Path, ports: Iterator[int], deadline: float
) -> tuple[subprocess.Popen[bytes], int]:
    """gunicorn with 2 workers on the first port of `ports` it can bind, once a request
    has reached it (its own access log says so: on a shared machine another program
    may take a port between the probe and the bind, and answer there)."""
    log = tmp / "gunicorn.log"
    access = tmp / "access.log"
    while True:
        port = free_port(ports)
        access.unlink(missing_ok=True)
        server = subprocess.Popen(
            [GUNICORN, "urlguard_service.wsgi", "--bind", f"127.0.0.1:{port}", "--workers",
             "2", "--log-level", "warning", "--access-logfile", str(access),
             "--access-logformat", "%(p)s %(s)s"],
            cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        while server.poll() is None and "Connection in use" not in log.read_text():
            if time.monotonic() > deadline:
                stop(server)
                raise PartTimeout
            with contextlib.suppress(OSError):
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                try:
                    conn.request("GET", "/api/check?url=https%3A%2F%2Fexample.com%2F")
                    conn.getresponse().read()
                finally:
                    conn.close()
            if access.exists() and access.read_text().strip():
                return server, port
            time.sleep(0.1)
        print(f"  port {port} taken meanwhile; trying the next", file=sys.stderr)
        stop(server)


def measure_workers(
    env: dict[str, str], tmp: Path, ports: Iterator[int], filter_path: str, limit: float
) -> dict[str, Any]:
    """gunicorn with 2 workers; WORKER_CHECKS checks answered by each; their memory."""
    access = tmp / "access.log"
    deadline = time.monotonic() + limit
    server, port = start_gunicorn(env, tmp, ports, deadline)
    try:
        counter = iter(range(10**9))
        lock = threading.Lock()
        failures: list[str] = []

        def client(count: int) -> None:
            for _ in range(count):
                with lock:
                    i = next(counter)
                url = urllib.parse.quote(guardbench.clean_url(5 * CHECKS + i), safe="")
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                try:
                    conn.request("GET", f"/api/check?url={url}")
                    response = conn.getresponse()
                    body = response.read()
                    if response.status != 200:
                        failures.append(f"{response.status} {body[:200]!r}")
                finally:
                    conn.close()

        per_worker: Counter[str] = Counter()
        while True:
            # The log file appears with the first request a worker logs.
            with contextlib.suppress(FileNotFoundError), access.open() as lines:
                per_worker = Counter(line.split()[0].strip("<>") for line in lines if line.strip())
            if len(per_worker) >= 2 and min(per_worker.values()) >= WORKER_CHECKS:
                break
            if failures:
                raise RuntimeError(f"/api/check answered {failures[0]}")
            if time.monotonic() > deadline:
                raise PartTimeout
            fewest = min(per_worker.values()) if len(per_worker) >= 2 else 0
            batch = max(200, min(2000, WORKER_CHECKS - fewest))
            threads = [threading.Thread(target=client, args=(batch,)) for _ in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        workers = {}
        for pid_text, count in sorted(per_worker.items()):
            workers[pid_text] = {"checks": count, **smaps(int(pid_text), filter_path)}
            print(f"  worker {pid_text}: most private memory in "
                  f"{workers[pid_text]['private_top']} (MiB)", file=sys.stderr)  # fmt: skip
        return {"workers": list(workers.values())}
    finally:
        stop(server)


def run_feed_child(
    n: int, url: str, env: dict[str, str], tmp: Path, limit: float, shuffled: bool
) -> dict[str, Any]:
    """The feed parts in a child process (killed at the time limit), on its own database."""
    recreate(url)
    out: dict[str, Any] = {}
    var = tmp / "feed-var"
    shutil.rmtree(var, ignore_errors=True)
    var.mkdir()
    env = {**env, "DATABASE_URL": url, "URLGUARD_VAR_DIR": str(var)}
    child = subprocess.Popen(
        [sys.executable, __file__, "--feed-child", str(n), "--database-url", url,
         "--var", str(tmp), *(["--shuffled-feed"] if shuffled else [])],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    try:
        # Each part's clock starts when the one before it ended.
        for part in ("ready", "floor", "first", "churn"):
            started = time.monotonic()
            while True:
                left = limit - (time.monotonic() - started)
                try:
                    line = lines.get(timeout=max(left, 0.01))
                except queue.Empty:
                    line = ""
                if line is None:
                    raise RuntimeError(f"the feed child exited (code {child.wait()})")
                if not line and left <= 0:
                    out[part] = Timeout(f"timeout after {limit:.0f} s")
                    print(f"  feed {part}: {out[part]}", file=sys.stderr)
                    return out
                if line.startswith("RESULT "):
                    found = json.loads(line[len("RESULT ") :])
                    out[found.pop("part")] = found
                    break
                if line:
                    print("  " + line.rstrip(), file=sys.stderr)
        return out
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        recreate(url, drop_only=True)


def relation_blocks() -> str:
    """The tables and indexes that read the most blocks from outside PostgreSQL's shared
    buffers since the statistics were reset, with the blocks found in them: where a
    load pays for pages that no longer fit the cache."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute(
            "SELECT relname, heap_blks_read, heap_blks_hit FROM pg_statio_user_tables "
            "UNION ALL SELECT indexrelname, idx_blks_read, idx_blks_hit "
            "FROM pg_statio_user_indexes ORDER BY 2 DESC NULLS LAST LIMIT 8"
        )
        return ", ".join(f"{name} {read:,}/{hit:,}" for name, read, hit in cursor.fetchall())


def tenths(began: float | None, written: list[tuple[int, float]], n: int) -> str:
    """From (rows written, when) marks after the write `began`: the seconds each tenth
    of `n` rows took to write, so that a write slowing down as the tables grow shows."""
    if began is None:
        return "—"
    times, tenth = [began], 1
    for done, at in written:
        while tenth <= 10 and done >= tenth * n / 10:
            times.append(at)
            tenth += 1
    return ", ".join(f"{b - a:.1f}" for a, b in itertools.pairwise(times))


def feed_ids(n: int, shuffled: bool) -> Iterator[int]:
    """The feed's line numbers 0..n-1, in order or in an order fixed by n."""
    if not shuffled:
        yield from range(n)
        return
    import numpy as np

    order = np.random.default_rng(n).permutation(n)
    for at in range(0, n, 100_000):
        yield from order[at : at + 100_000].tolist()


def feed_child(n: int, tmp: Path, shuffled: bool) -> None:
    """Runs in the child: migrate, write the feed (not measured), first load, churn."""
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django.db import connection

    from urlguard.feeds.refresh import refresh_source
    from urlguard.models import Source
    from urlguard.nodesync import nudge

    def result(part: str, **figures: Any) -> None:
        print("RESULT " + json.dumps({"part": part, **figures}), flush=True)

    silenced = nudge.sending_to(lambda seq: None)  # no node in this run
    silenced.__enter__()  # for the run: held, as one collected would be left
    feed = tmp / "feeds" / f"feed-{n}.txt"
    feed.parent.mkdir(exist_ok=True)
    feedbench.write_feed(feed, feed_ids(n, shuffled))
    result("ready", bytes=feed.stat().st_size)
    result("floor", seconds=feedbench.copy_floor(os.environ["DATABASE_URL"], feed))

    source = Source.objects.create(name="bench", kind="feed", url=f"file://{feed}")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_reset()")
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # VmHWM from here on: the first load's own peak
    stages: dict[str, float] = {}
    written: list[tuple[int, float]] = []

    def mark(stage: str, done: int, total: int) -> None:
        stages.setdefault(stage, time.perf_counter())
        if stage == "adding":
            written.append((done, time.perf_counter()))

    started = time.perf_counter()
    first = refresh_source(source, progress=mark)
    seconds = time.perf_counter() - started
    assert first.status == "ok", first.error
    print(f"first load by step: {feedbench.by_step(started, stages, started + seconds)}")
    by_tenth = tenths(stages.get("writing"), written, n)
    print(f"first load, seconds to write each tenth of the rows: {by_tenth}")
    print(f"first load's blocks per relation, read from outside shared buffers / found in "
          f"them: {relation_blocks()}", flush=True)  # fmt: skip
    result("first", seconds=seconds, rules=first.rules_added, peak_mb=feedbench.peak_rss_mb())

    churn = n // 100
    os.utime(feed, (1, 1))
    kept = (i for i in feed_ids(n, shuffled) if i >= churn)
    feedbench.write_feed(feed, itertools.chain(kept, range(n, n + churn)))
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # VmHWM from here on: the churn refresh's own peak
    started = time.perf_counter()
    second = refresh_source(source)
    seconds = time.perf_counter() - started
    assert second.status == "ok", second.error
    result(
        "churn",
        seconds=seconds,
        added=second.added,
        removed=second.removed,
        peak_mb=feedbench.peak_rss_mb(),
    )
    feed.unlink()


# -- one size ----------------------------------------------------------------------------


def run_size(n: int, args: argparse.Namespace, env: dict[str, str], tmp: Path) -> dict[str, Any]:
    from django.core.management import call_command
    from django.db import connections

    from urlguard.conf import conf
    from urlguard.hotpath.guard import reset_guard
    from urlguard.nodesync import registry

    results: dict[str, Any] = {"load_start": load()}
    wall = time.perf_counter()
    limit = args.part_timeout
    registry.reset()
    reset_guard()
    connections.close_all()
    path = conf.FILTER_PATH
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    if args.feeds_only:
        results["load_end_of_lookups"] = results["load_start"]
        results["feed"] = run_feed_child(
            n, args.feed_database_url, env, tmp, limit, args.shuffled_feed
        )
        results["load_end"] = load()
        results["wall"] = time.perf_counter() - wall
        return results
    recreate(args.database_url)
    call_command("migrate", verbosity=0)
    started = time.perf_counter()
    seed(n)
    print(f"  seeded {n:,} rules with COPY in {time.perf_counter() - started:.0f} s",
          file=sys.stderr)  # fmt: skip

    def rebuild() -> None:
        started = time.perf_counter()
        call_command("rebuild_filter", stdout=io.StringIO())
        results["rebuild"] = time.perf_counter() - started

    timed_part(results, "rebuild", limit, rebuild)
    if isinstance(results.get("rebuild"), Timeout):
        for name in ("open", "check_median", "check_p99", "verify", "workers"):
            results[name] = Timeout("skipped (no file)")
    else:
        from filterengine import ScalingCountingBloomFilter

        results["bytes"] = os.path.getsize(path)
        with ScalingCountingBloomFilter.open(path, readonly=True) as filt:
            results["stages"] = filt.stage_count
        results["open"] = measure_open(path)

        def checks() -> None:
            results["check_median"], results["check_p99"] = measure_checks()

        timed_part(results, "check_median", limit, checks)

        def verify() -> None:
            started = time.perf_counter()
            out = io.StringIO()
            call_command("verify_filter", stdout=out)
            results["verify"] = time.perf_counter() - started
            assert "OK: all" in out.getvalue(), out.getvalue()

        timed_part(results, "verify", limit, verify)
        # This process unmaps the file, so that only the two workers share it (their
        # PSS of it is then half its resident size), and holds no connection open.
        registry.reset()
        reset_guard()
        connections.close_all()
        try:
            results["workers"] = measure_workers(env, tmp, args.ports, path, limit)["workers"]
        except PartTimeout:
            results["workers"] = Timeout(f"timeout after {limit:.0f} s")
    results["load_end_of_lookups"] = load()
    if not args.skip_feeds:
        feeds = run_feed_child(n, args.feed_database_url, env, tmp, limit, args.shuffled_feed)
        results["feed"] = feeds
    results["load_end"] = load()
    results["wall"] = time.perf_counter() - wall
    return results


# -- the table ---------------------------------------------------------------------------


def figure(results: dict[str, Any], key: str) -> Any:
    """results[key] with a dotted path into feed and worker figures."""
    value: Any = results
    for part in key.split("."):
        if isinstance(value, Timeout):
            return value
        if isinstance(value, list):
            value = value[int(part)] if len(value) > int(part) else None
        elif isinstance(value, dict):
            value = value.get(part)
        else:
            return None
        if value is None:
            return None
    return value


# (label, key, format, scale, how it should grow, target): a linear row's target is
# that many times the sizes' ratio (1.2: 10M within 12x of 1M, 4M within 4.8x), a
# flat row's a ratio whatever the sizes, a text one is printed as it is.
ROWS: list[tuple[str, str, str, float, str, float | str | None]] = [
    ("filter file, MiB", "bytes", "{:,.1f}", 1 / MiB, "linear", None),
    ("filter file, bytes per rule", "bytes_per_rule", "{:.2f}", 1, "flat", None),
    ("filter stages", "stages", "{:.0f}", 1, "flat", None),
    ("open the file (read-only), ms", "open", "{:.3f}", 1e3, "flat", None),
    ("Guard.check, clean URL, median µs", "check_median", "{:.1f}", 1, "flat", 1.5),
    ("Guard.check, clean URL, p99 µs", "check_p99", "{:.1f}", 1, "flat", 1.5),
    ("rebuild_filter, s", "rebuild", "{:.1f}", 1, "linear", 1.2),
    ("verify_filter, s", "verify", "{:.1f}", 1, "linear", 1.2),
    ("worker 1 after 10,000 checks: RSS, MiB", "workers.0.rss", "{:.0f}", 1, "", None),
    ("worker 1: PSS (shared pages split), MiB", "workers.0.pss", "{:.0f}", 1, "", None),
    ("worker 1: USS (private pages), MiB", "workers.0.uss", "{:.0f}", 1, "", None),
    ("worker 1: filter file resident (RSS), MiB", "workers.0.filter_rss", "{:.1f}", 1, "", None),
    ("worker 1: filter file PSS, MiB", "workers.0.filter_pss", "{:.1f}", 1, "", None),
    ("worker 2 after 10,000 checks: RSS, MiB", "workers.1.rss", "{:.0f}", 1, "", None),
    ("worker 2: PSS, MiB", "workers.1.pss", "{:.0f}", 1, "", None),
    ("worker 2: USS, MiB", "workers.1.uss", "{:.0f}", 1, "", None),
    ("worker 2: filter file PSS, MiB", "workers.1.filter_pss", "{:.1f}", 1, "", None),
    ("feed floor: psql \\copy of the lines, s", "feed.floor.seconds", "{:.1f}", 1, "linear", None),
    ("feed first load, s", "feed.first.seconds", "{:.1f}", 1, "linear", 1.2),
    ("feed first load, × floor", "feed.first.x_floor", "{:.2f}", 1, "flat", "≤ 4× (1M)"),
    ("feed first load: peak RSS, MB", "feed.first.peak_mb", "{:.0f}", 1, "", "≤ 400"),
    ("feed 1% churn refresh, s", "feed.churn.seconds", "{:.2f}", 1, "linear", None),
    ("feed 1% churn, × floor", "feed.churn.x_floor", "{:.3f}", 1, "flat", "≤ 0.25×"),
    ("feed 1% churn: peak RSS, MB", "feed.churn.peak_mb", "{:.0f}", 1, "", "≤ 400"),
    ("wall time of the size (seeding included), s", "wall", "{:.0f}", 1, "", None),
]


def cell(value: Any, fmt: str, scale: float) -> str:
    if value is None:
        return "—"
    if isinstance(value, Timeout):
        return str(value)
    return fmt.format(value * scale)


def number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def derive(n: int, results: dict[str, Any]) -> None:
    """The figures computed from others: bytes per rule, the feed's times per floor."""
    if isinstance(results.get("bytes"), int):
        results["bytes_per_rule"] = results["bytes"] / n
    floor = figure(results, "feed.floor.seconds")
    for part in ("first", "churn"):
        seconds = figure(results, f"feed.{part}.seconds")
        if number(floor) and number(seconds) and floor > 0:
            results["feed"][part]["x_floor"] = seconds / floor


def table(sizes: list[int], runs: list[dict[str, Any]]) -> str:
    """Each figure per size, the ratios of consecutive sizes and of each size above
    the reference (1M when measured, else the smallest) to it, and the targets."""
    for n, results in zip(sizes, runs, strict=True):
        derive(n, results)
    labels = [size_label(n) for n in sizes]
    steps = [(i - 1, i) for i in range(1, len(sizes))]
    ref = sizes.index(1_000_000) if 1_000_000 in sizes else 0
    to_ref = [(ref, i) for i in range(ref + 1, len(sizes))]
    steps += [pair for pair in to_ref if pair not in steps]
    step_names = [f"{labels[b]}/{labels[a]}" for a, b in steps]
    ref_names = ", ".join(f"{labels[b]}/{labels[a]}" for a, b in to_ref)
    head = [
        "figure",
        *labels,
        *step_names,
        "should grow",
        f"target ({ref_names})" if to_ref else "target",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, key, fmt, scale, grows, target in ROWS:
        values = [figure(r, key) for r in runs]
        if all(v is None for v in values):
            continue
        ratios = []
        for a, b in steps:
            va, vb = values[a], values[b]
            ratios.append(f"{vb / va:.2f}×" if number(va) and number(vb) and va > 0 else "—")
        expected = {"linear": "× size", "flat": "flat"}.get(grows, "")
        if isinstance(target, str):
            goal = target
        elif target and grows == "linear":
            goal = " / ".join(f"≤ {target * sizes[b] / sizes[a]:.3g}×" for a, b in to_ref)
        else:
            goal = f"≤ {target:g}×" if target else ""
        lines.append(
            "| " + " | ".join([label, *(cell(v, fmt, scale) for v in values), *ratios, expected,
                               goal]) + " |"
        )  # fmt: skip
    return "\n".join(lines)


# -- main --------------------------------------------------------------------------------


def settings_module(tmp: Path) -> None:
    """The service's settings with what a bench run needs: /api/check not rate-limited
    (one client address makes every request), file:// feeds read from the run's
    directory, and feeds up to 10M entries accepted."""
    (tmp / "scale_settings.py").write_text(
        "from urlguard_service.settings import *  # noqa: F403\n"
        "URLGUARD = {**URLGUARD,  # noqa: F405\n"
        "    'API_OPEN_RATE': '1000000000/s',\n"
        f"    'FEED_FILE_ROOT': {str(tmp / 'feeds')!r},\n"
        "    'FEED_MAX_BYTES': 8 * 1024**3,\n"
        "    'FEED_MAX_ENTRIES': 50_000_000,\n"
        "    'FEED_DEADLINE': 24 * 3600,\n"
        "    'FEED_CLAIM_TIMEOUT': 24 * 3600,\n"
        "    # The web workers of a deployment with a broker: no upkeep thread of their own\n"
        "    # (catch-up, verify, feed refreshes), which beat schedules on a Celery worker.\n"
        "    'EMBEDDED_CATCH_UP': False,\n"
        "    'FEED_EMBEDDED_REFRESH': False,\n"
        "}\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100k,1M,10M", help="e.g. 100k,1M,10M")
    parser.add_argument("--skip-feeds", action="store_true", help="no feed first load and churn")
    parser.add_argument(
        "--shuffled-feed",
        action="store_true",
        help="the feed's lines in a random order (fixed by the size), not by number",
    )
    parser.add_argument(
        "--feeds-only", action="store_true", help="only the feed parts (no rules seeded, no file)"
    )
    parser.add_argument(
        "--database-url",
        default="postgres://postgres@127.0.0.1:5432/urlguard_bench_scale",
        help="a database of this bench's own: emptied for each size (created if "
        "missing; its tables dropped at the end); the feed parts use <name>_feed likewise",
    )
    parser.add_argument(
        "--part-timeout", type=float, default=1800, help="seconds each part may take"
    )
    parser.add_argument("--port", type=int, default=18500, help="first port to try for gunicorn")
    parser.add_argument("--feed-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--var", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.feed_child is not None:
        feed_child(args.feed_child, Path(args.var), args.shuffled_feed)
        return

    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    server, name = split_url(args.database_url)
    args.feed_database_url = with_name(args.database_url, f"{name}_feed")
    tmp = Path(tempfile.mkdtemp(prefix="urlguard-bench-scale-"))
    (tmp / "var").mkdir()
    (tmp / "feeds").mkdir()
    settings_module(tmp)
    env = {
        **{k: v for k, v in os.environ.items()
           if k not in ("CELERY_BROKER_URL", "URLGUARD_FILTER_PATH", "CACHE_URL")},
        "DATABASE_URL": args.database_url,
        "URLGUARD_VAR_DIR": str(tmp / "var"),
        "DJANGO_SETTINGS_MODULE": "scale_settings",
        "DJANGO_DEBUG": "0",
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "PYTHONPATH": os.pathsep.join([str(tmp), str(ROOT)]),
    }  # fmt: skip
    for key in ("CELERY_BROKER_URL", "URLGUARD_FILTER_PATH", "CACHE_URL"):
        os.environ.pop(key, None)
    os.environ.update(env)
    sys.path.insert(0, str(tmp))
    import django

    recreate(args.database_url)
    django.setup()
    args.ports = iter(range(args.port, args.port + 100))
    runs: list[dict[str, Any]] = []
    done: list[int] = []
    try:
        for n in sizes:
            free = free_bytes_for_postgres(args.database_url)
            need = 2 * n * DB_BYTES_PER_RULE * (1 if args.skip_feeds else 2)
            local = shutil.disk_usage(tmp).free
            if (free is not None and free < need) or local < n * 200:
                print(f"{size_label(n)}: skipped, too little disk (PostgreSQL free "
                      f"{(free or 0) / 2**30:.1f} GiB, want {need / 2**30:.1f} GiB)",
                      file=sys.stderr)  # fmt: skip
                continue
            print(f"{size_label(n)} rules: load average {load()}", file=sys.stderr)
            results = run_size(n, args, env, tmp)
            print(f"  {size_label(n)} done in {results['wall']:.0f} s", file=sys.stderr)
            # Kept in the log should a later size fail: the table is printed at the end.
            print("RESULTS " + json.dumps({"size": n, **results}, default=str), file=sys.stderr)
            runs.append(results)
            done.append(n)
    finally:
        from django.db import connections

        connections.close_all()
        recreate(args.database_url, drop_only=True)
        shutil.rmtree(tmp, ignore_errors=True)

    from django.db import connection

    from urlguard.conf import conf

    print()
    print(
        f"Scaling on PostgreSQL {connection.pg_version // 10000}, {os.cpu_count()} cores, "
        f"error rate {conf.FILTER_ERROR_RATE}, REBUILD_HEADROOM {conf.REBUILD_HEADROOM}; "
        f"load average (1, 5, 15 min) per size, at its start / after the lookups / at its end:"
    )
    for n, results in zip(done, runs, strict=True):
        print(
            f"  {size_label(n)}: {results['load_start']} / {results['load_end_of_lookups']} / "
            f"{results['load_end']}"
        )
    print()
    print(table(done, runs))
    print()
    print(f"command: {' '.join(sys.argv)}")


if __name__ == "__main__":
    main()
