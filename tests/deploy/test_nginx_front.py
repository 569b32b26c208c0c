"""The shipped nginx front (deploy/nginx/urlguard.conf) run by Debian's nginx before the
service with TRUSTED_PROXIES naming it: visitors connecting from different addresses
are different visitors to the service (their own check-API rate-limit buckets), and an
X-Forwarded-For a visitor writes itself is not taken as its address.

The visitors are two loopback source addresses (Linux accepts any of 127/8); nginx
listens on a free local port without TLS and passes to pytest-django's live server."""

from __future__ import annotations

import http.client
import http.server
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.deploy import DEPLOY
from tests.support.listening import wait_until_listening

pytestmark = pytest.mark.django_db(transaction=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _adapted(site: str, prefix: Path, port: int, redirect_port: int, upstream: str) -> str:
    """deploy/nginx/urlguard.conf with only what cannot run here replaced: the nodes'
    addresses, the ports, TLS (the certificate paths and the `ssl http2` listen)."""
    replacements = [
        ("server 10.0.0.11:8000", f"server {upstream}"),
        ("server 10.0.0.12:8000", f"server {upstream}"),
        ("listen 80;", f"listen 127.0.0.1:{redirect_port};"),
        ("listen [::]:80;\n", ""),
        ("listen 443 ssl http2;", f"listen 127.0.0.1:{port};"),
        ("listen [::]:443 ssl http2;\n", ""),
        ("/etc/ssl/certs/links.example.org.pem", str(prefix / "cert.pem")),
        ("/etc/ssl/private/links.example.org.key", str(prefix / "key.pem")),
    ]
    for old, new in replacements:
        assert site.count(old) == 1, f"deploy/nginx/urlguard.conf no longer has {old!r}"
        site = site.replace(old, new)
    assert "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;" in site
    return site


@contextmanager
def _nginx(prefix: Path, site: str, port: int) -> Iterator[None]:
    """nginx in the foreground with `site` as its http-context include, until exit."""
    (prefix / "site.conf").write_text(site)
    conf = prefix / "nginx.conf"
    conf.write_text("daemon off;\nmaster_process off;\n" + conf.read_text())
    error_log = prefix / "error.log"
    proc = subprocess.Popen(
        [prefix / "nginx", "-p", prefix, "-c", conf, "-e", error_log],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until_listening(
            port, proc, within=10, what="nginx", log=lambda: error_log.read_text(errors="replace")
        )
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def front(nginx_prefix, live_server) -> Iterator[int]:
    """nginx in the foreground with the shipped site before the live server; its port."""
    port, redirect_port = _free_port(), _free_port()
    upstream = live_server.url.removeprefix("http://").replace("localhost", "127.0.0.1")
    site = (DEPLOY / "nginx" / "urlguard.conf").read_text()
    with _nginx(nginx_prefix, _adapted(site, nginx_prefix, port, redirect_port, upstream), port):
        yield port


def check_from(source: str, port: int, forged: str | None = None) -> int:
    """GET /api/check through the front, connecting from the address `source`."""
    connection = http.client.HTTPConnection(
        "127.0.0.1", port, timeout=10, source_address=(source, 0)
    )
    headers = {"Host": "localhost"}
    if forged is not None:
        headers["X-Forwarded-For"] = forged
    try:
        connection.request("GET", "/api/check?url=https%3A%2F%2Fexample.com%2F", headers=headers)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def test_visitors_behind_the_shipped_nginx_front_are_told_apart(front, settings):
    settings.URLGUARD = {
        **settings.URLGUARD,
        "API_OPEN_RATE": "2/d",  # a minute's window could end amid the requests
        "TRUSTED_PROXIES": ["127.0.0.1/32"],
    }
    assert [check_from("127.0.0.2", front) for _ in range(3)] == [200, 200, 429]
    # Another visitor of the same front: a bucket of its own.
    assert check_from("127.0.0.3", front) == 200
    # Naming another address in its own X-Forwarded-For does not lead it out of its bucket...
    assert check_from("127.0.0.3", front, forged="203.0.113.9") == 200
    assert check_from("127.0.0.3", front, forged="203.0.113.10") == 429
    # ...nor into another's: 127.0.0.4 spends its own, not 127.0.0.2's (exhausted).
    assert check_from("127.0.0.4", front, forged="127.0.0.2") == 200


class _Recorder(http.server.BaseHTTPRequestHandler):
    """An upstream that answers every request and keeps the paths it was sent."""

    seen: list[str]

    def do_GET(self) -> None:
        self.seen.append(self.path)
        body = b"upstream"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def _recording_upstream() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []
    handler = type("Recorder", (_Recorder,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


# /metrics as the site's own path and under a prefix a host site includes urlguard.urls
# at (path("guard/", include("urlguard.urls"))), in the spellings nginx normalizes.
METRICS_SPELLINGS = [
    "/metrics",
    "/metrics/",
    "/metrics?format=x",
    "//metrics",
    "/./metrics",
    "/x/../metrics",
    "/%6Detrics",
    "/guard/metrics",
    "/guard/metrics/",
    "/guard//metrics",
    "/guard/%6detrics",
    "/a/b/c/metrics?x=1",
    "/guard/metrics%2F",
]
PASSED_ON = ["/api/check?url=x", "/guard/readyz", "/metrics-report", "/s/metricsx"]


def _get(port: int, path: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path, headers={"Host": "links.example.org"})
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def _site_before(name: str, prefix: Path, port: int, upstream: str) -> str:
    site = (DEPLOY / "nginx" / name).read_text()
    if name == "compose.conf":
        for old, new in [
            ("server web1:8000", f"server {upstream}"),
            ("server web2:8000", f"server {upstream}"),
            ("listen 8080;", f"listen 127.0.0.1:{port};"),
        ]:
            assert site.count(old) == 1, f"deploy/nginx/compose.conf no longer has {old!r}"
            site = site.replace(old, new)
        return site
    return _adapted(site, prefix, port, _free_port(), upstream)


@pytest.mark.parametrize("name", ["urlguard.conf", "compose.conf"])
def test_the_fronts_never_pass_metrics_on(nginx_prefix, name):
    port = _free_port()
    with _recording_upstream() as (upstream, seen):
        site = _site_before(name, nginx_prefix, port, upstream)
        with _nginx(nginx_prefix, site, port):
            answers = {path: _get(port, path) for path in METRICS_SPELLINGS}
            passed = {path: _get(port, path) for path in PASSED_ON}
    assert answers == dict.fromkeys(METRICS_SPELLINGS, 404), answers
    assert passed == dict.fromkeys(PASSED_ON, 200), passed
    assert seen == PASSED_ON  # nothing else reached a node
