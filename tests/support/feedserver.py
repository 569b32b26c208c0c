"""A local HTTP server in the test process that serves feed fixtures (tests/support/feeds/):
a route is a (status, headers, body) answer, or a function of the request handler for
the odd ones (never answering, cutting a body short). Requests are recorded with their
headers, so conditional GETs can be checked."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "feeds"
# The feeds helper's port range; the first free one is taken.
PORTS = range(18500, 18560)

Answer = tuple[int, dict[str, str], bytes]
# The server listens on loopback, which feed fetches refuse unless
# URLGUARD["FEED_ALLOWED_NETWORKS"] names it (tests/support/services_settings.py too).
LOOPBACK_NETWORKS = ["127.0.0.0/8"]


def admit_loopback(settings: Any) -> None:
    """Let this test's fetches reach the feed server (`settings`: pytest-django's)."""
    settings.URLGUARD = {**settings.URLGUARD, "FEED_ALLOWED_NETWORKS": LOOPBACK_NETWORKS}


class FeedServer:
    def __init__(self, server: ThreadingHTTPServer):
        self._server = server
        self.routes: dict[str, Answer | Callable[[BaseHTTPRequestHandler], None]] = {}
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.release = threading.Event()  # lets handlers that never answer go

    def url(self, path: str) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}{path}"

    def serve(self, path: str, body: bytes, status: int = 200, **headers: str) -> str:
        self.routes[path] = (status, {k.replace("_", "-"): v for k, v in headers.items()}, body)
        return self.url(path)


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


@contextmanager
def feed_server() -> Iterator[FeedServer]:
    holder: dict[str, FeedServer] = {}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            feeds = holder["server"]
            feeds.requests.append((self.path, dict(self.headers.items())))
            route = feeds.routes.get(self.path)
            if route is None:
                self._answer(404, {}, b"not found")
            elif callable(route):
                route(self)
            else:
                status, headers, body = route
                etag = headers.get("ETag")
                if etag and self.headers.get("If-None-Match") == etag:
                    self._answer(304, {"ETag": etag}, b"")
                else:
                    self._answer(status, headers, body)

        def _answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            if "Content-Length" not in headers and status != 304:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = None
    for port in PORTS:
        try:
            server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
            break
        except OSError:
            continue
    assert server is not None, f"no free port in {PORTS}"
    server.daemon_threads = True
    feeds = FeedServer(server)
    holder["server"] = feeds
    # A short poll: shutdown() waits for the loop's next look at its flag (0.5 s by default).
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield feeds
    finally:
        feeds.release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


def lines(*entries: str) -> bytes:
    """A plain-list feed body: one entry per line."""
    return "".join(f"{entry}\n" for entry in entries).encode()
