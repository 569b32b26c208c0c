"""Benchmark: URLs checked per second through the batch API (`POST /api/check`, 1,000
URLs per request) against the same URLs through the single `GET /api/check?url=`,
both under gunicorn on PostgreSQL and driven by wrk on loopback, and against
`Guard.check_many` in-process on the same database and filter (the ceiling).
Target: the batch API within 2x of the in-process ceiling per URL.

    .venv/bin/python bench/api.py [--rules 100000] [--seconds 5] [--workers 2]
        [--database postgres://postgres@127.0.0.1:5432/postgres]

Makes its own PostgreSQL database (dropped at the end) and var dir; the URLs are
clean product pages with 1% listed ones among them. Rate limits are lifted for the
run. Bounded: ~3 x seconds of load plus the seeding (~1 s per 10,000 rules).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
GUNICORN = str(Path(PY).with_name("gunicorn"))
WRK = "/usr/bin/wrk"
PORTS = range(18850, 18900)
BATCH = 1000

SETTINGS = '''"""urlguard settings for bench/api.py: rate limits lifted."""
from urlguard_service.settings import *  # noqa: F403
from urlguard_service.settings import URLGUARD

URLGUARD = {**URLGUARD, "API_KEY_RATE": "100000000/m", "API_OPEN_RATE": "100000000/m"}
'''

SEED = """
import sys
import django
django.setup()
from urlguard.writepath.changes import add_rules
n = int(sys.argv[1])
add_rules((f"d{i}-spam.com/" for i in range(n)), source="bench", category="spam")
"""

# Guard.check_many over the bench's URLs in requests of BATCH, in one process, on the
# same database and filter as the servers: prints URLs/s (best of three passes).
CEILING = """
import json, sys, time
import django
django.setup()
from urlguard.hotpath.guard import get_guard
urls = json.load(open(sys.argv[1]))
guard = get_guard()
guard.check_many(urls[:BATCH])
best = 0.0
for _ in range(3):
    started = time.perf_counter()
    for i in range(0, len(urls), BATCH):
        guard.check_many(urls[i:i + BATCH])
    best = max(best, len(urls) / (time.perf_counter() - started))
print(best)
""".replace("BATCH", str(BATCH))

BATCH_LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer KEY"
wrk.body = io.open("BODY", "rb"):read("*a")
"""

SINGLE_LUA = """
local paths = {}
for line in io.lines("PATHS") do paths[#paths + 1] = line end
local i = 0
request = function()
  i = i % #paths + 1
  return wrk.format("GET", paths[i])
end
"""


def urls_for(n: int, rules: int) -> list[str]:
    """Clean product pages (10 expressions each), 1 in 100 under a listed domain."""
    out = []
    for i in range(n):
        if i % 100 == 99:
            out.append(f"http://www.d{(i * 7919) % rules}-spam.com/landing?id={i}")
        else:
            out.append(f"https://www.shop{i}.com/c{i % 7}/s{i % 13}/item{i}.html?ref={i % 97}")
    return out


def free_port() -> int:
    for port in PORTS:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    sys.exit(f"no free port in {PORTS.start}-{PORTS.stop - 1}")


def wait_for(port: int, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"gunicorn exited:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"gunicorn did not listen on {port} within 30 s:\n{log.read_text()}")


def wrk(url: str, script: Path, seconds: int, connections: int) -> tuple[float, str, int]:
    done = subprocess.run(
        [WRK, "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script), url],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=True,
    )
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", done.stdout).group(1))
    p99 = re.search(r"99%\s+(\S+)", done.stdout)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", done.stdout)
    socket_errors = re.search(r"Socket errors: (.*)", done.stdout)
    bad = int(errors.group(1)) if errors else 0
    if socket_errors:
        bad += sum(int(n) for n in re.findall(r"\d+", socket_errors.group(1)))
    return rps, p99.group(1) if p99 else "?", bad


def database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


def admin_sql(url: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rules", type=int, default=100_000)
    parser.add_argument("--urls", type=int, default=20_000)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--database", default="postgres://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    if not os.path.exists(WRK):
        sys.exit(f"{WRK} not found: install Debian's wrk")

    tmp = Path(tempfile.mkdtemp(prefix="urlguard-bench-api-"))
    name = f"urlguard_bench_api_{os.getpid()}"
    admin_sql(args.database, f'CREATE DATABASE "{name}"')
    (tmp / "bench_api_settings.py").write_text(SETTINGS)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CELERY_BROKER_URL", "URLGUARD_FILTER_PATH", "PROMETHEUS_MULTIPROC_DIR")
    }
    env.update(
        DATABASE_URL=database(args.database, name),
        URLGUARD_VAR_DIR=str(tmp),
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        DJANGO_SETTINGS_MODULE="bench_api_settings",
        DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost",
        PYTHONPATH=os.pathsep.join([str(tmp), str(ROOT)]),
    )
    proc: subprocess.Popen | None = None

    def manage(*cmd: str) -> str:
        done = subprocess.run(
            [PY, "manage.py", *cmd],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if done.returncode:
            sys.exit(f"manage.py {' '.join(cmd)} failed:\n{done.stdout}{done.stderr}")
        return done.stdout

    try:
        started = time.perf_counter()
        manage("migrate", "--noinput", "-v", "0")
        subprocess.run(
            [PY, "-c", SEED, str(args.rules)],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            timeout=1800,
        )
        manage("rebuild_filter")
        key = manage("create_api_key", "bench").strip()
        seeded = time.perf_counter() - started

        urls = urls_for(args.urls, args.rules)
        (tmp / "urls.json").write_text(json.dumps(urls))
        (tmp / "body.json").write_text(json.dumps({"urls": urls[:BATCH]}))
        (tmp / "paths.txt").write_text(
            "".join(f"/api/check?url={quote(u, safe='')}\n" for u in urls)
        )
        (tmp / "batch.lua").write_text(
            BATCH_LUA.replace("KEY", key).replace("BODY", str(tmp / "body.json"))
        )
        (tmp / "single.lua").write_text(SINGLE_LUA.replace("PATHS", str(tmp / "paths.txt")))

        ceiling = float(
            subprocess.run(
                [PY, "-c", CEILING, str(tmp / "urls.json")],
                cwd=ROOT,
                env=env,
                check=True,
                capture_output=True,
                text=True,
                timeout=600,
            ).stdout
        )

        port = free_port()
        log = tmp / "gunicorn.log"
        proc = subprocess.Popen(
            [
                GUNICORN,
                "urlguard_service.wsgi",
                "-c",
                "python:urlguard_service.gunicornconf",
                "--bind",
                f"127.0.0.1:{port}",
                "--workers",
                str(args.workers),
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            env=env,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
        )
        wait_for(port, proc, log)
        base = f"http://127.0.0.1:{port}/api/check"
        # Sanity: the batch answers 1,000 results with the listed ones blocked.
        request = urllib.request.Request(
            base,
            data=(tmp / "body.json").read_bytes(),
            method="POST",
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            results = json.load(response)["results"]
        blocked = sum(r["blocked"] for r in results)
        assert len(results) == BATCH and blocked == BATCH // 100, (len(results), blocked)

        wrk(base, tmp / "batch.lua", 1, args.connections)  # warm both workers
        wrk(base, tmp / "single.lua", 1, args.connections)
        batch_rps, batch_p99, batch_bad = wrk(
            base, tmp / "batch.lua", args.seconds, args.connections
        )
        single_rps, single_p99, single_bad = wrk(
            base, tmp / "single.lua", args.seconds, args.connections
        )
        batch_urls = batch_rps * BATCH
        load = os.getloadavg()
        print(
            f"\nURLs checked per second: {args.rules:,} rules, {len(urls):,} URLs (1% listed), "
            f"PostgreSQL, gunicorn {args.workers} sync workers, wrk -t2 -c{args.connections} "
            f"-d{args.seconds}s; seeding took {seeded:.0f} s; load average "
            f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs\n"
        )
        print("| path | URLs/s | requests/s | p99 latency | errors | cost per URL vs ceiling |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        print(
            f"| `Guard.check_many` in-process, {BATCH} per call (ceiling, 1 process) | "
            f"{ceiling:,.0f} | - | - | - | 1.00x |"
        )
        print(
            f"| `POST /api/check`, {BATCH} URLs per request | {batch_urls:,.0f} | "
            f"{batch_rps:,.1f} | {batch_p99} | {batch_bad} | {ceiling / batch_urls:.2f}x |"
        )
        print(
            f"| `GET /api/check?url=`, one URL per request | {single_rps:,.0f} | "
            f"{single_rps:,.1f} | {single_p99} | {single_bad} | "
            f"{ceiling / single_rps:.2f}x |"
        )
        verdict = "met" if batch_urls * 2 >= ceiling else "NOT met"
        print(
            f"\nbatch vs single GET: {batch_urls / single_rps:.1f}x the URLs/s; "
            f"target (batch within 2x of the ceiling per URL): {verdict}"
        )
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        try:
            admin_sql(args.database, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except Exception as exc:  # leave the tmp dir for a look; say what is left
            print(f"could not drop database {name}: {exc}", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    try:
        main()
    except urllib.error.URLError as exc:
        sys.exit(f"the server did not answer: {exc}")
