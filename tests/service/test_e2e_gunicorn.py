"""End to end: the real service under gunicorn on a loopback port, on its own
migrated SQLite database and filter file (seeded by `seed_demo`), followed with
a real HTTP client that does not follow redirects."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.listening import wait_until_listening
from urlguard.templatetags.urlguard_format import unbroken_host

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
GUNICORN = Path(sys.executable).with_name("gunicorn")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a 3xx then surfaces as an HTTPError we can inspect


_opener = urllib.request.build_opener(_NoRedirect)


def fetch(base: str, path: str, **headers: str) -> tuple[int, dict[str, str], str]:
    try:
        request = urllib.request.Request(base + path, headers=headers)
        with _opener.open(request, timeout=30) as response:
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


_service_var: dict[str, tuple[Path, dict[str, str]]] = {}


@contextmanager
def _serving(var: Path, migrated: Path) -> Iterator[str]:
    """gunicorn (2 workers, urlguard_service.gunicornconf) on a seeded database of its
    own in `var`, a copy of `migrated` (tests/conftest.py's `migrated_database`)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "DATABASE_URL",
            "CELERY_BROKER_URL",
            "URLGUARD_FILTER_PATH",
            "PROMETHEUS_MULTIPROC_DIR",
        )
    }
    env.update(
        URLGUARD_VAR_DIR=str(var),
        DJANGO_DEBUG="0",
        DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost",
        PYTHONDONTWRITEBYTECODE="1",
    )
    shutil.copy(migrated, var / "urlguard.sqlite3")
    _run(["seed_demo", "--no-superuser"], env)
    assert (var / "filter.bin").exists()

    port = _free_port()
    log = (var / "gunicorn.log").open("w")
    proc = subprocess.Popen(
        [
            str(GUNICORN),
            "urlguard_service.wsgi",
            "--config",
            "python:urlguard_service.gunicornconf",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "2",
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
        wait_until_listening(
            port, proc, within=30, what="gunicorn", log=(var / "gunicorn.log").read_text
        )
        # The first request imports the URLconf and maps the filter: pay for it
        # here, with patience for a busy machine, not inside a test's timeout.
        assert fetch(base, "/")[0] == 200
        _service_var[base] = (var, env)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def service(tmp_path_factory, migrated_database) -> Iterator[str]:
    with _serving(tmp_path_factory.mktemp("e2e-var"), migrated_database) as base:
        yield base


@pytest.fixture(scope="module")
def metrics_service(tmp_path_factory, migrated_database) -> Iterator[str]:
    """A server of its own: no other test's checks are in its counts."""
    with _serving(tmp_path_factory.mktemp("e2e-metrics-var"), migrated_database) as base:
        yield base


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


def _scrape(base: str) -> dict[str, float]:
    status, _, body = fetch(base, "/metrics")
    assert status == 200, body
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line and not line.startswith("#")
    }


@pytest.mark.timeout(120)
def test_metrics_sum_the_checks_of_both_workers(metrics_service):
    clean = 'urlguard_checks_total{verdict="clean"}'
    var, env = _service_var[metrics_service]
    metrics_dir = var / "metrics"
    key = subprocess.run(
        [sys.executable, "manage.py", "create_api_key", "e2e-metrics"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.strip()
    # Nothing was checked on this server yet (its fixture fetched only the home page).
    assert _scrape(metrics_service).get(clean, 0.0) == 0
    sent = 0

    def check(i: int) -> int:
        # A batch of 10 through the API key: the open GET's rate limit per address
        # would refuse a few hundred single requests.
        body = json.dumps({"urls": [f"https://e2e-{i}-{j}.example/" for j in range(10)]})
        request = urllib.request.Request(
            metrics_service + "/api/check",
            data=body.encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        with _opener.open(request, timeout=30) as response:
            assert len(json.load(response)["results"]) == 10
            return response.status

    # Concurrent requests until both workers have answered some (each writes its own
    # counter file), then the one scrape must sum them all.
    with ThreadPoolExecutor(8) as pool:
        for _ in range(30):
            assert set(pool.map(check, range(sent, sent + 16))) == {200}
            sent += 16 * 10
            if len(list(metrics_dir.glob("counter_*.db"))) >= 2:
                break
    assert len(list(metrics_dir.glob("counter_*.db"))) >= 2, "one worker answered everything"
    # Each worker writes its counts within a second (urlguard.runtime.metrics.FLUSH_SECONDS).
    deadline = time.monotonic() + 20
    while (samples := _scrape(metrics_service)).get(clean, 0.0) < sent:
        assert time.monotonic() < deadline, f"{samples.get(clean)} != {sent}"
        time.sleep(0.2)
    assert samples[clean] == sent
    assert samples["urlguard_filter_readable"] == 1
    assert samples["urlguard_filter_rules"] > 0


@pytest.mark.timeout(120)
def test_probes_answer_a_prober_host(service):
    for path in ("/healthz", "/readyz"):
        status, headers, body = fetch(service, path, Host="10.9.8.7:8000")
        assert status == 200, body
        assert headers["Cache-Control"] == "no-store"
    assert json.loads(fetch(service, "/readyz")[2])["ready"] is True
