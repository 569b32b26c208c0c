"""Benchmark: URLs checked per second through the batch API (`POST /api/check`, 1,000
URLs per request) against the same URLs through the single `GET /api/check?url=`,
both under gunicorn on PostgreSQL and driven by wrk on loopback, and against
`Guard.check_many` in-process on the same database and filter (the ceiling), with
one `Guard.check` per URL beside it. Target: the batch API within 2x of the
in-process ceiling per URL.

With `--compare REV` the same is measured for the code of git revision REV (checked
out in a temporary worktree, run with this venv) and for this tree, in one run,
alternating between the two, each on its own database seeded alike: the table then
has both and their ratio (target: the batch paths at 2x REV's URLs/s, the single
check no slower).

    .venv/bin/python bench/api.py [--rules 100000] [--seconds 5] [--workers 2]
        [--compare REV] [--rounds 2]
        [--database postgres://postgres@127.0.0.1:5432/postgres]

Makes its own PostgreSQL databases (dropped at the end) and var dirs; the URLs are
clean product pages with 1% listed ones among them. Rate limits are lifted for the
run. Bounded: ~3 x seconds of load per round and tree plus the seeding (~1 s per
10,000 rules per tree).
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
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
GUNICORN = str(Path(PY).with_name("gunicorn"))
WRK = "/usr/bin/wrk"
PORTS = range(18850, 18900)  # --ports
BATCH = 1000

SETTINGS = '''"""urlguard settings for bench/api.py: rate limits lifted."""
from urlguard_service.settings import *  # noqa: F403
from urlguard_service.settings import URLGUARD

URLGUARD = {**URLGUARD, "API_KEY_RATE": "100000000/m", "API_OPEN_RATE": "100000000/m"}
'''

# In each tree's settings folder (first on PYTHONPATH): this venv's editable install
# of ROOT answers for any urlguard module a tree does not have, which would mix two
# revisions in one process. Without it, each tree imports only its own code.
SITECUSTOMIZE = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
"""

# Each tree's own module path first (urlguard's modules moved into sub-packages).
FIND = """
import importlib
def first(*names):
    for name in names[:-1]:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            pass
    return importlib.import_module(names[-1])
"""

SEED = (
    FIND
    + """
import sys
import django
django.setup()
changes = first("urlguard.writepath.changes", "urlguard.changes")
n = int(sys.argv[1])
changes.add_rules((f"d{i}-spam.com/" for i in range(n)), source="bench", category="spam")
"""
)

# In one process, on the same database and filter as the servers: Guard.check_many
# over the bench's URLs in requests of BATCH (URLs/s, best of three passes), and
# one Guard.check per URL, distinct URLs (median µs), bare and as the middleware
# does it (its reading of the Location, then the check). Prints JSON. Runs against
# whichever tree is first on sys.path; a tree without browser_target reads the
# Location with browser_url and the guard reads it again.
IN_PROCESS = (
    FIND
    + """
import json, statistics, sys, time
import django
django.setup()
import urlguard
get_guard = first("urlguard.hotpath.guard", "urlguard.guard").get_guard
canonical = first("urlguard.hotpath.canonical", "urlguard.canonical")
urls = json.load(open(sys.argv[1]))
guard = get_guard()
guard.check_many(urls[:BATCH])
best = 0.0
cpu = float("inf")
for _ in range(3):
    started, cpu0 = time.perf_counter(), time.thread_time()
    for i in range(0, len(urls), BATCH):
        guard.check_many(urls[i:i + BATCH])
    best = max(best, len(urls) / (time.perf_counter() - started))
    cpu = min(cpu, (time.thread_time() - cpu0) / len(urls))
target = getattr(canonical, "browser_target", None)
if target is not None:
    def redirect(url):
        location, parsed = target(url)
        return guard.check(location, parsed)
else:
    def redirect(url):
        return guard.check(canonical.browser_url(url))
def median_us(fn, items):
    clock, out = time.perf_counter_ns, []
    for item in items:
        t0 = clock()
        fn(item)
        out.append((clock() - t0) / 1000)
    return statistics.median(out)
singles = urls[: len(urls) // 2]
for url in singles[:2000]:  # warm the code, not the memo: these come round again below
    guard.check(url)
canonical._cache.clear()
single = median_us(guard.check, singles)
canonical._cache.clear()
canonical._browser_cache.clear()
via_redirect = median_us(redirect, urls[len(urls) // 2 :])
print(json.dumps({"batch": best, "batch_cpu_us": cpu * 1e6, "single_us": single,
                  "redirect_us": via_redirect, "module": urlguard.__file__}))
""".replace("BATCH", str(BATCH))
)

# Each request the next 1,000 of the bench's URLs, round the list: distinct URLs, as
# the in-process ceiling checks them (one body sent again and again would be answered
# from canonical's memo in a revision that fills it for batches).
BATCH_LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer KEY"
local bodies = {}
for n = 0, COUNT - 1 do
  local f = io.open("BODIES" .. n .. ".json", "rb")
  bodies[#bodies + 1] = f:read("*a")
  f:close()
end
local i = 0
request = function()
  i = i % #bodies + 1
  return wrk.format(nil, nil, nil, bodies[i])
end
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


def server_cpu(master: int) -> float:
    """CPU seconds used so far by gunicorn's master and its workers (Linux /proc): the
    server's cost, which other load on the machine does not inflate as it does the
    URLs/s."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # gone meanwhile
            continue
        if int(stat.parent.name) == master or int(fields[1]) == master:
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def wrk(url: str, script: Path, seconds: int, connections: int) -> tuple[float, str, int, int]:
    done = subprocess.run(
        [WRK, "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script), url],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=True,
    )
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", done.stdout).group(1))
    p99 = re.search(r"^\s*99%\s+(\S+)", done.stdout, re.MULTILINE)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", done.stdout)
    socket_errors = re.search(r"Socket errors: (.*)", done.stdout)
    bad = int(errors.group(1)) if errors else 0
    if socket_errors:
        bad += sum(int(n) for n in re.findall(r"\d+", socket_errors.group(1)))
    requests = int(re.search(r"(\d+) requests in", done.stdout).group(1))
    return rps, p99.group(1) if p99 else "?", bad, requests


def database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


def admin_sql(url: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)


@dataclass
class Tree:
    """One revision's code with its own database, var dir and server."""

    label: str
    root: Path
    tmp: Path
    db_name: str
    env: dict[str, str] = field(default_factory=dict)
    key: str = ""
    seeded: float = 0.0
    proc: subprocess.Popen | None = None
    port: int = 0
    runs: dict[str, list[float]] = field(default_factory=dict)
    p99: dict[str, str] = field(default_factory=dict)
    bad: dict[str, int] = field(default_factory=dict)

    def note(self, what: str, value: float) -> None:
        self.runs.setdefault(what, []).append(value)

    def best(self, what: str, *, low: bool = False) -> float:
        return (min if low else max)(self.runs[what])


def set_up(tree: Tree, args: argparse.Namespace, urls: list[str]) -> None:
    """Database, settings, seed, filter file and API key for `tree`; the request files."""
    admin_sql(args.database, f'CREATE DATABASE "{tree.db_name}"')
    tree.tmp.mkdir(mode=0o700)
    (tree.tmp / "bench_api_settings.py").write_text(SETTINGS)
    (tree.tmp / "sitecustomize.py").write_text(SITECUSTOMIZE)
    dropped = (
        "CELERY_BROKER_URL",
        "URLGUARD_FILTER_PATH",
        "PROMETHEUS_MULTIPROC_DIR",
        "PYTHONPATH",
    )
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(
        DATABASE_URL=database(args.database, tree.db_name),
        URLGUARD_VAR_DIR=str(tree.tmp),
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        DJANGO_SETTINGS_MODULE="bench_api_settings",
        DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost",
        # The tree first: this venv's editable install points at ROOT.
        PYTHONPATH=os.pathsep.join([str(tree.tmp), str(tree.root)]),
    )
    tree.env = env
    started = time.perf_counter()
    manage(tree, "migrate", "--noinput", "-v", "0")
    seeding = subprocess.run(
        [PY, "-c", SEED, str(args.rules)],
        cwd=tree.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if seeding.returncode:
        sys.exit(f"{tree.label}: seeding failed:\n{seeding.stderr}")
    manage(tree, "rebuild_filter")
    tree.key = manage(tree, "create_api_key", "bench").strip()
    tree.seeded = time.perf_counter() - started

    tmp = tree.tmp
    (tmp / "urls.json").write_text(json.dumps(urls))
    bodies = range(0, len(urls) - BATCH + 1, BATCH)
    for n, start in enumerate(bodies):
        (tmp / f"body{n}.json").write_text(json.dumps({"urls": urls[start : start + BATCH]}))
    (tmp / "paths.txt").write_text("".join(f"/api/check?url={quote(u, safe='')}\n" for u in urls))
    (tmp / "batch.lua").write_text(
        BATCH_LUA.replace("KEY", tree.key)
        .replace("COUNT", str(len(bodies)))
        .replace("BODIES", str(tmp / "body"))
    )
    (tmp / "single.lua").write_text(SINGLE_LUA.replace("PATHS", str(tmp / "paths.txt")))


def manage(tree: Tree, *cmd: str) -> str:
    done = subprocess.run(
        [PY, "manage.py", *cmd],
        cwd=tree.root,
        env=tree.env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode:
        sys.exit(f"{tree.label}: manage.py {' '.join(cmd)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def in_process(tree: Tree) -> None:
    done = subprocess.run(
        [PY, "-c", IN_PROCESS, str(tree.tmp / "urls.json")],
        cwd=tree.root,
        env=tree.env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode:
        sys.exit(f"{tree.label}: the in-process run failed:\n{done.stderr}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    module = Path(figures.pop("module")).resolve()
    if not module.is_relative_to(tree.root.resolve()):
        sys.exit(f"{tree.label}: imported urlguard from {module}, not from {tree.root}")
    for what, value in figures.items():
        tree.note(what, value)


def start_server(tree: Tree, args: argparse.Namespace) -> None:
    tree.port = free_port()
    log = tree.tmp / "gunicorn.log"
    tree.proc = subprocess.Popen(
        [
            GUNICORN,
            "urlguard_service.wsgi",
            "-c",
            "python:urlguard_service.gunicornconf",
            "--bind",
            f"127.0.0.1:{tree.port}",
            "--workers",
            str(args.workers),
            "--log-level",
            "warning",
        ],
        cwd=tree.root,
        env=tree.env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    wait_for(tree.port, tree.proc, log)
    # Sanity: the batch answers 1,000 results with the listed ones blocked.
    request = urllib.request.Request(
        f"http://127.0.0.1:{tree.port}/api/check",
        data=(tree.tmp / "body0.json").read_bytes(),
        method="POST",
        headers={"Authorization": f"Bearer {tree.key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        results = json.load(response)["results"]
    blocked = sum(r["blocked"] for r in results)
    assert len(results) == BATCH and blocked == BATCH // 100, (tree.label, len(results), blocked)
    base = f"http://127.0.0.1:{tree.port}/api/check"
    wrk(base, tree.tmp / "batch.lua", 1, args.connections)  # warm both workers
    wrk(base, tree.tmp / "single.lua", 1, args.connections)


def over_http(tree: Tree, args: argparse.Namespace) -> None:
    base = f"http://127.0.0.1:{tree.port}/api/check"
    for what, script, per_request in (("POST", "batch.lua", BATCH), ("GET", "single.lua", 1)):
        assert tree.proc is not None
        cpu = server_cpu(tree.proc.pid)
        rps, p99, bad, requests = wrk(base, tree.tmp / script, args.seconds, args.connections)
        cpu = server_cpu(tree.proc.pid) - cpu
        tree.note(f"{what} cpu", cpu / (requests * per_request) * 1e6)
        if rps * per_request >= max(tree.runs.get(what, [0.0])):
            tree.p99[what] = p99  # the best run's
        tree.note(what, rps * per_request)
        tree.bad[what] = tree.bad.get(what, 0) + bad


def stop_server(tree: Tree) -> None:
    proc = tree.proc
    if proc is None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    tree.proc = None


def report(trees: list[Tree], args: argparse.Namespace, urls: list[str]) -> None:
    load = os.getloadavg()
    print(
        f"\nURLs checked per second: {args.rules:,} rules, {len(urls):,} URLs (1% listed), "
        f"PostgreSQL, gunicorn {args.workers} sync workers, wrk -t2 -c{args.connections} "
        f"-d{args.seconds}s, best of {args.rounds} round(s) each; seeding took "
        + ", ".join(f"{t.seeded:.0f} s ({t.label})" for t in trees)
        + f"; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs\n"
    )
    for tree in trees:
        ceiling = tree.best("batch")
        post, get = tree.best("POST"), tree.best("GET")
        print(f"{tree.label}:\n")
        print("| path | URLs/s | CPU µs per URL | p99 latency | errors | cost per URL vs ceiling |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        print(
            f"| `Guard.check_many` in-process, {BATCH} per call (ceiling, 1 process) | "
            f"{ceiling:,.0f} | {tree.best('batch_cpu_us', low=True):.1f} | - | - | 1.00x |"
        )
        for what, name in (
            ("POST", f"`POST /api/check`, {BATCH} URLs per request"),
            ("GET", "`GET /api/check?url=`, one URL per request"),
        ):
            rate = tree.best(what)
            print(
                f"| {name} | {rate:,.0f} | {tree.best(f'{what} cpu', low=True):.1f} | "
                f"{tree.p99.get(what, '?')} | {tree.bad.get(what, 0)} | {ceiling / rate:.2f}x |"
            )
        print(
            "\n(CPU µs per URL: the checking process's; under gunicorn, its master's and "
            "workers' together, not PostgreSQL's.)"
        )
        verdict = "met" if post * 2 >= ceiling else "NOT met"
        print(
            f"\nbatch vs single GET: {post / get:.1f}x the URLs/s; "
            f"target (batch within 2x of the ceiling per URL): {verdict}\n"
        )
    if len(trees) < 2:
        return
    old, new = trees
    print(f"{new.label} against {old.label}, same run:\n")
    print(f"| path | {old.label} | {new.label} | ratio (higher is better for new) |")
    print("| --- | ---: | ---: | ---: |")
    rows = [
        ("`Guard.check_many`, URLs/s (best wall)", "batch", False, "{:,.0f}"),
        ("`Guard.check_many`, CPU µs per URL (best)", "batch_cpu_us", True, "{:.2f}"),
        ("`POST /api/check` x 1,000, URLs/s", "POST", False, "{:,.0f}"),
        ("`POST /api/check` x 1,000, server CPU µs per URL", "POST cpu", True, "{:.2f}"),
        ("`GET /api/check?url=`, URLs/s", "GET", False, "{:,.0f}"),
        ("`GET /api/check?url=`, server CPU µs per URL", "GET cpu", True, "{:.2f}"),
        ("one `Guard.check`, distinct URLs, median µs", "single_us", True, "{:.2f}"),
        ("the redirect's reading + `Guard.check`, median µs", "redirect_us", True, "{:.2f}"),
    ]
    for name, what, low, fmt in rows:
        a, b = old.best(what, low=low), new.best(what, low=low)
        ratio = a / b if low else b / a
        print(f"| {name} | {fmt.format(a)} | {fmt.format(b)} | {ratio:.2f}x |")

    def at_least(what: str, factor: float) -> str:
        low = what.endswith(("cpu", "_us"))
        a, b = old.best(what, low=low), new.best(what, low=low)
        return "met" if (a >= factor * b if low else b >= factor * a) else "NOT met"

    print(
        f"\ntarget (the batch paths at 2x {old.label}): in-process URLs/s "
        f"{at_least('batch', 2)}, CPU {at_least('batch_cpu_us', 2)}; API URLs/s "
        f"{at_least('POST', 2)}, server CPU {at_least('POST cpu', 2)}. Single check no "
        f"slower (within 5%): {at_least('single_us', 1 / 1.05)}. URLs/s compete with the "
        "machine's other load; CPU per URL does not."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rules", type=int, default=100_000)
    parser.add_argument("--urls", type=int, default=20_000)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=None, help="default: 1, or 2 with --compare")
    parser.add_argument("--compare", metavar="REV", help="also measure git revision REV")
    parser.add_argument("--database", default="postgres://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--ports", default="18850-18899", help="FIRST-LAST")
    args = parser.parse_args()
    if not os.path.exists(WRK):
        sys.exit(f"{WRK} not found: install Debian's wrk")
    global PORTS
    first, _, last = args.ports.partition("-")
    PORTS = range(int(first), int(last or first) + 1)
    args.rounds = args.rounds or (2 if args.compare else 1)

    tmp = Path(tempfile.mkdtemp(prefix="urlguard-bench-api-"))
    trees = []
    worktree: Path | None = None
    try:
        if args.compare:
            worktree = tmp / "old"
            rev = subprocess.run(
                ["git", "rev-parse", "--short", args.compare],
                cwd=ROOT,
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            subprocess.run(
                ["git", "worktree", "add", "--detach", str(worktree), args.compare],
                cwd=ROOT,
                check=True,
                capture_output=True,
            )
            trees.append(Tree(f"{args.compare} ({rev})", worktree, tmp / "var-old", ""))
        trees.append(Tree("this tree", ROOT, tmp / "var-new", ""))
        for n, tree in enumerate(trees):
            tree.db_name = f"urlguard_bench_api_{os.getpid()}_{n}"

        urls = urls_for(args.urls, args.rules)
        for tree in trees:
            set_up(tree, args, urls)
        for tree in trees:
            start_server(tree, args)
        # Alternating, so that a change in the machine's load falls on both alike.
        for _ in range(args.rounds):
            for tree in trees:
                in_process(tree)
            for tree in trees:
                over_http(tree, args)
        report(trees, args, urls)
    finally:
        for tree in trees:
            stop_server(tree)
            if tree.db_name:
                try:
                    admin_sql(
                        args.database, f'DROP DATABASE IF EXISTS "{tree.db_name}" WITH (FORCE)'
                    )
                except Exception as exc:  # say what is left
                    print(f"could not drop database {tree.db_name}: {exc}", file=sys.stderr)
        if worktree is not None:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(worktree)],
                cwd=ROOT,
                capture_output=True,
            )
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    try:
        main()
    except urllib.error.URLError as exc:
        sys.exit(f"the server did not answer: {exc}")
