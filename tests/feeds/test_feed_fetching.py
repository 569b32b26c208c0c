"""urlguard.feeds.fetching against hostile feeds: no file outside FEED_FILE_ROOT (nor a
device), no connection to an address outside the public internet (loopback in any
spelling, link-local metadata, private, reserved, multicast), checked at every
redirect hop on the address then dialled, and a deadline that stops a server that
trickles, and a resolver that never answers; plus the admin form that keeps file://
URLs to superusers."""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Callable

import pytest
from django.urls import reverse

from tests.support.feedserver import feed_server
from urlguard.feeds import fetching
from urlguard.feeds.decoding import FeedError
from urlguard.feeds.fetching import FetchSettings, TransientFeedError, fetch
from urlguard.models import Source
from urlguard.runtime.addresses import non_public_kind, refused_for_fetching
from urlguard.runtime.specialpurpose import SPECIAL_PURPOSE, special_purpose

LOOPBACK = (ipaddress.ip_network("127.0.0.1/32"),)


@pytest.fixture
def server():
    with feed_server() as feeds:
        yield feeds


def read(url: str, **settings) -> bytes:
    settings.setdefault("connect_timeout", 2)
    settings.setdefault("read_timeout", 2)
    result = fetch(url, settings=FetchSettings(**settings))
    assert result.body is not None
    with result.body:
        return result.body.read()


# -- addresses ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.1.2.3",
        "::1",
        "::ffff:127.0.0.1",
        "169.254.169.254",
        "fe80::1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",
        "fd00::1",
        "0.0.0.0",
        "0.1.2.3",
        "224.0.0.1",
        "ff02::1",
        "240.0.0.1",
        "255.255.255.255",
        "198.18.0.1",
        "2002:7f00:1::1",  # 6to4 around 127.0.0.1
        "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo around 127.0.0.1
        "64:ff9b::a00:1",  # NAT64 around 10.0.0.1
        "192.0.2.1",  # documentation: not routable, so never fetched
    ],
)
def test_non_public_addresses_are_refused_for_fetching(address):
    assert refused_for_fetching(ipaddress.ip_address(address)) is not None


@pytest.mark.parametrize("address", ["8.8.8.8", "2606:4700:4700::1111", "2002:808:808::1"])
def test_public_addresses_are_fetched(address):
    assert refused_for_fetching(ipaddress.ip_address(address)) is None
    assert non_public_kind(ipaddress.ip_address(address)) is None


# One address of each block of the IANA special-purpose registries that is not globally
# reachable (and a few that are, which a fetch may reach).
@pytest.mark.parametrize(
    "address",
    [
        "192.0.0.8",  # IPv4 dummy address
        "192.0.0.1",  # IPv4 service continuity prefix
        "192.0.0.170",  # NAT64/DNS64 discovery
        "192.0.0.200",  # IETF protocol assignments
        "192.88.99.1",  # deprecated 6to4 relay anycast
        "198.51.100.7",
        "203.0.113.7",
        "3fff::1",  # documentation (RFC 9637)
        "3fff:fff::1",
        "2001:db8::1",
        "5f00::1",  # SRv6 SIDs
        "100::1",  # discard-only
        "100:0:0:1::1",  # dummy prefix
        "64:ff9b:1::1",  # local-use IPv4/IPv6 translation
        "2001:2::1",  # benchmarking
        "2001:10::1",  # deprecated ORCHID
        "2001:1ff::1",  # IETF protocol assignments
        "::",
        "fec0::1",  # site-local, withdrawn
    ],
)
def test_special_purpose_addresses_are_refused_for_fetching(address):
    refusal = refused_for_fetching(ipaddress.ip_address(address))
    assert refusal is not None and address in refusal


@pytest.mark.parametrize(
    "address",
    [
        "192.0.0.9",  # Port Control Protocol anycast: globally reachable
        "192.0.0.10",  # TURN anycast
        "192.31.196.1",  # AS112
        "192.52.193.1",  # AMT
        "192.175.48.1",  # AS112 direct delegation
        "192.88.99.2",  # 6a44 relay anycast
        "2001:1::1",
        "2001:3::1",
        "2001:4:112::1",
        "2001:20::1",  # ORCHIDv2
        "2001:30::1",  # drone remote ID
        "2620:4f:8000::1",
        "3fff:1000::1",  # past the documentation /20
    ],
)
def test_globally_reachable_special_purpose_addresses_are_fetched(address):
    assert refused_for_fetching(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize("entry", SPECIAL_PURPOSE, ids=lambda e: str(e.network))
def test_every_registry_entry_is_followed(entry):
    """The first and last address each block owns (a more specific entry may own them)
    are fetched only where the registry says globally reachable."""
    for address in (entry.network[0], entry.network[-1]):
        if special_purpose(address) != entry or entry.reachable is None:
            continue
        refusal = refused_for_fetching(address)
        if entry.reachable:
            assert refusal is None, refusal
        else:
            assert refusal is not None, address


def test_allowed_networks_admit_what_they_name_only():
    assert refused_for_fetching(ipaddress.ip_address("127.0.0.1"), LOOPBACK) is None
    assert refused_for_fetching(ipaddress.ip_address("127.0.0.2"), LOOPBACK) is not None
    assert refused_for_fetching(ipaddress.ip_address("::1"), LOOPBACK) is not None


# -- http -----------------------------------------------------------------------------


def test_the_loopback_feed_server_is_refused_unless_allowed(server):
    url = server.serve("/l", b"a.example\n")
    with pytest.raises(FeedError, match="127.0.0.1 is a loopback address.*FEED_ALLOWED_NETWORKS"):
        read(url)
    assert not server.requests
    assert read(url, allowed_networks=LOOPBACK) == b"a.example\n"


def test_loopback_in_decimal_and_other_spellings_is_refused(server):
    server.serve("/l", b"a.example\n")
    port = server.url("/l").rsplit(":", 1)[1].split("/")[0]
    for host in ("2130706433", "0x7f000001", "0177.0.0.1", "127.1", "localhost", "[::1]"):
        with pytest.raises(FeedError, match="loopback"):
            read(f"http://{host}:{port}/l")
    assert not server.requests


@pytest.mark.parametrize(
    "location",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://127.0.0.2:{port}/l",
        "http://2130706434:{port}/l",
        "http://[::1]:{port}/l",
        "http://10.0.0.1/",
        "file:///etc/passwd",
    ],
)
def test_every_redirect_hop_is_checked(server, location):
    server.serve("/l", b"secret.example\n")
    port = server.url("/l").rsplit(":", 1)[1].split("/")[0]
    server.serve("/hop", b"", status=302, Location=location.format(port=port))
    with pytest.raises(FeedError, match="public addresses only|only http and https"):
        read(server.url("/hop"), allowed_networks=LOOPBACK)
    assert [path for path, _ in server.requests] == ["/hop"]


def test_the_checked_address_is_the_one_dialled(server, monkeypatch):
    # A name whose second lookup would answer an internal address (DNS rebinding): it
    # is looked up once per hop and that checked address is connected to.
    url = server.serve("/l", b"a.example\n")
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    real = socket.getaddrinfo
    answers = iter(["127.0.0.1", "10.9.9.9"])
    lookups = []

    def rebinding(host, *args, **kwargs):
        if host != "feeds.rebind.test":
            return real(host, *args, **kwargs)
        lookups.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers), port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    assert read(f"http://feeds.rebind.test:{port}/l", allowed_networks=LOOPBACK) == b"a.example\n"
    assert lookups == ["feeds.rebind.test"]
    assert server.requests[0][1]["Host"] == f"feeds.rebind.test:{port}"


def test_a_name_with_one_internal_address_among_public_ones_is_refused(monkeypatch):
    def mixed(host, port, *args, **kwargs):
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", port)),
        ]

    monkeypatch.setattr(socket, "getaddrinfo", mixed)
    with pytest.raises(FeedError, match="169.254.169.254 is a link-local"):
        read("http://feeds.mixed.test/l")


class StuckResolver:
    """socket.getaddrinfo that never answers until released: each lookup blocks its
    thread on an event, as the system resolver does for its own timeout."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.entered = threading.Condition()
        self.threads: list[threading.Thread] = []

    def __call__(self, host, *args, **kwargs):
        with self.entered:
            self.threads.append(threading.current_thread())
            self.entered.notify_all()
        self.released.wait()
        raise socket.gaierror(socket.EAI_AGAIN, "released by the test")

    def wait_for_lookups(self, count: int) -> None:
        with self.entered:
            assert self.entered.wait_for(lambda: len(self.threads) >= count, timeout=10)

    def release(self) -> None:
        self.released.set()
        for thread in self.threads:
            thread.join(10)
            assert not thread.is_alive()


@pytest.fixture
def stuck_resolver(monkeypatch):
    resolver = StuckResolver()
    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    yield resolver
    resolver.release()


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    ("bounds", "message"),
    [
        ({"connect_timeout": 0.3}, r"not resolved within 0\.3 s \(FEED_CONNECT_TIMEOUT\)"),
        (
            {"connect_timeout": 5, "deadline": 0.3},
            r"not resolved within the 0\.[23]\d* s left of the fetch's 0\.3 s \(FEED_DEADLINE\)",
        ),
    ],
    ids=["connect-timeout", "deadline"],
)
def test_a_resolver_that_never_answers_fails_the_fetch_in_time(stuck_resolver, bounds, message):
    started = time.monotonic()
    with pytest.raises(TransientFeedError, match=rf"feeds\.stuck\.test: {message}"):
        read("http://feeds.stuck.test/l", **bounds)
    # Before the change: blocked for as long as the resolver (here: until the timeout).
    assert time.monotonic() - started < 3
    stuck_resolver.wait_for_lookups(1)


@pytest.mark.timeout(30)
def test_lookups_left_stuck_in_the_resolver_hold_a_bounded_number_of_threads(
    stuck_resolver, server, monkeypatch
):
    for _ in range(fetching.RESOLVER_THREADS):
        with pytest.raises(TransientFeedError, match="not resolved within"):
            read("http://feeds.stuck.test/l", connect_timeout=0.2)
    stuck_resolver.wait_for_lookups(fetching.RESOLVER_THREADS)
    with pytest.raises(
        TransientFeedError, match=f"{fetching.RESOLVER_THREADS} earlier lookups are still waiting"
    ):
        read("http://feeds.stuck.test/l", connect_timeout=0.2)
    assert len(stuck_resolver.threads) == fetching.RESOLVER_THREADS

    # Lookups that end give their threads back.
    stuck_resolver.release()
    url = server.serve("/l", b"a.example\n")
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    monkeypatch.setattr(
        socket,
        "getaddrinfo",
        lambda host, *args, **kwargs: [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))
        ],
    )
    for _ in range(fetching.RESOLVER_THREADS + 1):
        assert read(f"http://feeds.back.test:{port}/l", allowed_networks=LOOPBACK) == b"a.example\n"


def trickle(server, head: bytes, piece: Callable[[int], bytes]):
    """A route that sends `head`, then piece(i) every 0.1 s (each resets the read
    timeout) until the client goes away."""

    def handler(request) -> None:
        request.wfile.write(head)
        for i in range(200):
            if server.release.is_set():
                return
            try:
                request.wfile.write(piece(i))
                request.wfile.flush()
            except OSError:
                return
            time.sleep(0.1)

    return handler


@pytest.mark.parametrize(
    ("head", "piece"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10000\r\n\r\n", lambda i: b"a"),
        (b"HTTP/1.1 200 OK\r\n", lambda i: f"X-Pad-{i}: 1\r\n".encode()),
    ],
    ids=["body", "headers"],
)
def test_the_deadline_stops_a_server_that_trickles(server, head, piece):
    server.routes["/slow"] = trickle(server, head, piece)
    started = time.monotonic()
    with pytest.raises(TransientFeedError, match="FEED_DEADLINE"):
        read(server.url("/slow"), allowed_networks=LOOPBACK, deadline=1.0, read_timeout=5)
    # Before the change: still reading at 20 s (each byte reset the read timeout).
    assert time.monotonic() - started < 4


# -- file:// --------------------------------------------------------------------------


def test_file_urls_are_refused_without_a_root(tmp_path):
    path = tmp_path / "list.txt"
    path.write_bytes(b"a.example\n")
    with pytest.raises(FeedError, match="FEED_FILE_ROOT"):
        read(f"file://{path}")


def test_file_urls_only_beneath_the_root(tmp_path):
    root = tmp_path / "feeds"
    root.mkdir()
    (root / "list.txt").write_bytes(b"a.example\n")
    secret = tmp_path / "secret_key"
    secret.write_bytes(b"django-insecure-abc\n")
    (root / "link").symlink_to(secret)
    assert read(f"file://{root}/list.txt", file_root=str(root)) == b"a.example\n"
    for url in (f"file://{secret}", f"file://{root}/../secret_key", f"file://{root}/link"):
        with pytest.raises(FeedError, match="not beneath FEED_FILE_ROOT"):
            read(url, file_root=str(root))
    with pytest.raises(FeedError, match="not beneath FEED_FILE_ROOT"):
        read("file:///etc/passwd", file_root=str(root))


def test_a_file_url_with_a_nul_is_a_clear_error(tmp_path):
    # %00 decodes to a NUL, which no file name holds: the path library raised ValueError.
    with pytest.raises(FeedError, match="cannot read"):
        read(f"file://{tmp_path}/a%00b", file_root=str(tmp_path))


def test_a_device_is_refused_not_read_without_bound():
    # /dev/urandom has size 0 and never ends: once 1.6 GB spooled in 5 s.
    with pytest.raises(FeedError, match="not a regular file"):
        read("file:///dev/urandom", file_root="/dev", max_bytes=1 << 20)


# -- the admin form -------------------------------------------------------------------

SOURCE_EDITOR = ("view_source", "change_source", "add_source")


@pytest.mark.django_db
def test_only_a_superuser_may_set_a_file_url(make_staff, settings, tmp_path):
    url = reverse("admin:urlguard_source_add")
    data = {"name": "x", "kind": "feed", "format": "auto", "category": "spam"}
    data.update(interval=3600, enabled="on", url="file:///etc/passwd")
    html = make_staff(*SOURCE_EDITOR).post(url, data).content.decode()
    assert "Only a superuser may set a file:// URL" in html
    assert not Source.objects.filter(name="x").exists()
    boss = make_staff(superuser=True)
    assert "FEED_FILE_ROOT" in boss.post(url, data).content.decode()
    settings.URLGUARD = {**settings.URLGUARD, "FEED_FILE_ROOT": str(tmp_path)}
    data["url"] = f"file://{tmp_path}/list.txt"
    assert boss.post(url, data).status_code == 302
    # A curator may edit the feed's other fields, not point it elsewhere.
    source = Source.objects.get(name="x")
    change = reverse("admin:urlguard_source_change", args=[source.pk])
    curator = make_staff(*SOURCE_EDITOR)
    assert curator.post(change, {**data, "interval": 7200}).status_code == 302
    data["url"] = "file:///etc/passwd"
    assert "Only a superuser" in curator.post(change, data).content.decode()
    source.refresh_from_db()
    assert source.url == f"file://{tmp_path}/list.txt" and source.interval == 7200


@pytest.mark.django_db
def test_the_admin_refuses_a_file_url_outside_the_root_by_the_fetchers_rule(
    make_staff, settings, tmp_path
):
    settings.URLGUARD = {**settings.URLGUARD, "FEED_FILE_ROOT": str(tmp_path)}
    (tmp_path / "link").symlink_to("/etc/passwd")
    url = reverse("admin:urlguard_source_add")
    data = {"name": "x", "kind": "feed", "format": "auto", "category": "spam"}
    data.update(interval="1 h", enabled="on")
    boss = make_staff(superuser=True)
    for outside in ("file:///etc/passwd", f"file://{tmp_path}/link"):
        html = boss.post(url, {**data, "url": outside}).content.decode()
        assert "is not beneath FEED_FILE_ROOT" in html, outside
    assert not Source.objects.filter(name="x").exists()
