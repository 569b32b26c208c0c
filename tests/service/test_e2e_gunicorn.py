"""End to end: the real service under gunicorn on a loopback port, on its own
migrated SQLite database and filter file (seeded by `seed_demo`), followed with
a real HTTP client that does not follow redirects."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from urlguard.templatetags.urlguard_format import unbroken_host

ROOT = Path(__file__).resolve().parents[2]
GUNICORN = Path(sys.executable).with_name("gunicorn")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a 3xx then surfaces as an HTTPError we can inspect


_opener = urllib.request.build_opener(_NoRedirect)


def fetch(base: str, path: str) -> tuple[int, dict[str, str], str]:
    try:
        with _opener.open(base + path, timeout=30) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as exc:  # 3xx (not followed), 4xx, 5xx
        return exc.code, dict(exc.headers), exc.read().decode()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(args: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"manage.py {' '.join(args)} failed:\n{done.stdout}{done.stderr}"


@pytest.fixture(scope="module")
def service(tmp_path_factory) -> Iterator[str]:
    var = tmp_path_factory.mktemp("e2e-var")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "URLGUARD_FILTER_PATH")
    }
    env.update(
        URLGUARD_VAR_DIR=str(var),
        DJANGO_DEBUG="0",
        DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost",
        PYTHONDONTWRITEBYTECODE="1",
    )
    _run(["migrate", "--noinput", "-v", "0"], env)
    _run(["seed_demo", "--no-superuser"], env)
    assert (var / "filter.bin").exists()

    port = _free_port()
    log = (var / "gunicorn.log").open("w")
    proc = subprocess.Popen(
        [
            str(GUNICORN),
            "urlguard.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
            "--timeout",
            "20",
            "--graceful-timeout",
            "2",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        "gunicorn did not start:\n" + (var / "gunicorn.log").read_text()
                    ) from None
                time.sleep(0.1)
        # The first request imports the URLconf and maps the filter: pay for it
        # here, with patience for a busy machine, not inside a test's timeout.
        assert fetch(base, "/")[0] == 200
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.mark.timeout(120)
def test_clean_short_link_redirects(service):
    status, headers, _ = fetch(service, "/python")
    assert status == 302
    assert headers["Location"] == "https://www.python.org/"
    assert headers["Cache-Control"] == "private, max-age=90"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("slug", "host"),
    [
        ("prize-sub", "win.free-prizes.example"),
        ("bank-login", "login.secure-bank.example"),
        ("pills", "pages.example.net"),
    ],
)
def test_blocked_short_link_shows_the_warning_page(service, slug, host):
    status, headers, body = fetch(service, f"/{slug}")
    assert status == 403
    assert "Location" not in headers
    assert headers["Cache-Control"] == "no-store"
    assert f'<span class="host">{unbroken_host(host)}</span>' in body and "Back to safety" in body


@pytest.mark.timeout(120)
def test_neighbours_of_listed_pages_pass_and_errors_are_pages(service):
    for slug in ("bank-home", "garden", "readme"):
        assert fetch(service, f"/{slug}")[0] == 302, slug
    status, _, body = fetch(service, "/no-such-link")
    assert status == 404 and "There is no short link" in body
    status, _, body = fetch(service, "/api/check?url=https://a.free-prizes.example/x")
    assert status == 200 and json.loads(body)["rule"] == "free-prizes.example/"
