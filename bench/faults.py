"""Fault injection, end to end: the filter file and its upkeep under the faults of
the "filter file under faults" report, replayed against gunicorn (2 workers) on the
embedded default (SQLite, Celery in-process), plus a Celery worker on a redis-server
of its own for the broker outage. Prints one row per scenario: what clients saw and
how long until every answer was right again.

    .venv/bin/python bench/faults.py [--rules 2000] [--port 18300] [--catchup 5]

On demand, not a test. Everything runs in a throw-away var dir; the shared
PostgreSQL/Redis are never touched (the broker scenarios use their own sockets).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SETTINGS = """
from urlguard_service.settings import *  # noqa: F403
URLGUARD = {{
    **URLGUARD,
    "CATCHUP_INTERVAL": {catchup},
    "VERIFY_INTERVAL": 0,
    "API_OPEN_RATE": "1000000/s",
    "READY_MAX_LAG_SECONDS": 2,
}}
"""

rows: list[tuple[str, str, str]] = []


def row(scenario: str, seen: str, outcome: str) -> None:
    rows.append((scenario, seen, outcome))
    print(f"  {scenario}: {seen} | {outcome}", flush=True)


class Site:
    """gunicorn with 2 workers on the throw-away var dir."""

    def __init__(self, env: dict[str, str], port: int, log: Path) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self._log = open(log, "w")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            [
                str(ROOT / ".venv/bin/gunicorn"),
                "urlguard_service.wsgi",
                "-w",
                "2",
                "-b",
                f"127.0.0.1:{port}",
                "--timeout",
                "30",
            ],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                self.check("http://warm-up.example/")
                break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
        for _ in range(20):  # both workers have served (and started their upkeep thread)
            self.check("http://warm-up.example/")

    def check(self, url: str) -> dict:
        query = urllib.parse.urlencode({"url": url})
        try:
            with urllib.request.urlopen(f"{self.base}/api/check?{query}", timeout=10) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 429:  # a rate limit: wait as told
                time.sleep(float(exc.headers.get("Retry-After", "1")))
                return self.check(url)
            return {"status": exc.code, "blocked": None, "degraded": None}

    def every_worker(self, url: str, want: Callable[[dict], bool], n: int = 20) -> bool:
        """`n` answers in a row (spread over both workers) satisfy `want`."""
        return all(want(self.check(url)) for _ in range(n))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=20)
        self._log.close()


def until(predicate: Callable[[], bool], timeout: float) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(0.05)
    return None


def seconds(value: float | None, timeout: float) -> str:
    return f"{value:.2f} s" if value is not None else f"not within {timeout:g} s"


def blocked(answer: dict) -> bool:
    return answer.get("blocked") is True and answer.get("degraded") is False


def blocked_any(answer: dict) -> bool:
    return answer.get("blocked") is True


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rules", type=int, default=2000)
    parser.add_argument("--port", type=int, default=18300)
    parser.add_argument("--catchup", type=float, default=5.0, help="CATCHUP_INTERVAL, s")
    parser.add_argument(
        "--costs-only", action="store_true", help="only the costs of the reader's file check"
    )
    parser.add_argument(
        "--long-writes", type=int, default=100_000, help="rules of the killed refresh and revert"
    )
    args = parser.parse_args()
    check_costs()
    if args.costs_only:
        return

    tmp = Path(tempfile.mkdtemp(prefix="urlguard-faults-"))
    var = tmp / "var"
    var.mkdir()
    (tmp / "faults_settings.py").write_text(SETTINGS.format(catchup=args.catchup))
    path = var / "filter.bin"
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")},
        "PYTHONPATH": f"{tmp}:{ROOT}",
        "DJANGO_SETTINGS_MODULE": "faults_settings",
        "URLGUARD_VAR_DIR": str(var),
        "URLGUARD_FILTER_PATH": str(path),
    }
    os.environ.update(env)
    sys.path.insert(0, str(tmp))
    import django

    django.setup()
    from django.core.management import call_command

    from filterengine import ScalingCountingBloomFilter, fileformat
    from urlguard.nodesync import sync
    from urlguard.writepath import changes
    from urlguard_service.celery import app as celery_app

    call_command("migrate", verbosity=0)
    listed = [f"listed{i}.example.net" for i in range(args.rules)]
    changes.add_rules(listed, source="bench")
    sync.rebuild(str(path))
    site = Site(env, args.port, tmp / "gunicorn.log")
    print(f"gunicorn -w 2 on {site.base}, {args.rules:,} rules, CATCHUP_INTERVAL={args.catchup:g}")
    probe = f"http://{listed[7]}/x"
    assert site.every_worker(probe, blocked), "the listed probe is not blocked at start"
    counter = 0

    def new_rule() -> str:
        nonlocal counter
        counter += 1
        return changes.add_rule(f"new{counter}.example.org", category="spam").expression

    try:
        # 1. The file removed, moved over, its magic corrupted; then rebuilt.
        for name, damage in (
            ("rm filter.bin; rebuild_filter", lambda: path.unlink()),
            (
                "mv another filter over it; rebuild_filter",
                lambda: (
                    ScalingCountingBloomFilter.build(
                        str(var / "other.bin"), [], capacity=1000, error_rate=0.01
                    ),
                    os.replace(var / "other.bin", path),
                ),
            ),
            ("magic corrupted in place; rebuild_filter", lambda: _corrupt_magic(path)),
        ):
            damage()
            call_command("rebuild_filter", verbosity=0)
            rule = new_rule()
            url = f"http://{rule.rstrip('/')}/x"
            first = site.check(url)
            took = until(lambda url=url: site.every_worker(url, blocked), 10)
            row(
                name,
                f"a rule added afterwards: first answer blocked={first['blocked']}, "
                f"degraded={first['degraded']}",
                f"blocked in every worker after {seconds(took, 10)}",
            )

        # 2. A writer killed mid-change (a dirty file).
        subprocess.run([sys.executable, "-c", _DIES_MID_CHANGE, str(path)], env=env, check=False)
        rule = changes.add_rule("after-crash.example.org", category="spam").expression
        url = f"http://{rule.rstrip('/')}/x"
        degraded = until(lambda: site.every_worker(url, blocked_any), 10)
        repaired = until(lambda: site.every_worker(url, blocked), 20)
        row(
            "writer killed mid-change (dirty file)",
            f"a rule committed after the crash blocked (degraded) after {seconds(degraded, 10)}",
            f"rebuilt, answered from the file again after {seconds(repaired, 20)}",
        )

        # 3. Counters zeroed in place (tampering, bit rot): header intact, is_clean.
        with open(path, "r+b") as f:
            f.seek(fileformat.DATA_OFFSET)
            f.write(bytes(os.path.getsize(path) - fileformat.DATA_OFFSET))
        passed = 0 if site.check(probe)["blocked"] else 1
        took = until(lambda: site.every_worker(probe, blocked), 4 * args.catchup + 10)
        row(
            "all counters zeroed in place",
            f"listed rules passed ({passed}/1 probe) until the catch-up's spot check",
            f"found, rebuilt, blocked again after {seconds(took, 4 * args.catchup + 10)}",
        )

        # 4. Four processes facing an unreadable file: the two gunicorn workers'
        # upkeep threads and two `sync_filter` started together.
        log = tmp / "gunicorn.log"
        seen = len(log.read_text())
        _corrupt_magic(path)
        both = [
            subprocess.Popen(
                [sys.executable, "manage.py", "sync_filter"],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for _ in range(2)
        ]
        outputs = [p.communicate(timeout=120)[0] for p in both]
        time.sleep(2)  # the upkeep threads look every second (WATCH_SECONDS)
        texts = [*outputs, log.read_text()[seen:]]
        rebuilds = sum(t.count("rebuilding filter") for t in texts)
        row(
            "unreadable file, 2 gunicorn workers + 2 sync_filter",
            "-",
            f"{rebuilds} rebuild(s) on the node",
        )

        # 5. Read-only diagnostics where the filter directory cannot be written.
        blocker = tmp / "not-a-directory"
        blocker.write_text("")
        ro_env = {**env, "URLGUARD_FILTER_PATH": str(blocker / "filter.bin")}
        results = {
            name: manage(ro_env, *cmd)
            for name, cmd in (
                ("filter_info", ["filter_info"]),
                ("check_url", ["check_url", probe]),
                ("sync_filter", ["sync_filter"]),
            )
        }
        row(
            "filter dir not writable: diagnostics",
            ", ".join(
                f"{name} {'E001' if 'urlguard.E001' in r.stderr else 'ran'} (exit {r.returncode})"
                for name, r in results.items()
            ),
            "read-only diagnostics run; commands that write refuse",
        )

        # 6. A broker that takes connections and never answers.
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        saved = {k: celery_app.conf[k] for k in ("task_always_eager", "broker_url")}
        try:
            celery_app.conf.update(
                task_always_eager=False,
                broker_url=f"redis://127.0.0.1:{listener.getsockname()[1]}/0",
            )
            started = time.monotonic()
            new_rule()
            took = time.monotonic() - started
            from urlguard.nodesync import nudge

            words = nudge.when_applied()
        finally:
            celery_app.conf.update(saved)
            listener.close()
        row(
            "hung broker (accepts, never answers)",
            f"add_rule returned after {took:.2f} s, edit saved",
            f"admin says: {words[:60]}...",
        )

        # 8. An older file put in place of the live one, by another process.
        for how in ("mv", "cp"):
            row(*_older_file(site, path, tmp, new_rule, how))

        # 9. 20 `cp` / `truncate` / `: >` onto the live file while clients check.
        row(*_overwrites_under_load(site, path, tmp, listed, log=tmp / "gunicorn.log"))

        # 10. The supported restore, under load.
        row(*_restore_under_load(site, env, path, tmp, new_rule))

        # 11. A rebuild killed with SIGKILL: its temp file, until the next catch-up.
        row(*_killed_rebuild(env, path, args.catchup))

        # 12. A worker killed with SIGKILL mid-refresh and mid-revert, then restarted.
        for killed in _killed_long_writes(env, tmp, site, args.long_writes):
            row(*killed)

        # 13. The broker stopped and started again under a real worker; then, with
        # that worker alone keeping the file (gunicorn stopped), a backup moved over it.
        site.stop()
        for result in _broker_outage(env, tmp, path, changes):
            row(*result)
    finally:
        site.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    print()
    width = max(len(r[0]) for r in rows)
    seen_w = max(len(r[1]) for r in rows)
    print(f"| {'scenario':<{width}} | {'what clients saw':<{seen_w}} | outcome |")
    print(f"|{'-' * (width + 2)}|{'-' * (seen_w + 2)}|---------|")
    for scenario, seen, outcome in rows:
        print(f"| {scenario:<{width}} | {seen:<{seen_w}} | {outcome} |")
    print(f"\nload average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def check_costs() -> None:
    """What the check before each lookup costs (a file truncated under a mapping kills
    the process at the first touch of a missing page: SIGBUS, which Python cannot
    catch), and how often a reader still dies when another process truncates the
    file in the microseconds between the check and the page touches."""
    import timeit

    from filterengine import ScalingCountingBloomFilter

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "f.bin")
        keys = [f"k{i}.example/" for i in range(100_000)]
        ScalingCountingBloomFilter.build(
            path, ((k, i) for i, k in enumerate(keys)), capacity=100_000, error_rate=0.01
        )
        f = ScalingCountingBloomFilter.open(path, readonly=True)
        fd = f._view.fd
        exprs = [f"a.b.example.org/{i}" for i in range(10)]
        contains = f.contains

        def per_call(fn, number):
            return min(timeit.repeat(fn, number=number, repeat=7)) / number * 1e6

        figures = {
            "os.fstat (the other way to see the size)": per_call(lambda: os.fstat(fd), 200_000),
            "os.pread of 1 byte (the check before)": per_call(lambda: os.pread(fd, 1, 8), 200_000),
            "os.lseek to the end (the check now)": per_call(
                lambda: os.lseek(fd, 0, os.SEEK_END), 200_000
            ),
            "contains(): check + probe": per_call(lambda: contains("absent.example/"), 200_000),
            "one URL's 10 keys, 10 x contains()": per_call(
                lambda: [e for e in exprs if contains(e)], 20_000
            ),
            "one URL's 10 keys, maybe_present() (1 check)": per_call(
                lambda: f.maybe_present(exprs), 20_000
            ),
        }
        f.close()
        print("costs of the reader's file check (us per call, min of 7 runs):")
        for name, us in figures.items():
            print(f"  {name:<48} {us:8.3f}")
        for busy in (0.0, 0.0005):
            deaths = _truncations_against_a_reader(path, busy)
            row(
                "20 truncations, a reader process looking up "
                + ("in a tight loop" if not busy else "every 0.5 ms (a request's pace)"),
                f"{deaths} of 20 truncations killed the reader (SIGBUS)",
                "the window between the check and the page touches",
            )


_READER = textwrap.dedent("""
    import sys, time
    from filterengine import ScalingCountingBloomFilter, FilterFileError
    path, busy = sys.argv[1], float(sys.argv[2])
    exprs = [f"x{i}.example.org/a/b" for i in range(10)]
    f = None
    print("ready", flush=True)
    while True:
        try:
            if f is None:
                f = ScalingCountingBloomFilter.open(path, readonly=True)
            f.maybe_present(exprs)
        except (FilterFileError, OSError):
            f = None
        if busy:
            until = time.perf_counter() + busy
            while time.perf_counter() < until:
                pass
""")


def _truncations_against_a_reader(path: str, busy: float) -> int:
    backup = path + ".backup"
    shutil.copyfile(path, backup)

    def reader() -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", _READER, path, str(busy)], stdout=subprocess.PIPE, cwd=ROOT
        )
        proc.stdout.readline()
        time.sleep(0.2)
        return proc

    proc, deaths = reader(), 0
    try:
        for _ in range(20):
            subprocess.run(["truncate", "-s", "0", path], check=True)
            subprocess.run(["cp", backup, path], check=True)
            time.sleep(0.1)
            if proc.poll() is not None:
                deaths += 1
                proc = reader()
    finally:
        proc.kill()
        proc.wait()
    return deaths


class Load:
    """Client threads checking URLs against the site until stopped: what a real
    request rate looks like to the workers. Counts answers, failed requests
    (reset, refused, 5xx) and wrong answers (a listed URL passed undegraded)."""

    def __init__(self, site: Site, listed: list[str], threads: int = 4) -> None:
        self.site, self.listed = site, listed
        self.answers = self.failed = self.wrong = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(threads)]
        for t in self._threads:
            t.start()

    def _run(self, seed: int) -> None:
        i = seed
        while not self._stop.is_set():
            i += 7
            url = f"http://{self.listed[i % len(self.listed)]}/p{i}"
            try:
                answer = self.site.check(url)
            except OSError:
                self.failed += 1
                continue
            if answer.get("status", 200) >= 500:
                self.failed += 1
            elif answer.get("blocked") is False and answer.get("degraded") is False:
                self.wrong += 1
            self.answers += 1

    def stop(self) -> str:
        self._stop.set()
        for t in self._threads:
            t.join(30)
        return f"{self.answers:,} answers, {self.failed} failed requests, {self.wrong} wrong"


def _older_file(site: Site, path: Path, tmp: Path, new_rule, how: str) -> tuple[str, str, str]:
    """A backup taken, a rule added (blocked everywhere), the backup put back."""
    backup = tmp / "backup.bin"
    subprocess.run(["cp", str(path), str(backup)], check=True)
    rule = new_rule()
    url = f"http://{rule.rstrip('/')}/x"
    until(lambda: site.every_worker(url, blocked), 10)
    subprocess.run([how, str(backup), str(path)], check=True)
    started = time.monotonic()
    wrong = answered = 0
    while time.monotonic() - started < 3:
        answer = site.check(url)
        answered += 1
        wrong += answer.get("blocked") is False
    took = until(lambda: site.every_worker(url, blocked), 10)
    return (
        f"older file put in place ({how} backup.bin filter.bin)",
        f"the rule added after the backup: {wrong} of {answered} answers passed it in 3 s",
        f"answered from the file (caught up) after {seconds(took, 10)} more",
    )


_OVERWRITES = (
    ("cp", lambda path, backup: ["cp", str(backup), str(path)]),
    ("truncate", lambda path, backup: ["truncate", "-s", "0", str(path)]),
    (": >", lambda path, backup: ["sh", "-c", ': > "$0"', str(path)]),
    ("cp", lambda path, backup: ["cp", str(backup), str(path)]),
)


def _sigbus(log: Path) -> int:
    return log.read_text(errors="replace").count("SIGBUS")


def _overwrites_under_load(
    site: Site, path: Path, tmp: Path, listed: list[str], log: Path
) -> tuple[str, str, str]:
    backup = tmp / "backup.bin"
    subprocess.run(["cp", str(path), str(backup)], check=True)
    killed_before = _sigbus(log)
    load = Load(site, listed)
    try:
        time.sleep(1)
        for event in range(20):
            _, command = _OVERWRITES[event % len(_OVERWRITES)]
            subprocess.run(command(path, backup), check=True)
            time.sleep(0.5)  # the catch-up rebuilds a truncated file meanwhile
        time.sleep(2)
    finally:
        seen = load.stop()
    return (
        "20 cp / truncate / : > onto the live file under load",
        seen,
        f"{_sigbus(log) - killed_before} worker(s) killed by SIGBUS",
    )


def _restore_under_load(
    site: Site, env: dict[str, str], path: Path, tmp: Path, new_rule
) -> tuple[str, str, str]:
    backup = tmp / "restore.bin"
    subprocess.run(["cp", str(path), str(backup)], check=True)
    rule = new_rule()
    url = f"http://{rule.rstrip('/')}/x"
    until(lambda: site.every_worker(url, blocked), 10)
    load = Load(site, [rule.rstrip("/")])
    try:
        started = time.monotonic()
        done = manage(env, "restore_filter", str(backup))
        took = time.monotonic() - started
    finally:
        seen = load.stop()
    return (
        "manage.py restore_filter backup.bin, under load",
        f"{seen} (the rule added after the backup)",
        f"exit {done.returncode} in {took:.2f} s: {done.stdout.strip()[:70]}",
    )


_REBUILD_THEN_HANG = textwrap.dedent("""
    import os, sys
    def pairs():
        for i in range(10**7):
            yield f"slow{i}.example/", i
            if i == 1000:
                print("written", flush=True)
                os.kill(os.getpid(), 9)
    from filterengine import ScalingCountingBloomFilter
    ScalingCountingBloomFilter.build(sys.argv[1], pairs(), capacity=200000, error_rate=0.01)
""")


def _killed_rebuild(env: dict[str, str], path: Path, catchup: float) -> tuple[str, str, str]:
    subprocess.run(
        [sys.executable, "-c", _REBUILD_THEN_HANG, str(path)], env=env, cwd=ROOT, check=False
    )
    temps = [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    size = sum(p.stat().st_size for p in temps)
    took = until(lambda: not any(p.exists() for p in temps), 4 * catchup + 10)
    return (
        "rebuild killed with SIGKILL mid-write",
        f"{len(temps)} temp file(s) left, {size / 1e6:.1f} MB",
        f"swept by the catch-up after {seconds(took, 4 * catchup + 10)}",
    )


def _corrupt_magic(path: Path) -> None:
    with open(path, "r+b") as f:
        f.write(b"XXXXXXXX")


_DIES_MID_CHANGE = textwrap.dedent("""
    import os, sys
    from filterengine import ScalingCountingBloomFilter
    f = ScalingCountingBloomFilter.open(sys.argv[1], readonly=False)
    with f.change():
        f.add("torn.example/", 1)
        os._exit(9)
""")


#: The worker's CATCHUP_INTERVAL: long, so that what catches a file up sooner is
#: the worker's watch, not beat.
WORKER_CATCHUP = 120.0


def _broker_outage(
    env: dict[str, str], tmp: Path, path: Path, changes
) -> list[tuple[str, str, str]]:
    name = "broker stopped, rule added, broker back"
    if not shutil.which("redis-server"):
        return [(name, "-", "skipped: no redis-server")]
    (tmp / "worker_settings.py").write_text(SETTINGS.format(catchup=WORKER_CATCHUP))
    from urlguard.nodesync import registry
    from urlguard_service.celery import app as celery_app

    port = 18311
    url = f"redis://127.0.0.1:{port}/0"

    def redis() -> subprocess.Popen:
        proc = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""],
            stdout=subprocess.DEVNULL,
        )
        until(lambda: _reachable(port), 10)
        return proc

    server = redis()
    log = open(tmp / "worker.log", "w")  # noqa: SIM115
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "urlguard_service", "worker", "-Q"]
        + ["urlguard.broadcast,celery", "--concurrency", "1", "-l", "INFO"]
        + ["--schedule", str(tmp / "beat"), "-B"],
        cwd=ROOT,
        env={**env, "CELERY_BROKER_URL": url, "DJANGO_SETTINGS_MODULE": "worker_settings"},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        until(lambda: " ready." in (tmp / "worker.log").read_text(), 60)
        server.terminate()
        server.wait(10)
        saved = {k: celery_app.conf[k] for k in ("task_always_eager", "broker_url")}
        celery_app.conf.update(task_always_eager=False, broker_url=url)
        try:
            rule = changes.add_rule("outage.example.org", category="spam").expression
        finally:
            celery_app.conf.update(saved)
        time.sleep(2.5)  # past READY_MAX_LAG_SECONDS
        from urlguard.nodesync import nudge
        from urlguard.operations import health

        celery_app.conf.update(task_always_eager=False, broker_url=url)
        try:
            ready = health.readiness()
            words = nudge.when_applied()
        finally:
            celery_app.conf.update(saved)
        lag = ready["checks"]["lag"]
        results = [
            (
                "broker down: what the admin and /readyz say",
                f"admin: {words[:70]}...",
                f"/readyz ready={ready['ready']} ({'warning' if 'warning' in lag else 'error'}: "
                f"{lag.get('warning', lag.get('error', ''))[:60]}...)",
            )
        ]
        server = redis()
        took = until(lambda: rule in (registry.get_filter(str(path)) or ()), 60)
        results.append(
            (
                name,
                "edit saved; nudge refused",
                f"applied {seconds(took, 60)} after the broker came back "
                "(Celery's reconnect back-off; CATCHUP_INTERVAL not waited for)",
            )
        )
        # The worker alone keeps the file now (this process only reads it).
        backup = tmp / "worker-backup.bin"
        subprocess.run(["cp", str(path), str(backup)], check=True)
        celery_app.conf.update(task_always_eager=False, broker_url=url)
        try:
            late = changes.add_rule("after-backup.example.org", category="spam").expression
        finally:
            celery_app.conf.update(saved)
        until(lambda: late in (registry.get_filter(str(path)) or ()), 30)
        subprocess.run(["mv", str(backup), str(path)], check=True)
        took = until(lambda: _file_holds(path, late), 30)
        results.append(
            (
                "backup moved over the file of a Celery-worker node",
                "-",
                f"caught up by the worker's watch after {seconds(took, 30)} "
                f"(beat's catch-up every {WORKER_CATCHUP:g} s)",
            )
        )
        return results
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(20)
        log.close()
        server.terminate()
        server.wait(10)


def _file_holds(path: Path, expression: str) -> bool:
    """Whether the file at `path` now (not this process's mapping) holds it."""
    from filterengine import FilterFileError, ScalingCountingBloomFilter

    try:
        with ScalingCountingBloomFilter.open(str(path), readonly=True) as f:
            return expression in f
    except (OSError, FilterFileError):
        return False


def _reachable(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


# -- a worker SIGKILLed in the middle of a long write, then restarted ----------------------


class _Worker:
    """`celery worker` (concurrency 1) on the throw-away var dir and a broker of its own."""

    def __init__(self, env: dict[str, str], tmp: Path, url: str, name: str) -> None:
        self.log_path = tmp / f"{name}.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115 (closed in kill())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "urlguard_service", "worker", "-Q"]
            + ["urlguard.broadcast,celery", "--concurrency", "1", "-l", "INFO"]
            + ["--without-gossip", "--without-mingle", "-n", f"{name}@%h"],
            cwd=ROOT,
            env={**env, "CELERY_BROKER_URL": url},
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        ready = until(lambda: " ready." in self.log_path.read_text(), 60)
        assert ready is not None, self.log_path.read_text()[-3000:]

    def kill(self) -> None:
        """SIGKILL, the whole process group (the pool's child runs the task)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(20)
        self.log.close()


def _killed_long_writes(
    env: dict[str, str], tmp: Path, site: Site, count: int
) -> list[tuple[str, str, str]]:
    """A feed refresh and an admin revert of `count` rules, each on a real worker that
    is SIGKILLed at 30% and started again: how long until the work is finished."""
    names = ("worker SIGKILLed mid-refresh, restarted", "worker SIGKILLed mid-revert, restarted")
    if not shutil.which("redis-server"):
        return [(name, "-", "skipped: no redis-server") for name in names]
    from urlguard.models import ChangeSet, Source
    from urlguard_service.celery import app as celery_app

    port = 18313
    url = f"redis://127.0.0.1:{port}/0"
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""],
        stdout=subprocess.DEVNULL,
    )
    until(lambda: _reachable(port), 10)
    saved = {k: celery_app.conf[k] for k in ("task_always_eager", "broker_url")}
    celery_app.conf.update(task_always_eager=False, broker_url=url)
    found: list[tuple[str, str, str]] = []
    try:
        body = tmp / "big-feed.txt"
        body.write_text("".join(f"killed{i}.example.com\n" for i in range(count)))
        source = Source.objects.create(name="killed-feed", url=f"file://{body}")
        found.append(
            _kill_and_restart(
                names[0],
                env,
                tmp,
                url,
                site,
                count,
                start=lambda: celery_app.send_task("urlguard.feeds.refresh_due_feeds"),
                written=lambda: (
                    ChangeSet.objects.filter(kind="refresh", source=source)
                    .values_list("added", flat=True)
                    .first()
                    or 0
                ),
                again=lambda: celery_app.send_task("urlguard.feeds.refresh_due_feeds"),
                finished=lambda: Source.objects.filter(
                    pk=source.pk, last_status="ok", refreshing_since=None
                ).exists(),
                probe="killed{}.example.com",
                blocked_after=True,
            )
        )
        found.append(_killed_revert(names[1], env, tmp, url, site, source))
    finally:
        celery_app.conf.update(saved)
        server.terminate()
        server.wait(10)
    return found


def _killed_revert(
    name: str, env: dict[str, str], tmp: Path, url: str, site: Site, source
) -> tuple[str, str, str]:
    from urlguard import jobs
    from urlguard.models import AdminJob, ChangeSet, RuleSource

    refresh = ChangeSet.objects.get(kind="refresh", source=source)
    count = RuleSource.objects.filter(source=source).count()
    job_ids: list[int] = []

    def start() -> None:
        job = jobs.create_revert(refresh, actor=None)
        previewed = until(
            lambda: AdminJob.objects.filter(pk=job.pk, state="previewed").exists(), 300
        )
        assert previewed is not None, AdminJob.objects.get(pk=job.pk).message
        jobs.start_revert(AdminJob.objects.get(pk=job.pk), reason="bench")
        job_ids.append(job.pk)

    def written() -> int:
        return (
            ChangeSet.objects.filter(reverts=refresh).values_list("removed", flat=True).first() or 0
        )

    return _kill_and_restart(
        name,
        env,
        tmp,
        url,
        site,
        count,
        start=start,
        written=written,
        again=start,
        finished=lambda: AdminJob.objects.filter(pk=job_ids[-1], state="done").exists(),
        probe="killed{}.example.com",
        blocked_after=False,
        orphan=lambda: AdminJob.objects.filter(pk=job_ids[0], state="failed").exists(),
    )


def _kill_and_restart(
    name: str,
    env: dict[str, str],
    tmp: Path,
    url: str,
    site: Site,
    count: int,
    *,
    start: Callable[[], object],
    written: Callable[[], int],
    again: Callable[[], object],
    finished: Callable[[], bool],
    probe: str,
    blocked_after: bool,
    orphan: Callable[[], bool] | None = None,
) -> tuple[str, str, str]:
    worker = _Worker(env, tmp, url, "long-writes-1")
    try:
        start()
        at = until(lambda: written() >= 0.3 * count, 600)
    finally:
        worker.kill()
    if at is None:
        return name, "-", f"never reached 30% of {count:,} within 600 s"
    done_before = written()
    last = site.check(f"http://{probe.format(count - 1)}/x")
    restarted = time.monotonic()
    worker = _Worker(env, tmp, url, "long-writes-2")
    try:
        booted = time.monotonic() - restarted
        released = until(orphan, 60) if orphan is not None else None
        again()
        took = until(finished, 900)
        total = time.monotonic() - restarted
        answer = site.check(f"http://{probe.format(count - 1)}/x")
        ok = until(
            lambda: site.every_worker(
                f"http://{probe.format(count - 1)}/x",
                lambda a: a.get("blocked") is blocked_after,
            ),
            30,
        )
    finally:
        worker.kill()
    seen = (
        f"killed at {done_before:,} of {count:,}; the last rule answered "
        f"blocked={last.get('blocked')} meanwhile"
    )
    if took is None:
        return name, seen, f"NOT finished within 900 s of the restart (last answer {answer})"
    orphaned = f"job marked failed {released:.2f} s after boot; " if released is not None else ""
    return (
        name,
        seen,
        f"worker booted in {booted:.1f} s; {orphaned}run again: finished {total:.1f} s after "
        f"the restart; every web worker agreed {seconds(ok, 30)} later",
    )


if __name__ == "__main__":
    main()
