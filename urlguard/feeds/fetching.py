"""Fetching a source's body into a temporary file: http(s) through urllib3 (timeouts,
a bounded number of redirects, a size limit, a deadline for the whole transfer, and a
conditional GET with the validators of the last body applied, so an unchanged feed
costs one 304), or a `file://` path on this server beneath the configured root
(unchanged = same size and modification time). An http(s) fetch connects only to
public addresses, checked at every redirect hop on the address it then dials (no
second DNS answer can differ), each lookup waited for no longer than the connect
timeout and what is left of the deadline. Framework-free: the caller passes what the
settings say."""

from __future__ import annotations

import contextlib
import email.utils
import http.client
import ipaddress
import os
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISREG
from typing import Any, BinaryIO, NoReturn
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

import urllib3
import urllib3.connection

from urlguard.feeds.decoding import FeedError
from urlguard.runtime.addresses import IPNetwork, refused_for_fetching

__all__ = ["FetchResult", "FetchSettings", "TransientFeedError", "fetch", "file_feed_path"]

_CHUNK = 1 << 16
USER_AGENT = "urlguard-feeds/1 (+https://github.com/; spam-URL guard for redirect services)"


class TransientFeedError(FeedError):
    """A failure worth retrying soon: the network, a timeout, or a 5xx/429 answer."""


@dataclass(frozen=True)
class FetchSettings:
    connect_timeout: float = 10.0
    read_timeout: float = 30.0
    # The whole transfer: a server that trickles bytes under read_timeout still ends.
    deadline: float = 300.0
    max_bytes: int = 512 * 1024 * 1024
    max_redirects: int = 5
    # file:// URLs are read only beneath this folder (None: refused).
    file_root: str | None = None
    # Non-public networks an http(s) fetch may connect to anyway.
    allowed_networks: tuple[IPNetwork, ...] = ()


@dataclass
class FetchResult:
    """`body` is None when the source answered "not modified"."""

    status: int
    body: BinaryIO | None
    size: int = 0
    etag: str = ""
    last_modified: str = ""

    def close(self) -> None:
        if self.body is not None:
            self.body.close()


def fetch(
    url: str, *, etag: str = "", last_modified: str = "", settings: FetchSettings | None = None
) -> FetchResult:
    """Fetch `url`; raises FeedError (TransientFeedError when a retry may help)."""
    settings = settings or FetchSettings()
    scheme = urlsplit(url).scheme.lower()
    if scheme == "file":
        return _fetch_file(url, last_modified=last_modified, settings=settings)
    if scheme not in ("http", "https"):
        raise FeedError(f"{url!r}: only http, https and file:// URLs can be fetched")
    return _fetch_http(url, etag=etag, last_modified=last_modified, settings=settings)


_REDIRECTS = frozenset({301, 302, 303, 307, 308})


class _Deadline:
    """The whole transfer's clock: when it runs out, the socket in use is shut down,
    so a read blocked on a server that trickles a byte at a time (each one resetting
    the read timeout) returns at once."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds
        self.expired = False
        self._timer: threading.Timer | None = None

    def remaining(self) -> float:
        return self.end - time.monotonic()

    def watch(self, sock: socket.socket) -> None:
        self.cancel()
        self._timer = threading.Timer(max(0.0, self.remaining()), self._expire, (sock,))
        self._timer.daemon = True
        self._timer.start()

    def _expire(self, sock: socket.socket) -> None:
        self.expired = True
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


# A lookup the fetch stopped waiting for goes on until the system resolver gives up;
# at most this many at once per process, so a resolver that never answers cannot
# pile up threads.
RESOLVER_THREADS = 4
_resolver_slots = threading.BoundedSemaphore(RESOLVER_THREADS)


def _after_fork_in_child() -> None:
    global _resolver_slots
    # The parent's stuck lookups have no thread here to give their slots back.
    _resolver_slots = threading.BoundedSemaphore(RESOLVER_THREADS)


os.register_at_fork(after_in_child=_after_fork_in_child)


def _resolve(host: str, port: int, settings: FetchSettings, deadline: _Deadline) -> list[Any]:
    """getaddrinfo in a thread of its own, waited for no longer than the connect
    timeout or what is left of the deadline, whichever ends first (the system
    resolver's own timeout can be far longer than either)."""
    left = max(0.0, deadline.remaining())
    bound = min(settings.connect_timeout, left)
    if settings.connect_timeout <= left:
        within = f"{bound:g} s (FEED_CONNECT_TIMEOUT)"
    else:
        within = f"the {left:.3g} s left of the fetch's {settings.deadline:g} s (FEED_DEADLINE)"
    ends = time.monotonic() + bound
    slots = _resolver_slots
    if not slots.acquire(timeout=bound):
        raise TransientFeedError(
            f"cannot fetch from {host}: {RESOLVER_THREADS} earlier lookups are still waiting "
            f"on the system resolver and none ended within {within}"
        )
    answer: list[Any] = []
    failure: list[BaseException] = []
    done = threading.Event()

    def lookup() -> None:
        try:
            answer.extend(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except BaseException as exc:
            failure.append(exc)
        finally:
            slots.release()
            done.set()

    try:
        threading.Thread(target=lookup, name=f"urlguard-resolve {host}", daemon=True).start()
    except RuntimeError as exc:
        slots.release()
        raise TransientFeedError(
            f"cannot fetch from {host}: no thread to resolve it ({exc})"
        ) from exc
    if not done.wait(max(0.0, ends - time.monotonic())):
        raise TransientFeedError(f"cannot fetch from {host}: not resolved within {within}")
    if failure:
        raise failure[0]
    return answer


def _addresses(host: str, port: int, settings: FetchSettings, deadline: _Deadline) -> list[str]:
    """Every address `host` resolves to, each checked: one that is not public (and
    not in FEED_ALLOWED_NETWORKS) refuses the fetch, so a name that resolves to a
    public and an internal address cannot pick the internal one later."""
    try:
        infos = _resolve(host, port, settings, deadline)
    except (OSError, UnicodeError) as exc:
        raise TransientFeedError(f"cannot fetch from {host}: cannot resolve it ({exc})") from exc
    found: list[str] = []
    for info in infos:
        text = str(info[4][0]).split("%", 1)[0]
        address = ipaddress.ip_address(text)
        refusal = refused_for_fetching(address, settings.allowed_networks)
        if refusal is not None:
            raise FeedError(
                f"{host} resolves to {refusal}: feeds are fetched from public addresses "
                "only (URLGUARD['FEED_ALLOWED_NETWORKS'] admits a network you mean)"
            )
        if text not in found:
            found.append(text)
    if not found:
        raise TransientFeedError(f"cannot resolve {host}: no address")
    return found


def _connect(
    scheme: str, host: str, port: int, settings: FetchSettings, deadline: _Deadline
) -> urllib3.connection.HTTPConnection:
    """A connection to a checked address of `host` (the address itself is dialled,
    so no second lookup can answer differently); TLS verifies the certificate for
    `host`."""
    last: Exception | None = None
    for address in _addresses(host, port, settings, deadline):
        timeout = min(settings.connect_timeout, max(0.001, deadline.remaining()))
        connection: urllib3.connection.HTTPConnection
        if scheme == "https":
            connection = urllib3.connection.HTTPSConnection(
                address, port, timeout=timeout, server_hostname=host, cert_reqs="CERT_REQUIRED"
            )
        else:
            connection = urllib3.connection.HTTPConnection(address, port, timeout=timeout)
        try:
            connection.connect()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            connection.close()
            last = exc
            continue
        assert connection.sock is not None
        connection.sock.settimeout(settings.read_timeout)
        deadline.watch(connection.sock)
        return connection
    raise TransientFeedError(f"cannot fetch from {host}:{port}: {_reason(last)}")


def _fetch_http(url: str, *, etag: str, last_modified: str, settings: FetchSettings) -> FetchResult:
    headers = {"Accept-Encoding": "gzip, deflate", "User-Agent": USER_AGENT}
    if etag:
        headers["If-None-Match"] = etag
    if last_modified:
        headers["If-Modified-Since"] = last_modified
    deadline = _Deadline(settings.deadline)
    try:
        return _follow(url, headers, etag, last_modified, settings, deadline)
    finally:
        deadline.cancel()


def _follow(
    url: str,
    headers: dict[str, str],
    etag: str,
    last_modified: str,
    settings: FetchSettings,
    deadline: _Deadline,
) -> FetchResult:
    target = url
    for _hop in range(settings.max_redirects + 1):
        parts = urlsplit(target)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            raise FeedError(f"{url} redirects to {target!r}: only http and https are followed")
        try:
            host, port = parts.hostname, parts.port or (443 if scheme == "https" else 80)
        except ValueError as exc:
            raise FeedError(f"{target!r} is not a valid URL: {exc}") from exc
        if not host:
            raise FeedError(f"{target!r} names no host")
        connection = _connect(scheme, host, port, settings, deadline)
        path = urlunsplit(("", "", parts.path or "/", parts.query, ""))
        default_port = port == (443 if scheme == "https" else 80)
        host_header = (f"[{host}]" if ":" in host else host) + ("" if default_port else f":{port}")
        try:
            try:
                connection.request(
                    "GET", path, headers={**headers, "Host": host_header}, preload_content=False
                )
                response = connection.getresponse()
            except (urllib3.exceptions.HTTPError, OSError, http.client.HTTPException) as exc:
                if deadline.expired:
                    raise _too_slow(url, settings) from exc
                raise TransientFeedError(f"cannot fetch {target}: {_reason(exc)}") from exc
            location = response.headers.get("Location")
            if response.status in _REDIRECTS and location:
                target = urljoin(target, location)
                continue
            return _answer(response, url, etag, last_modified, settings, deadline)
        finally:
            connection.close()
    raise FeedError(f"more than {settings.max_redirects} redirects fetching {url}")


def _too_slow(url: str, settings: FetchSettings) -> TransientFeedError:
    return TransientFeedError(
        f"{url} took longer than {settings.deadline:g} s to send its body (FEED_DEADLINE)"
    )


def _answer(
    response: urllib3.BaseHTTPResponse,
    url: str,
    etag: str,
    last_modified: str,
    settings: FetchSettings,
    deadline: _Deadline,
) -> FetchResult:
    if response.status == 304:
        return FetchResult(304, None, etag=etag, last_modified=last_modified)
    if response.status >= 400:
        cls = TransientFeedError if response.status >= 500 or response.status == 429 else FeedError
        raise cls(f"HTTP {response.status} {response.reason or ''} from {url}".rstrip())
    declared = response.headers.get("Content-Length")
    if declared and declared.isdigit() and int(declared) > settings.max_bytes:
        raise FeedError(
            f"{url} is {int(declared):,} bytes; the limit is {settings.max_bytes:,} "
            "(FEED_MAX_BYTES)"
        )
    body, size = _spool(response, url, settings, deadline)
    return FetchResult(
        response.status,
        body,
        size,
        etag=response.headers.get("ETag", ""),
        last_modified=response.headers.get("Last-Modified", ""),
    )


def _spool(
    response: urllib3.BaseHTTPResponse, url: str, settings: FetchSettings, deadline: _Deadline
):
    body = tempfile.TemporaryFile(prefix="urlguard-feed-")  # noqa: SIM115 (returned open)
    size = 0
    try:
        for chunk in response.stream(_CHUNK, decode_content=True):
            size += len(chunk)
            if size > settings.max_bytes:
                raise FeedError(
                    f"{url} sent more than {settings.max_bytes:,} bytes (FEED_MAX_BYTES): refused"
                )
            if deadline.expired or deadline.remaining() < 0:
                raise _too_slow(url, settings)
            body.write(chunk)
        if deadline.expired:
            raise _too_slow(url, settings)
    except FeedError:
        body.close()
        raise
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        if deadline.expired:
            body.close()
            raise _too_slow(url, settings) from exc
        _spool_failed(body, url, exc)
    except BaseException:
        body.close()
        raise
    body.seek(0)
    return body, size


def _spool_failed(body: BinaryIO, url: str, exc: Exception) -> NoReturn:
    body.close()
    if isinstance(exc, urllib3.exceptions.ProtocolError):
        raise TransientFeedError(f"{url}: the body was cut short ({_reason(exc)})") from exc
    if isinstance(exc, urllib3.exceptions.DecodeError):
        raise FeedError(f"{url}: the compressed body is corrupt ({_reason(exc)})") from exc
    raise TransientFeedError(f"{url}: reading the body failed ({_reason(exc)})") from exc


def file_feed_path(url: str, file_root: str | None, *, must_exist: bool = True) -> Path:
    """The file a file:// feed URL names, once its links are followed, if it lies
    beneath `file_root` (None: every file:// URL is refused); FeedError says why not.
    Without `must_exist` (a feed being added) a file not there yet is judged by
    the folders above it that are."""
    parts = urlsplit(url)
    if file_root is None:
        raise FeedError(
            f"{url}: file:// feeds are refused: URLGUARD['FEED_FILE_ROOT'] names no folder "
            "they may be read from"
        )
    if parts.netloc not in ("", "localhost"):
        raise FeedError(f"{url}: a file:// URL names a file on this server, not on {parts.netloc}")
    root = Path(file_root).resolve()
    named = Path(unquote(parts.path))
    try:
        # Resolved (symlinks followed) before the check: a link beneath the root that
        # points outside it is outside.
        path = named.resolve(strict=must_exist)
    except (OSError, RuntimeError, ValueError) as exc:  # ValueError: a NUL (%00) in it
        raise FeedError(f"cannot read {named}: {getattr(exc, 'strerror', None) or exc}") from exc
    if not path.is_relative_to(root):
        raise FeedError(
            f"{named} is not beneath FEED_FILE_ROOT ({root}) once its links are followed "
            f"({path}): refused"
        )
    return path


def _fetch_file(url: str, *, last_modified: str, settings: FetchSettings) -> FetchResult:
    path = file_feed_path(url, settings.file_root)
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise FeedError(f"cannot read {path}: {exc.strerror or exc}") from exc
    with os.fdopen(descriptor, "rb") as source:
        stat = os.fstat(source.fileno())
        if not S_ISREG(stat.st_mode):
            raise FeedError(f"{path} is not a regular file (a device, pipe or folder): refused")
        stamp = f"{email.utils.formatdate(stat.st_mtime, usegmt=True)}; {stat.st_size}"
        if last_modified and last_modified == stamp:
            return FetchResult(304, None, last_modified=stamp)
        if stat.st_size > settings.max_bytes:
            raise FeedError(
                f"{path} is {stat.st_size:,} bytes; the limit is {settings.max_bytes:,} "
                "(FEED_MAX_BYTES)"
            )
        # A copy: the file may be replaced while it is read (and may grow: the copy
        # stops at the limit).
        body = tempfile.TemporaryFile(prefix="urlguard-feed-")  # noqa: SIM115 (returned open)
        size = 0
        while chunk := source.read(_CHUNK):
            size += len(chunk)
            if size > settings.max_bytes:
                body.close()
                raise FeedError(
                    f"{path} grew past {settings.max_bytes:,} bytes (FEED_MAX_BYTES): refused"
                )
            body.write(chunk)
    body.seek(0)
    return FetchResult(200, body, size, last_modified=stamp)


def _reason(exc: object) -> str:
    text = str(exc)
    return text if len(text) < 300 else text[:297] + "..."
