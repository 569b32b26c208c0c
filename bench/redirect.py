"""Benchmark: the short-link redirect beside /api/check and a static file, in one
run, on SQLite and on PostgreSQL, under gunicorn (2 sync workers) driven by wrk.

    .venv/bin/python bench/redirect.py [--seconds 5] [--rounds 2]
    .venv/bin/python bench/redirect.py --guard-cost     # the guard on/off A/A run

Per database: 16 connections on one link (the viral case), 16 over 1,000 links,
64 on one link, /api/check at 16 and 64, a static file through WhiteNoise at 16
(runs rotated over the rounds so that drift hits all alike); then a graceful
restart (SIGHUP) under load, counting the 302s wrk received against the clicks
stored; on PostgreSQL (a private cluster this script starts with initdb/pg_ctl in
a temp dir and removes) the database stopped for 10 s under load: every cached
link must keep answering 302, none may answer 500, and the clicks of the outage
are written once it is back. In-process costs (cache hit, click append, a Redis
round trip) explain the choice of in-process buffers. Targets: issue "the
redirect at full speed" (printed beside the figures).

Bounded: ~2 x (6 x rounds x seconds + 40) s of load plus set-up; stops by itself.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
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
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
GUNICORN = str(Path(PY).with_name("gunicorn"))
WRK = "/usr/bin/wrk"
PG_BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)), None)
# This bench's port range (TEAM.md): servers and the private PostgreSQL.
PORTS = iter(range(18700, 18800))
LINKS = 1000
API_PATH = "/api/check?url=https://www.python.org/"
STATIC_PATH = "/static/admin/css/base.css"

# Every case builds each request in Lua (the same wrk cost for one path or 1,000):
# a random path per request ("random", seeded per thread) or each path in turn
# ("cycle", the warm-up). Counts statuses per thread, a 503 with its Retry-After
# (30: the view's "link not cached, database away"; 60: the guard's "unchecked").
LUA = """
local paths = {%(paths)s}
local pick = "%(pick)s"
counts = {}  -- global: done() reads each thread's copy
local threads = {}
local i = 0
function setup(thread)
  table.insert(threads, thread)
  thread:set("id", #threads)
end
function init(args)
  counts = {}
  math.randomseed(os.time() * 7919 + id)
  i = id * 7
end
function request()
  if pick == "cycle" then i = i %% #paths + 1 else i = math.random(#paths) end
  return wrk.format("GET", paths[i])
end
function response(status, headers, body)
  local key = tostring(status)
  if status == 503 then key = key .. "/retry-after-" .. (headers["Retry-After"] or "none") end
  counts[key] = (counts[key] or 0) + 1
end
function done(summary, latency, requests)
  local total = {}
  for _, t in ipairs(threads) do
    for key, n in pairs(t:get("counts")) do total[key] = (total[key] or 0) + n end
  end
  local out = {}
  for key, n in pairs(total) do table.insert(out, key .. "=" .. n) end
  io.write("STATUS " .. table.concat(out, " ") .. "\\n")
end
"""

SEED_LINKS = (
    f"LINKS = {LINKS}\n"
    """
import django
django.setup()
from urlguard.models import ShortLink
ShortLink.objects.bulk_create(
    [ShortLink(slug=f"b{i}", destination=f"https://www.example{i % 97}.org/page/{i}")
     for i in range(LINKS)]
    + [ShortLink(slug="restart", destination="https://www.python.org/restart")]
)
"""
)

# In-process costs: a cached link, a buffered click, and the Redis round trip an
# out-of-process buffer or cache would pay per request.
COSTS = """
import statistics, time
import django
django.setup()
from django.test import RequestFactory
from urlguard.shortlinks import clicks, linkcache
from urlguard.runtime import stats
stats.set_background(False)
linkcache.set_background(False)
link = linkcache.get("python")
request = RequestFactory().get("/python", REMOTE_ADDR="192.0.2.1")
def timed(fn, n=20000):
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns(); fn(); samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples) / 1000
hit = timed(lambda: linkcache.get("python"))
click = timed(lambda: clicks.record_click(request, link))
stats.discard()
try:
    import redis
    r = redis.Redis(host="127.0.0.1", port=6379, socket_timeout=1)
    r.ping()
    rtt = "%.1f" % timed(lambda: r.get("urlguard-bench-redirect-no-such-key"), 5000)
except Exception as exc:
    rtt = "n/a (%s)" % type(exc).__name__
print(f"{hit:.2f} {click:.2f} {rtt}")
"""


def port() -> int:
    for candidate in PORTS:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            return candidate
    sys.exit("no free port in 18700-18799")


def manage(env: dict[str, str], *args: str) -> None:
    done = subprocess.run(
        [PY, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    if done.returncode:
        sys.exit(f"manage.py {' '.join(args)} failed:\n{done.stdout}{done.stderr}")


def python(env: dict[str, str], code: str) -> str:
    done = subprocess.run(
        [PY, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    if done.returncode:
        sys.exit(f"python failed:\n{done.stdout}{done.stderr}")
    return done.stdout.strip()


class PrivatePostgres:
    """A throwaway PostgreSQL cluster in a temp dir (never the shared server)."""

    def __init__(self, base: Path) -> None:
        if PG_BIN is None:
            sys.exit("PostgreSQL server binaries not found under /usr/lib/postgresql")
        self.base = base
        self.dir = base / "pg"
        self.port = port()
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def run(self, *args: str) -> None:
        subprocess.run(
            [*self.as_user, *args], check=True, capture_output=True, text=True, timeout=120
        )

    def init(self) -> str:
        self.dir.mkdir()
        if self.as_user:
            os.chmod(self.dir.parent, 0o755)
            shutil.chown(self.dir, "postgres", "postgres")
        self.run(str(PG_BIN / "initdb"), "-D", str(self.dir), "-A", "trust", "-U", "postgres")
        self.start()
        self.run(str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "bench")
        return f"postgres://postgres@127.0.0.1:{self.port}/bench"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1"
        self.run(
            str(PG_BIN / "pg_ctl"), "-D", str(self.dir), "-o", options,
            "-l", str(self.dir / "log"), "-w", "start",
        )  # fmt: skip

    def stop(self) -> None:
        self.run(str(PG_BIN / "pg_ctl"), "-D", str(self.dir), "-m", "fast", "-w", "stop")


class Server:
    """gunicorn with 2 sync workers on one database."""

    def __init__(
        self, env: dict[str, str], workers: int, log: Path, access_log: Path | None = None
    ) -> None:
        self.port = port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.proc = subprocess.Popen(
            [
                GUNICORN, "urlguard_service.wsgi", "--bind", f"127.0.0.1:{self.port}",
                "--workers", str(workers), "--graceful-timeout", "20", "--log-level", "warning",
                *(["--access-logfile", str(access_log)] if access_log else []),
            ],
            cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"gunicorn exited:\n{log.read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.1)
        sys.exit(f"gunicorn did not listen within 30 s:\n{log.read_text()}")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


EDITED = "https://www.python.org/edited"
EDIT_LINK = f"""
import time
import django
django.setup()
from urlguard.models import ShortLink
ShortLink.objects.filter(slug="python").update(destination="{EDITED}")
print(time.time())
"""


def location_of(url: str) -> str:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a, **k):
            return None

    try:
        urllib.request.build_opener(NoRedirect).open(url, timeout=60)
    except urllib.error.HTTPError as exc:
        return exc.headers.get("Location", "")
    return ""


def status_of(url: str) -> int:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a, **k):
            return None

    try:
        with urllib.request.build_opener(NoRedirect).open(url, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def wrk(
    base: str, paths: list[str], seconds: float, connections: int, pick: str = "random"
) -> dict[str, object]:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(LUA % {"paths": ", ".join(f'"{p}"' for p in paths), "pick": pick})
    try:
        done = subprocess.run(
            [
                WRK, "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", "--timeout", "10s",
                "-s", script.name, base,
            ],
            capture_output=True, text=True, timeout=seconds + 60, check=True,
        )  # fmt: skip
    finally:
        os.unlink(script.name)
    out = done.stdout
    if "99%" not in out or "STATUS" not in out:
        sys.exit(f"unexpected wrk output:\n{out}\n{done.stderr}")
    statuses = {
        key: int(n) for key, n in re.findall(r"(\S+)=(\d+)", re.search(r"STATUS(.*)", out).group(1))
    }
    socket_errors = re.search(r"Socket errors: (.*)", out)
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        "p99": _ms(re.search(r"^\s+99%\s+(\S+)", out, re.MULTILINE).group(1)),
        "statuses": statuses,
        "socket_errors": socket_errors.group(1) if socket_errors else "",
    }


def _runs(runs: list[dict[str, object]]) -> str:
    return ", ".join(f"{r['rps']:.0f}" for r in runs)


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if match is None:
        sys.exit(f"unexpected wrk latency {text!r}")
    value, unit = match.groups()
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}[unit]


def stored_clicks(env: dict[str, str], slug_prefix: str = "") -> int:
    code = (
        "import django; django.setup()\n"
        "from django.db.models import Sum\n"
        "from urlguard.models import ShortLink\n"
        f"print(ShortLink.objects.filter(slug__startswith={slug_prefix!r})"
        ".aggregate(n=Sum('click_count'))['n'] or 0)"
    )
    return int(python(env, code))


MANY = [f"/b{i}" for i in range(LINKS)]
CASES = [
    # name, paths, connections
    ("link, 1 link, 16 conn (viral)", ["/python"], 16),
    ("link, 1,000 links, 16 conn", MANY, 16),
    ("link, 1 link, 64 conn (viral)", ["/python"], 64),
    ("/api/check, 16 conn", [API_PATH], 16),
    ("/api/check, 64 conn", [API_PATH], 64),
    ("static file, 16 conn", [STATIC_PATH], 16),
]


def measure(
    label: str, env: dict[str, str], tmp: Path, args: argparse.Namespace, pg: PrivatePostgres | None
) -> dict[str, object]:
    server = Server(env, args.workers, tmp / f"gunicorn-{label}.log")
    result: dict[str, object] = {}
    try:
        for path in ("/python", "/b0", API_PATH, STATIC_PATH):
            assert status_of(server.base + path) in (200, 302), path
        for _ in range(100):  # the lifted rate limit really is lifted
            assert status_of(server.base + API_PATH) == 200
        # Warm: every worker caches every link (and the guard confirms any filter
        # false positive once), as a long-running server has: each link requested
        # ~15 times, so a worker misses one with odds of 2**-15.
        warm = wrk(server.base, MANY, 20, 16, pick="cycle")
        assert set(warm["statuses"]) == {"302"}, warm
        runs: dict[str, list[dict[str, object]]] = {name: [] for name, *_ in CASES}
        order = list(CASES)
        for _ in range(args.rounds):
            for name, paths, connections in order:
                runs[name].append(wrk(server.base, paths, args.seconds, connections))
            order = order[1:] + order[:1]
        result["runs"] = runs

        # An edit through the ORM, committed by another process: how long until
        # both workers answer with the new destination (20 answers in a row)?
        committed = float(python(env, EDIT_LINK))
        fresh = 0
        while fresh < 20 and time.time() - committed < 30:
            fresh = fresh + 1 if location_of(server.base + "/python") == EDITED else 0
        result["edit_seconds"] = time.time() - committed

        if pg is not None:
            # The database stopped for 10 s under load, over the 1,000 cached links.
            before = stored_clicks(env, "b")
            stop = threading.Timer(3, pg.stop)
            start = threading.Timer(13, pg.start)
            stop.start()
            start.start()
            outage = wrk(server.base, MANY, 18, 16)
            stop.join()
            start.join()
            time.sleep(4)  # the buffered clicks of the outage are written now
            result["outage"] = (outage, stored_clicks(env, "b") - before)
    finally:
        server.stop()

    # Graceful restart under load: SIGHUP replaces both workers while wrk runs. wrk
    # does not count the requests still in flight when it stops; gunicorn's access
    # log (this server only) counts every 302 it sent.
    access = tmp / "access.log"
    server = Server(env, args.workers, tmp / f"gunicorn-{label}-restart.log", access)
    try:
        before = stored_clicks(env, "restart")
        timer = threading.Timer(3, server.proc.send_signal, args=(signal.SIGHUP,))
        timer.start()
        restart = wrk(server.base, ["/restart"], 8, 16)
        timer.join()
        time.sleep(3)  # the new workers' next flush
        with access.open() as lines:
            answered = sum(1 for line in lines if '"GET /restart ' in line and '" 302 ' in line)
        result["restart"] = (restart, answered, stored_clicks(env, "restart") - before)
    finally:
        server.stop()
    return result


def report(label: str, result: dict[str, object], args: argparse.Namespace) -> list[str]:
    runs = result["runs"]
    med = {name: statistics.median(r["rps"] for r in rs) for name, rs in runs.items()}
    p99 = {name: statistics.median(r["p99"] for r in rs) for name, rs in runs.items()}
    api16, api64 = med["/api/check, 16 conn"], med["/api/check, 64 conn"]
    print(f"\n### {label}\n")
    print("| case | runs (req/s) | median req/s | vs /api/check | p99 | statuses |")
    print("|---|---|---|---|---|---|")
    for name, rs in runs.items():
        statuses: dict[int, int] = {}
        for r in rs:
            for s, n in r["statuses"].items():
                statuses[s] = statuses.get(s, 0) + n
        ref = api64 if "64" in name else api16
        print(
            f"| {name} | {_runs(rs)} | {med[name]:.0f} | "
            f"{med[name] / ref:.0%} | {p99[name]:.2f} ms | "
            f"{' '.join(f'{s}: {n}' for s, n in sorted(statuses.items()))} |"
        )
    viral16, many16 = med["link, 1 link, 16 conn (viral)"], med["link, 1,000 links, 16 conn"]
    viral64 = med["link, 1 link, 64 conn (viral)"]
    spread = max(abs(viral16 / many16 - 1), abs(viral64 / many16 - 1))
    restart, answered, stored = result["restart"]
    served = restart["statuses"].get("302", 0)
    others = {s: n for s, n in restart["statuses"].items() if s != "302"} or "none"
    lines = [
        f"| {label}: short link ≥ 85% of /api/check (16 conn) | "
        f"{min(viral16, many16) / api16:.0%} (viral {viral16 / api16:.0%}, 1,000 links "
        f"{many16 / api16:.0%}) | {'met' if min(viral16, many16) >= 0.85 * api16 else 'MISSED'} |",
        f"| {label}: viral within 10% of 1,000 links | 16 conn {viral16 / many16 - 1:+.0%}, "
        f"64 conn {viral64 / many16 - 1:+.0%} | "
        f"{'met' if spread <= 0.1 else 'MISSED'} |",
    ]
    for conns, link_name, api_name in (
        (16, "link, 1 link, 16 conn (viral)", "/api/check, 16 conn"),
        (64, "link, 1 link, 64 conn (viral)", "/api/check, 64 conn"),
    ):
        worst = max(p99[link_name], p99["link, 1,000 links, 16 conn"] if conns == 16 else 0)
        lines.append(
            f"| {label}: p99 ≤ /api/check p99 + 1 ms ({conns} conn) | link {worst:.2f} ms vs "
            f"api {p99[api_name]:.2f} ms | {'met' if worst <= p99[api_name] + 1 else 'MISSED'} |"
        )
    lines.append(
        f"| {label}: zero clicks lost on a graceful restart (SIGHUP) under load | "
        f"{stored} clicks stored; gunicorn sent {answered} redirects (access log), wrk "
        f"received {served} (+ up to 16 in flight at its end); other statuses: {others} "
        f"{restart['socket_errors']} | {'met' if stored == answered >= served else 'MISSED'} |"
    )
    lines.append(
        f"| {label}: an edit reaches every worker within a second | both workers answered "
        f"with the new destination {result['edit_seconds'] * 1000:.0f} ms after the commit "
        f"(20 answers in a row) | {'met' if result['edit_seconds'] <= 1 else 'MISSED'} |"
    )
    if "outage" in result:
        outage, stored = result["outage"]
        st = outage["statuses"]
        # Every link was cached in every worker by the warm-up: anything but a 302
        # (a 503 included) means a cached link did not survive the outage.
        ok = set(st) == {"302"}
        lines.append(
            f"| {label}: database stopped 10 s under load (1,000 cached links) | "
            f"{' '.join(f'{s}: {n}' for s, n in sorted(st.items()))}, "
            f"{outage['rps']:.0f} req/s, p99 {outage['p99']:.1f} ms; clicks stored once it "
            f"was back: {stored} (wrk received {st.get('302', 0)}, + up to 16 in flight) | "
            f"{'met' if ok else 'MISSED'} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", choices=("sqlite", "postgresql"))
    parser.add_argument("--guard-cost", action="store_true", help="the guard on/off run")
    args = parser.parse_args()
    if not os.access(WRK, os.X_OK):
        sys.exit(f"{WRK} not found: apt-get install -y wrk")
    if args.guard_cost:
        guard_cost()
        return

    tmp = Path(tempfile.mkdtemp(prefix="urlguard-bench-redirect-"))
    base_env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "URLGUARD_FILTER_PATH")
    }
    base_env.update(
        DJANGO_DEBUG="0",
        DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost",
        DJANGO_SETTINGS_MODULE="urlguard_service.settings",
        # One key for the run (the shipped default is refused off the embedded demo).
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
    )
    # The open /api/check is rate-limited per client address (60/m): wrk is one
    # address, so the limit is lifted for the comparison (the limiter still runs).
    (tmp / "bench_settings.py").write_text(
        "from urlguard_service.settings import *  # noqa: F403\n"
        "URLGUARD = {**URLGUARD, 'API_OPEN_RATE': '1000000000/s'}  # noqa: F405\n"
    )
    base_env.update(
        DJANGO_SETTINGS_MODULE="bench_settings",
        PYTHONPATH=os.pathsep.join([str(tmp), str(ROOT)]),
    )
    pg: PrivatePostgres | None = None
    results: list[tuple[str, dict[str, object]]] = []
    costs = ""
    try:
        for label in ("SQLite", "PostgreSQL"):
            if args.only and args.only != label.lower():
                continue
            var = tmp / label.lower()
            var.mkdir(mode=0o700)
            env = {**base_env, "URLGUARD_VAR_DIR": str(var)}
            if label == "PostgreSQL":
                pg = PrivatePostgres(Path(tempfile.mkdtemp(prefix="urlguard-bench-pg-")))
                env["DATABASE_URL"] = pg.init()
            manage(env, "migrate", "--noinput", "-v", "0")
            manage(env, "seed_demo", "--no-superuser")
            python(env, SEED_LINKS)
            if not costs:
                costs = python(env, COSTS)
            results.append((label, measure(label, env, var, args, pg)))
    finally:
        if pg is not None:
            with contextlib.suppress(subprocess.CalledProcessError):
                pg.stop()
            shutil.rmtree(pg.base, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)

    print(
        f"\nShort link vs /api/check vs a static file: gunicorn {args.workers} sync workers, "
        f"wrk -t2 -d{args.seconds}s x {args.rounds} rounds (rotated), {os.cpu_count()} CPUs "
        f"shared by server, database and load tool; load average {os.getloadavg()[0]:.1f} "
        "at the end"
    )
    targets = []
    for label, result in results:
        targets += report(label, result, args)
    print("\n### Targets\n\n| target | figure | |\n|---|---|---|")
    print("\n".join(targets))
    hit, click, rtt = costs.split(maxsplit=2)
    print(
        f"\nIn-process, per request: a cached link {hit} µs, a buffered click {click} µs; "
        f"one Redis GET round trip on loopback {rtt} µs (what a Redis cache or buffer "
        "would add to every redirect)."
    )


# -- the guard's own cost (guard on / off / A-A) --------------------------------------

NOGUARD_SETTINGS = '''"""urlguard settings minus RedirectGuardMiddleware (bench/redirect.py)."""
from urlguard_service.settings import *  # noqa: F403

GUARD = "urlguard.middleware.RedirectGuardMiddleware"
MIDDLEWARE = [m for m in MIDDLEWARE if m != GUARD]  # noqa: F405
'''

# Times RedirectGuardMiddleware.guard_response alone on the short link's own
# redirect, in one process on the bench's database and filter: the guard's
# CPU cost per redirect, free of the HTTP stack's noise. Prints median µs.
GUARD_COST = """
import statistics, sys, time
import django
django.setup()
from django.http import HttpResponse
from django.test import RequestFactory
from urlguard.hotpath.middleware import RedirectGuardMiddleware
from urlguard.models import ShortLink
destination = ShortLink.objects.get(slug=sys.argv[1]).destination
request = RequestFactory().get("/" + sys.argv[1], HTTP_HOST="127.0.0.1")
middleware = RedirectGuardMiddleware(lambda r: None)
samples = []
for _ in range(20000):
    response = HttpResponse(status=302)
    response["Location"] = destination
    t0 = time.perf_counter_ns()
    result = middleware.guard_response(request, response)
    samples.append(time.perf_counter_ns() - t0)
assert result.status_code == 302 and "max-age" in result["Cache-Control"], result
print(f"{statistics.median(samples) / 1000:.1f}")
"""


def guard_cost(rounds: int = 6, seconds: int = 4, connections: int = 16) -> None:
    """The guard's cost: the same redirect with RedirectGuardMiddleware on and off
    (and a second guard-on server, an A/A noise floor), plus its in-process µs."""
    tmp = Path(tempfile.mkdtemp(prefix="urlguard-bench-guard-"))
    (tmp / "noguard_settings.py").write_text(NOGUARD_SETTINGS)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "URLGUARD_FILTER_PATH")
    }
    env.update(
        URLGUARD_VAR_DIR=str(tmp),
        DJANGO_DEBUG="0",
        DJANGO_ALLOWED_HOSTS="127.0.0.1",
        DJANGO_SETTINGS_MODULE="urlguard_service.settings",
    )
    servers: dict[str, Server] = {}
    try:
        manage(env, "migrate", "--noinput", "-v", "0")
        manage(env, "seed_demo", "--no-superuser")
        for name, module in (
            ("guard off", "noguard_settings"),
            ("guard on", "urlguard_service.settings"),
            ("guard on (A/A)", "urlguard_service.settings"),
        ):
            server_env = {
                **env,
                "DJANGO_SETTINGS_MODULE": module,
                "PYTHONPATH": os.pathsep.join([str(tmp), str(ROOT)]),
            }
            servers[name] = Server(server_env, 2, tmp / f"gunicorn-{len(servers)}.log")
        results: dict[str, list[dict[str, object]]] = {name: [] for name in servers}
        order = list(servers)
        for server in servers.values():
            wrk(server.base, ["/python"], 1, connections)
        for _ in range(rounds):
            for name in order:
                results[name].append(wrk(servers[name].base, ["/python"], seconds, connections))
            order = order[1:] + order[:1]
        guard_us = float(python(env, GUARD_COST.replace("sys.argv[1]", "'python'")))
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    med = {name: statistics.median(r["rps"] for r in rs) for name, rs in results.items()}
    print("\n| server | runs (req/s) | median req/s |\n|---|---|---|")
    for name, rs in results.items():
        print(f"| {name} | {_runs(rs)} | {med[name]:.0f} |")
    on = statistics.median([med["guard on"], med["guard on (A/A)"]])
    per_request_us = 1e6 * 2 / med["guard off"]
    print(
        f"\nguard cost by wrk: {1 - on / med['guard off']:+.1%}; A/A noise floor "
        f"{1 - med['guard on (A/A)'] / med['guard on']:+.1%}; in-process {guard_us:.1f} µs "
        f"per redirect = {guard_us / per_request_us:.2%} of a worker's {per_request_us:.0f} µs "
        "per request (target <= 5%)"
    )


if __name__ == "__main__":
    main()
