"""Fixtures of the app's tests (every Django test folder's conftest.py imports them;
tests/engine, the library without Django, does not): staff users with chosen
permissions, logged-in clients, a way to run on-commit work (the change-log nudge, the
import and rescan jobs) as the embedded default does, a fresh guard, a feed server, a
DNS server, the exports' pre-render recorded instead of started, a broker that never
answers, and the live services' checks and worker (tests/support/services.py)."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from tests.support.services import services_available, start_worker

# `import *` in each folder's conftest.py: the autouse fixtures start with "_" too.
__all__ = [
    "RULE_EDITOR",
    "make_staff",
    "editor",
    "viewer",
    "superuser",
    "fresh_guard",
    "committed",
    "quiet",
    "quiet_feeds",
    "server",
    "_admin_jobs_inline",
    "database_fails",
    "dns_server",
    "prerender_requests",
    "prerender_inline",
    "services_available",
    "start_worker",
    "silent_broker",
]


@pytest.fixture
def make_staff(db, django_user_model) -> Callable[..., Client]:
    """make_staff("view_spamrule", ...) -> a client logged in as a staff user holding
    exactly those urlguard permissions (superuser=True: all of them)."""
    made = 0

    def make(*codenames: str, superuser: bool = False) -> Client:
        nonlocal made
        made += 1
        user = django_user_model.objects.create_user(
            # No password: force_login needs none, and hashing one costs ~0.5 s per user.
            f"staff{made}",
            password=None,
            is_staff=True,
            is_superuser=superuser,
        )
        for codename in codenames:
            user.user_permissions.add(
                Permission.objects.get(codename=codename, content_type__app_label="urlguard")
            )
        client = Client()
        client.force_login(user)
        client.user = user
        return client

    return make


RULE_EDITOR = ("view_spamrule", "add_spamrule", "change_spamrule", "delete_spamrule")


@pytest.fixture
def editor(make_staff) -> Client:
    """Staff who may view, add, change and delete rules, but not rebuild."""
    return make_staff(*RULE_EDITOR)


@pytest.fixture
def viewer(make_staff) -> Client:
    """Staff who may only view rules."""
    return make_staff("view_spamrule")


@pytest.fixture
def superuser(make_staff) -> Client:
    return make_staff(superuser=True)


@pytest.fixture
def fresh_guard():
    """A guard built for this test (and none left behind): its caches and its filter
    path must not come from another test's settings."""
    from urlguard.hotpath.guard import reset_guard

    reset_guard()
    yield
    reset_guard()


@pytest.fixture
def committed(django_capture_on_commit_callbacks):
    """`with committed(): ...` runs the on-commit callbacks (the apply_changes nudge,
    queued admin jobs) when the block ends, as autocommit does outside tests."""
    return lambda: django_capture_on_commit_callbacks(execute=True)


@pytest.fixture
def quiet(nudges: list[int]) -> None:
    """Rule writes send no nudge: the test delivers (or loses) them itself."""


@pytest.fixture
def quiet_feeds(nudges: list[int], settings) -> None:
    """For the feed tests: no nudges, and short fetch timeouts (a test's feed server
    answers at once, or is meant never to)."""
    settings.URLGUARD = {**settings.URLGUARD, "FEED_READ_TIMEOUT": 0.5, "FEED_CONNECT_TIMEOUT": 1}


@pytest.fixture
def server(settings):
    """A feed server on loopback (tests/support/feedserver.py) that this test's
    fetches may reach."""
    from tests.support.feedserver import admit_loopback, feed_server

    admit_loopback(settings)
    with feed_server() as feeds:
        yield feeds


@pytest.fixture(autouse=True)
def _admin_jobs_inline(monkeypatch) -> None:
    """Admin jobs run inside the request that starts them, so a test reads their
    outcome at once (the tests of where jobs run, and the browser tests, use the
    runner thread)."""
    from urlguard.jobs import dispatch

    monkeypatch.setattr(dispatch, "_memory_database", lambda: True)


@pytest.fixture
def database_fails(monkeypatch):
    """database_fails(error): every query on the default connection raises `error`
    from then on, as if the server were gone (an OperationalError) or the connection
    broken (an InterfaceError)."""
    from django.db import connections

    def fail(error: Exception) -> None:
        monkeypatch.setattr(
            connections["default"], "cursor", lambda *a, **k: (_ for _ in ()).throw(error)
        )

    return fail


@pytest.fixture
def dns_server(build_filter, fresh_guard):
    """dns_server(**overrides) -> a started serve_dns server (urlguard.exports.dnsserver)
    on a free loopback port (`.port`, UDP and TCP) for the zones rpz.urlguard. and
    uribl.urlguard., transfers allowed to loopback; stopped after the test. The filter
    is built first (the URIBL zone answers through the guard)."""
    import ipaddress

    from urlguard.exports.dnsserver import DnsConfig, DnsServer

    servers = []

    def start(**overrides):
        config = {
            "rpz_zone": "rpz.urlguard.",
            "uribl_zone": "uribl.urlguard.",
            "transfer_networks": (ipaddress.ip_network("127.0.0.0/8"),),
            **overrides,
        }
        server = DnsServer(DnsConfig(**config))
        server.port = server.start("127.0.0.1", 0)[1]
        servers.append(server)
        return server

    build_filter()
    yield start
    for server in servers:
        server.stop()


@pytest.fixture(autouse=True)
def prerender_requests(monkeypatch) -> list[None]:
    """The exports' background pre-render (urlguard.exports.prerender), recorded
    instead of started: a thread of its own cannot see a test's uncommitted rows. A
    test of it uses `prerender_inline`, or the real thread in a transactional test."""
    from urlguard.exports import prerender

    asked: list[None] = []
    monkeypatch.setattr(prerender, "request", lambda: asked.append(None))
    return asked


@pytest.fixture
def prerender_inline(monkeypatch) -> None:
    """The pre-render finishes before the next poll (it runs in the caller)."""
    from urlguard.exports import prerender

    monkeypatch.setattr(prerender, "request", prerender.render_all)


@pytest.fixture
def silent_broker():
    """A broker that takes connections and never answers: the listening socket's
    backlog completes every handshake, and nothing ever reads or writes."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    yield listener.getsockname()[1]
    listener.close()
