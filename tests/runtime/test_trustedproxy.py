"""TrustedProxyMiddleware: REMOTE_ADDR made the visitor's behind trusted proxies only,
read from the right of X-Forwarded-For, and every reader of REMOTE_ADDR (the rate
limits first) seeing the rewritten value."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.http import HttpResponse
from django.test import RequestFactory

from urlguard.middleware import TrustedProxyMiddleware
from urlguard.runtime.clientaddress import client_network
from urlguard.runtime.trustedproxy import MAX_CHARS, MAX_HOPS, PROXY_ADDRESS

PROXY = "127.0.0.1"
INNER = "10.0.0.10"  # a second proxy in front of PROXY
TRUSTED = ["127.0.0.1/32", "::1/128", "10.0.0.0/24"]


def _passed(request) -> HttpResponse:
    return HttpResponse("ok")


def after_middleware(settings, remote: str, forwarded: str | None, trusted=TRUSTED) -> dict:
    """request.META as the view sees it, after the middleware."""
    settings.URLGUARD = {**settings.URLGUARD, "TRUSTED_PROXIES": trusted}
    extra = {"REMOTE_ADDR": remote}
    if forwarded is not None:
        extra["HTTP_X_FORWARDED_FOR"] = forwarded
    request = RequestFactory().get("/", **extra)
    TrustedProxyMiddleware(_passed)(request)
    return request.META


@pytest.mark.parametrize(
    ("trusted", "remote", "forwarded", "seen"),
    [
        # No trusted proxies: the header is not even read.
        ([], PROXY, "203.0.113.9", PROXY),
        # Straight from a client that is no proxy: its header names nothing.
        (TRUSTED, "198.51.100.7", "127.0.0.1", "198.51.100.7"),
        (TRUSTED, "198.51.100.7", "203.0.113.9, 10.0.0.10", "198.51.100.7"),
        # One trusted hop: what the client wrote left of its address is ignored.
        (TRUSTED, PROXY, "203.0.113.9, 198.51.100.7", "198.51.100.7"),
        (TRUSTED, PROXY, "198.51.100.7", "198.51.100.7"),
        # Two trusted hops.
        (TRUSTED, PROXY, f"203.0.113.9, 198.51.100.7, {INNER}", "198.51.100.7"),
        (TRUSTED, PROXY, f"198.51.100.7,{INNER}", "198.51.100.7"),
        # A client spoofing a trusted address left of its own gains nothing.
        (TRUSTED, PROXY, f"{INNER}, 198.51.100.7", "198.51.100.7"),
        # IPv6 clients and proxies; an IPv4 proxy seen through a dual-stack socket.
        (TRUSTED, PROXY, "2001:db8:1:2::77", "2001:db8:1:2::77"),
        (TRUSTED, "::1", "2001:DB8:1:2:0:0:0:77", "2001:db8:1:2::77"),
        (TRUSTED, "::ffff:127.0.0.1", "198.51.100.7", "198.51.100.7"),
        # Garbage where the walk reaches it: the last trusted hop's address.
        (TRUSTED, PROXY, "not-an-address", PROXY),
        (TRUSTED, PROXY, f"198.51.100.7, garbage, {INNER}", INNER),
        (TRUSTED, PROXY, f"198.51.100.7, , {INNER}", INNER),
        # Forms nginx never writes are refused: a port, brackets, a zone.
        (TRUSTED, PROXY, "198.51.100.7:4711", PROXY),
        (TRUSTED, PROXY, "[2001:db8::77]", PROXY),
        (TRUSTED, PROXY, "[2001:db8::77]:4711", PROXY),
        (TRUSTED, PROXY, "fe80::1%eth0", PROXY),
        # Garbage left of the client is the client's own business.
        (TRUSTED, PROXY, "<script>, 198.51.100.7", "198.51.100.7"),
        # Empty or blank header: nothing to walk.
        (TRUSTED, PROXY, "", PROXY),
        (TRUSTED, PROXY, "   ", PROXY),
        # Two X-Forwarded-For headers, joined with a comma by the WSGI server.
        (TRUSTED, PROXY, "203.0.113.9,198.51.100.7", "198.51.100.7"),
    ],
)
def test_the_address_walk(settings, trusted, remote, forwarded, seen):
    meta = after_middleware(settings, remote, forwarded, trusted)
    assert meta["REMOTE_ADDR"] == seen
    if seen != remote:
        assert meta[PROXY_ADDRESS] == remote
    else:
        assert PROXY_ADDRESS not in meta


def test_no_header_leaves_the_request_alone(settings):
    meta = after_middleware(settings, PROXY, None)
    assert meta["REMOTE_ADDR"] == PROXY and PROXY_ADDRESS not in meta


def test_an_ipv6_client_is_still_counted_by_its_64(settings):
    meta = after_middleware(settings, PROXY, "2001:db8:1:2:aaaa::1")
    request = RequestFactory().get("/", REMOTE_ADDR=meta["REMOTE_ADDR"])
    assert client_network(request) == "2001:db8:1:2::/64"


def test_too_many_trusted_entries_stop_at_the_last_one_looked_at(settings):
    hops = [f"10.0.0.{n}" for n in range(MAX_HOPS + 1)]  # hops[0] is the leftmost
    meta = after_middleware(settings, PROXY, ", ".join(["198.51.100.7", *hops]))
    assert meta["REMOTE_ADDR"] == hops[1]  # the 64th from the right: never 198.51.100.7
    meta = after_middleware(settings, PROXY, ", ".join(["198.51.100.7", *hops[2:]]))
    assert meta["REMOTE_ADDR"] == "198.51.100.7"  # 63 hops and the client: within bounds


def test_an_overlong_header_is_read_from_its_right_end_only(settings):
    trusted_run = ", ".join(["10.0.0.1"] * (MAX_CHARS // 10 + 1))
    assert len(trusted_run) > MAX_CHARS
    meta = after_middleware(settings, PROXY, "198.51.100.7, " + trusted_run)
    assert meta["REMOTE_ADDR"] == "10.0.0.1"
    # Whatever a client puts in front of its own address cannot push that address out.
    meta = after_middleware(settings, PROXY, "x" * 100_000 + ", 198.51.100.7, " + INNER)
    assert meta["REMOTE_ADDR"] == "198.51.100.7"
    meta = after_middleware(settings, PROXY, "1" * 100_000)
    assert meta["REMOTE_ADDR"] == PROXY


def test_a_settings_change_applies_to_a_middleware_already_built(settings):
    settings.URLGUARD = {**settings.URLGUARD, "TRUSTED_PROXIES": []}
    middleware = TrustedProxyMiddleware(_passed)
    request = RequestFactory().get("/", REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR="198.51.100.7")
    middleware(request)
    assert request.META["REMOTE_ADDR"] == PROXY
    settings.URLGUARD = {**settings.URLGUARD, "TRUSTED_PROXIES": ["127.0.0.1/32"]}
    middleware(request)
    assert request.META["REMOTE_ADDR"] == "198.51.100.7"


def test_async_requests_are_rewritten_too(settings):
    settings.URLGUARD = {**settings.URLGUARD, "TRUSTED_PROXIES": ["127.0.0.1/32"]}
    seen = []

    async def view(request):
        seen.append(request.META["REMOTE_ADDR"])
        return HttpResponse("ok")

    middleware = TrustedProxyMiddleware(view)
    request = RequestFactory().get("/", REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR="198.51.100.7")
    assert async_to_sync(middleware)(request).status_code == 200
    assert seen == ["198.51.100.7"]


def test_it_comes_before_every_middleware_that_reads_remote_addr():
    from django.conf import settings

    assert settings.MIDDLEWARE[:2] == [
        "urlguard.middleware.TrustedProxyMiddleware",
        "urlguard.middleware.RedirectGuardMiddleware",
    ]


# -- through the service: the check API's per-address rate limit ------------------------


@pytest.fixture
def behind_proxy(settings, db):
    settings.URLGUARD = {
        **settings.URLGUARD,
        "API_OPEN_RATE": "2/d",  # a minute's window could end amid the requests
        "TRUSTED_PROXIES": ["127.0.0.1/32"],
    }


def check(client, remote: str, forwarded: str | None = None) -> int:
    headers = {} if forwarded is None else {"HTTP_X_FORWARDED_FOR": forwarded}
    url = {"url": "https://example.com/"}
    return client.get("/api/check", url, REMOTE_ADDR=remote, **headers).status_code


def test_two_visitors_behind_the_proxy_have_their_own_limits(client, behind_proxy):
    assert [check(client, PROXY, "198.51.100.1") for _ in range(3)] == [200, 200, 429]
    # Another visitor through the same proxy: its own bucket, not the first one's.
    assert [check(client, PROXY, "198.51.100.2") for _ in range(3)] == [200, 200, 429]
    # A visitor cannot leave its bucket by writing another address in front of its own.
    assert check(client, PROXY, "198.51.100.9, 198.51.100.1") == 429


def test_a_client_sending_the_header_straight_cannot_leave_its_bucket(client, behind_proxy):
    assert [check(client, "198.51.100.1", f"203.0.113.{n}") for n in range(3)] == [200, 200, 429]
    # Nor take another visitor's: its own address is what counts.
    assert check(client, "198.51.100.3", "198.51.100.1") == 200


def test_the_admin_lock_out_is_per_visitor_behind_the_proxy(client, settings, db):
    from django.contrib.auth.models import User

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.URLGUARD = {**settings.URLGUARD, "TRUSTED_PROXIES": ["127.0.0.1/32"]}
    User.objects.create_superuser("boss", "boss@localhost", "right-one")

    def login(visitor: str, password: str) -> int:
        data = {"username": "boss", "password": password, "next": "/admin/"}
        return client.post(
            "/admin/login/", data, REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=visitor
        ).status_code

    attempts = [login("203.0.113.66", f"guess-{n}") for n in range(settings.AXES_FAILURE_LIMIT)]
    assert attempts[-1] == 429
    # Another visitor through the same proxy still logs in.
    assert login("198.51.100.7", "right-one") == 302


def test_metrics_judge_the_visitor_not_the_proxy(client, settings, db):
    settings.URLGUARD = {**settings.URLGUARD, "TRUSTED_PROXIES": ["127.0.0.1/32"]}
    # Loopback is allowed by default: the proxy itself still scrapes...
    assert client.get("/metrics", REMOTE_ADDR=PROXY).status_code == 200
    # ...but a visitor it passes on is judged by its own address.
    forwarded = {"REMOTE_ADDR": PROXY, "HTTP_X_FORWARDED_FOR": "203.0.113.5"}
    assert client.get("/metrics", **forwarded).status_code == 403
    assert "failed" in client.get("/readyz", **forwarded).json()
    assert "checks" not in client.get("/readyz", **forwarded).json()


def test_visitor_ids_tell_visitors_behind_the_proxy_apart(settings):
    from urlguard.runtime.visitors import visitor_id

    settings.URLGUARD = {**settings.URLGUARD, "TRUSTED_PROXIES": TRUSTED}
    one, two = (
        RequestFactory().get("/", REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=visitor)
        for visitor in ("198.51.100.1", "198.51.100.2")
    )
    for request in (one, two):
        TrustedProxyMiddleware(_passed)(request)
    assert visitor_id(one) != visitor_id(two)
