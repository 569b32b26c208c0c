"""Benchmark: requests/s of the short-link redirect under gunicorn (2 workers),
driven by wrk on loopback, with the guard on and off in the same run.
Target: the guard costs at most 5% of throughput.

Both servers run on the same seeded SQLite database and filter file; they
differ only in RedirectGuardMiddleware. The runs rotate (off, on, A/A, on, A/A,
off, …) so that drift of the machine hits all sides alike. A second, identical
guard-on server measures the noise floor in the same run (an A/A test): on a
busy 2-CPU machine it is larger than 5%, so the guard's own CPU time per
redirect is also measured in-process and set against the time per request.

    .venv/bin/python bench/redirect.py [--rounds 6] [--seconds 4] [--connections 16]

Bounded: rounds x 3 x seconds of load plus ~20 s of set-up; stops by itself.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
GUNICORN = str(Path(PY).with_name("gunicorn"))
WRK = "/usr/bin/wrk"

NOGUARD_SETTINGS = '''"""urlguard settings minus RedirectGuardMiddleware (bench/redirect.py)."""
from urlguard.settings import *  # noqa: F403

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
from urlguard.middleware import RedirectGuardMiddleware
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(port: int, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"gunicorn exited:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"gunicorn did not listen on {port} within 20 s:\n{log.read_text()}")


def first_response(url: str) -> tuple[int, str]:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a, **k):
            return None

    try:
        with urllib.request.build_opener(NoRedirect).open(url, timeout=60) as r:
            return r.status, r.headers.get("Cache-Control", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Cache-Control", "")


def wrk(url: str, seconds: int, connections: int) -> tuple[float, str, int]:
    done = subprocess.run(
        [WRK, "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", url],
        capture_output=True,
        text=True,
        timeout=seconds + 30,
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--slug", default="python", help="seed_demo link to request")
    args = parser.parse_args()
    if not os.access(WRK, os.X_OK):
        sys.exit(f"{WRK} not found: install Debian's wrk")

    tmp = Path(tempfile.mkdtemp(prefix="urlguard-bench-redirect-"))
    (tmp / "noguard_settings.py").write_text(NOGUARD_SETTINGS)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "URLGUARD_FILTER_PATH")
    }
    env.update(
        URLGUARD_VAR_DIR=str(tmp),
        DJANGO_DEBUG="0",
        DJANGO_SETTINGS_MODULE="urlguard.settings",
        DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost",
    )
    procs: list[subprocess.Popen] = []
    try:
        for cmd in (["migrate", "--noinput", "-v", "0"], ["seed_demo", "--no-superuser"]):
            subprocess.run(
                [PY, "manage.py", *cmd],
                cwd=ROOT,
                env=env,
                check=True,
                capture_output=True,
                timeout=120,
            )
        servers = {}
        # "guard on (A/A)" is a second, identical guard-on server: the spread
        # between the two guard-on servers is this machine's noise floor, the
        # smallest cost the run can resolve.
        for name, settings_module in (
            ("guard off", "noguard_settings"),
            ("guard on", "urlguard.settings"),
            ("guard on (A/A)", "urlguard.settings"),
        ):
            port = free_port()
            log = tmp / f"gunicorn-{port}.log"
            server_env = {
                **env,
                "DJANGO_SETTINGS_MODULE": settings_module,
                "PYTHONPATH": os.pathsep.join([str(tmp), str(ROOT)]),
            }
            proc = subprocess.Popen(
                [
                    GUNICORN,
                    "urlguard.wsgi",
                    "--bind",
                    f"127.0.0.1:{port}",
                    "--workers",
                    str(args.workers),
                    "--log-level",
                    "warning",
                ],
                cwd=ROOT,
                env=server_env,
                stdout=log.open("w"),
                stderr=subprocess.STDOUT,
            )
            procs.append(proc)
            wait_for(port, proc, log)
            servers[name] = f"http://127.0.0.1:{port}/{args.slug}"

        # Check both serve the same redirect, and that the guard really is on in one.
        status = {name: first_response(url) for name, url in servers.items()}
        assert status["guard off"][0] == 302 and status["guard on"][0] == 302, status
        assert "max-age" in status["guard on"][1] and "max-age" not in status["guard off"][1], (
            f"the guard's Cache-Control header should tell the servers apart: {status}"
        )
        for url in servers.values():  # warm both (DB connections, caches)
            wrk(url, 1, args.connections)

        results: dict[str, list[tuple[float, str, int]]] = {name: [] for name in servers}
        order = list(servers)
        for _ in range(args.rounds):
            for name in order:
                results[name].append(wrk(servers[name], args.seconds, args.connections))
            order = order[1:] + order[:1]  # rotate: drift of the machine hits all alike
        guard_us = subprocess.run(
            [PY, "-c", GUARD_COST, args.slug],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        ).stdout.strip()
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)

    print(
        f"\nShort-link redirect /{args.slug} (302, clean off-site destination), gunicorn "
        f"{args.workers} sync workers, wrk -t2 -c{args.connections} -d{args.seconds}s, "
        f"{os.cpu_count()} CPUs shared by server and load tool (load average "
        f"{os.getloadavg()[0]:.1f} at the end), SQLite\n"
    )
    print(
        "| server         | runs (req/s)                       | median req/s | p99 latency "
        "| errors |"
    )
    print(
        "|----------------|------------------------------------|--------------|-------------"
        "|--------|"
    )
    medians = {}
    for name, runs in results.items():
        medians[name] = statistics.median(r[0] for r in runs)
        print(
            f"| {name:<14} | {', '.join(f'{r[0]:.0f}' for r in runs):<34} | "
            f"{medians[name]:>12.0f} | {runs[len(runs) // 2][1]:>11} | "
            f"{sum(r[2] for r in runs):>6} |"
        )

    def paired(a: str, b: str) -> float:
        return statistics.median(
            1 - x[0] / y[0] for x, y in zip(results[a], results[b], strict=True)
        )

    on = statistics.median([medians["guard on"], medians["guard on (A/A)"]])
    print(
        f"\nguard cost by wrk: {1 - on / medians['guard off']:+.1%} of median throughput "
        f"({paired('guard on', 'guard off'):+.1%} median over rounds); noise floor (A/A, two "
        f"identical guard-on servers): {paired('guard on (A/A)', 'guard on'):+.1%}"
    )
    per_request_us = 1e6 * args.workers / medians["guard off"]
    print(
        f"guard cost in-process: {guard_us} µs per redirect (RedirectGuardMiddleware on the "
        f"same link, real filter) = {float(guard_us) / per_request_us:.2%} of the "
        f"{per_request_us:.0f} µs a worker spends per request (target <= 5%)\n"
    )


if __name__ == "__main__":
    main()
