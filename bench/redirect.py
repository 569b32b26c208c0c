"""Benchmark: requests/s of the short-link redirect under gunicorn (2 workers),
driven by wrk on loopback, with the guard on and off in the same run.
Target: the guard costs at most 5% of throughput.

Both servers run on the same seeded SQLite database and filter file; they
differ only in RedirectGuardMiddleware. The runs alternate (off, on, on, off, …)
in pairs, so that drift of the machine hits both sides alike; the table
reports each run, the medians, and the median cost over the pairs.

    .venv/bin/python bench/redirect.py [--rounds 6] [--seconds 4] [--connections 16]

Bounded: rounds x 2 x seconds of load plus ~10 s of set-up; stops by itself.
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
        capture_output=True, text=True, timeout=seconds + 30, check=True)
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
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "URLGUARD_FILTER_PATH")}
    env.update(URLGUARD_VAR_DIR=str(tmp), DJANGO_DEBUG="0",
               DJANGO_SETTINGS_MODULE="urlguard.settings",
               DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost")
    procs: list[subprocess.Popen] = []
    try:
        for cmd in (["migrate", "--noinput", "-v", "0"], ["seed_demo", "--no-superuser"]):
            subprocess.run([PY, "manage.py", *cmd], cwd=ROOT, env=env, check=True,
                           capture_output=True, timeout=120)
        servers = {}
        for name, settings_module in (("guard off", "noguard_settings"),
                                      ("guard on", "urlguard.settings")):
            port = free_port()
            log = tmp / f"gunicorn-{port}.log"
            server_env = {**env, "DJANGO_SETTINGS_MODULE": settings_module,
                          "PYTHONPATH": os.pathsep.join([str(tmp), str(ROOT)])}
            proc = subprocess.Popen(
                [GUNICORN, "urlguard.wsgi", "--bind", f"127.0.0.1:{port}",
                 "--workers", str(args.workers),
                 "--log-level", "warning"],
                cwd=ROOT, env=server_env, stdout=log.open("w"), stderr=subprocess.STDOUT)
            procs.append(proc)
            wait_for(port, proc, log)
            servers[name] = f"http://127.0.0.1:{port}/{args.slug}"

        # Check both serve the same redirect, and that the guard really is on in one.
        status = {name: first_response(url) for name, url in servers.items()}
        assert status["guard off"][0] == 302 and status["guard on"][0] == 302, status
        assert "max-age" in status["guard on"][1] and "max-age" not in status["guard off"][1], (
            f"the guard's Cache-Control header should tell the servers apart: {status}")
        for url in servers.values():  # warm both (DB connections, caches)
            wrk(url, 1, args.connections)

        results: dict[str, list[tuple[float, str, int]]] = {name: [] for name in servers}
        order = list(servers)
        for _ in range(args.rounds):
            for name in order:
                results[name].append(wrk(servers[name], args.seconds, args.connections))
            order.reverse()  # off-on, on-off, ...: drift of the machine hits both alike
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"\nShort-link redirect /{args.slug} (302, clean off-site destination), gunicorn "
          f"{args.workers} sync workers, wrk -t2 -c{args.connections} -d{args.seconds}s, "
          f"{os.cpu_count()} CPUs shared by server and load tool (load average "
          f"{os.getloadavg()[0]:.1f} at the end), SQLite\n")
    print("| server    | runs (req/s)                 | median req/s | p99 latency | errors |")
    print("|-----------|------------------------------|--------------|-------------|--------|")
    medians = {}
    for name, runs in results.items():
        medians[name] = statistics.median(r[0] for r in runs)
        print(f"| {name:<9} | {', '.join(f'{r[0]:.0f}' for r in runs):<28} | "
              f"{medians[name]:>12.0f} | {runs[len(runs) // 2][1]:>11} | "
              f"{sum(r[2] for r in runs):>6} |")
    cost = 1 - medians["guard on"] / medians["guard off"]
    paired = statistics.median(1 - on[0] / off[0] for on, off in
                               zip(results["guard on"], results["guard off"], strict=True))
    print(f"\nguard cost: {cost:+.1%} of median throughput, {paired:+.1%} median of the "
          f"{args.rounds} back-to-back pairs (target <= 5%)\n")


if __name__ == "__main__":
    main()
