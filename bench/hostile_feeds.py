"""Hostile feed bodies, each refreshed once in a process of its own (embedded SQLite in
a throw-away var dir), printing its outcome, wall and CPU time and peak RSS:

- N MiB of newlines (and one entry) in a zip, for each --newlines size;
- one 64 MiB line (gzip), then one entry;
- one 32 MiB PhishTank JSON item (gzip);
- JSON nested 100,000 deep;
- a server that sends one byte every 0.5 s, with FEED_DEADLINE=5.

A scenario still running after --timeout seconds is killed and shown so. Run it on
two checkouts to compare (the script uses only refresh_source and the settings):

    .venv/bin/python bench/hostile_feeds.py [--newlines 16 256] [--timeout 120]
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIB = 1 << 20


def _zip(data: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("list.txt", data)
    return out.getvalue()


def _body(name: str) -> tuple[bytes, str]:
    if name.startswith("newlines-"):
        return _zip(b"\n" * (int(name.split("-")[1]) * MIB) + b"a.example\n"), "auto"
    if name == "line-64":
        return gzip.compress(b"x" * (64 * MIB) + b"\na.example\n"), "auto"
    if name == "json-item-32":
        item = json.dumps({"phish_id": 1, "url": "http://a.example/" + "x" * (32 * MIB)})
        return gzip.compress(f"[{item}]".encode()), "phishtank-json"
    if name == "json-nested":
        return b"[" * 100_000 + b"]" * 100_000, "phishtank-json"
    raise SystemExit(f"unknown scenario {name}")


def _trickle_server() -> str:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            try:
                while True:
                    self.wfile.write(b"a")
                    self.wfile.flush()
                    time.sleep(0.5)
            except OSError:
                return

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/feed.txt"


def _high_water_mb() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) // 1024
    return 0


def run_one(name: str, body_path: str, fmt: str) -> None:
    """In the child: set up Django in a fresh var dir, refresh once, print JSON (the
    body was written by the parent, so its making is not in this process's peak)."""
    var = Path(body_path).parent
    os.environ.update(URLGUARD_VAR_DIR=str(var), DJANGO_SETTINGS_MODULE="urlguard_service.settings")
    os.environ.pop("DATABASE_URL", None)
    os.environ.pop("CELERY_BROKER_URL", None)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from urlguard.feeds.refresh import refresh_source
    from urlguard.models import Source
    from urlguard.nodesync import nudge

    silenced = nudge.sending_to(lambda seq: None)  # no node in this run
    silenced.__enter__()  # for the run: held, as one collected would be left
    settings.URLGUARD = {
        **settings.URLGUARD,
        "FEED_FILE_ROOT": str(var),
        "FEED_ALLOWED_NETWORKS": ["127.0.0.0/8"],
        "FEED_DEADLINE": 5,
    }
    url = _trickle_server() if name == "trickle" else f"file://{body_path}"
    source = Source.objects.create(name="hostile", kind="feed", url=url, format=fmt)
    wall, cpu = time.perf_counter(), time.process_time()
    result = refresh_source(source)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    # VmHWM, not ru_maxrss: the latter keeps the forking parent's peak across exec.
    peak = _high_water_mb()
    outcome = result.error if result.status == "failed" else result.summary()
    print(
        json.dumps(
            {
                "status": str(result.status),
                "outcome": outcome[:90],
                "wall": wall,
                "cpu": cpu,
                "peak_mb": peak,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--body", help=argparse.SUPPRESS)
    parser.add_argument("--format", default="auto", help=argparse.SUPPRESS)
    parser.add_argument("--newlines", type=int, nargs="*", default=[16, 256])
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args()
    if args.one:
        run_one(args.one, args.body, args.format)
        return
    names = [f"newlines-{n}" for n in args.newlines]
    names += ["line-64", "json-item-32", "json-nested", "trickle"]
    print(f"{'scenario':<16} {'status':<8} {'wall s':>8} {'cpu s':>8} {'peak MB':>8}  outcome")
    for name in names:
        var = Path(tempfile.mkdtemp(prefix="urlguard-bench-hostile-"))
        body, fmt = (b"", "auto") if name == "trickle" else _body(name)
        (var / "feed.bin").write_bytes(body)
        del body
        started = time.perf_counter()
        try:
            done = subprocess.run(
                [sys.executable, __file__, "--one", name, "--body", str(var / "feed.bin")]
                + ["--format", fmt],
                capture_output=True,
                text=True,
                timeout=args.timeout,
                cwd=ROOT,
            )
        except subprocess.TimeoutExpired:
            shutil.rmtree(var, ignore_errors=True)
            print(
                f"{name:<16} {'killed':<8} {time.perf_counter() - started:>8.1f} "
                f"{'':>8} {'':>8}  still running at --timeout"
            )
            continue
        shutil.rmtree(var, ignore_errors=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if not lines:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            print(
                f"{name:<16} {'crashed':<8} {time.perf_counter() - started:>8.1f} "
                f"{'':>8} {'':>8}  {tail[:90]}"
            )
            continue
        row = json.loads(lines[-1])
        print(
            f"{name:<16} {row['status']:<8} {row['wall']:>8.2f} {row['cpu']:>8.2f} "
            f"{row['peak_mb']:>8}  {row['outcome']}"
        )


if __name__ == "__main__":
    main()
