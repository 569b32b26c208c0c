"""The check API's rate limits on a real Redis cache (CACHE_URL): counted there, so
every process and node shares them; an unreachable Redis lets requests through."""

from __future__ import annotations

import os
import socket
import uuid
from urllib.parse import urlparse

import pytest
import redis
from django.conf import settings as django_settings


def _redis_url() -> str:
    broker = django_settings.CELERY_BROKER_URL
    return broker if broker.startswith("redis://") else ""


def _skip_reason() -> str:
    url = _redis_url()
    if not url:
        return "needs CELERY_BROKER_URL=redis://127.0.0.1:6379/15 (`make test-live`)"
    parts = urlparse(url)
    try:
        socket.create_connection((parts.hostname, parts.port or 6379), timeout=2).close()
    except OSError as exc:
        return f"{parts.hostname}:{parts.port} unreachable ({exc})"
    return ""


_SKIP = _skip_reason()
# Under CI: fail, not skip (tests/service/test_services.py says why).
_MUST_RUN = bool(os.environ.get("CI"))
pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(bool(_SKIP) and not _MUST_RUN, reason=_SKIP),
    pytest.mark.django_db,
]


@pytest.fixture(autouse=True)
def _redis_reachable():
    if _SKIP and _MUST_RUN:
        pytest.fail(f"{_SKIP} (CI is set: live tests must run, not skip)")


def _cache(location: str, prefix: str) -> dict:
    return {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": location,
            "KEY_PREFIX": prefix,
        }
    }


def test_the_open_get_is_limited_in_redis(client, settings):
    prefix = f"urlguard-test-{uuid.uuid4().hex}"
    settings.CACHES = _cache(_redis_url(), prefix)
    settings.URLGUARD = {**settings.URLGUARD, "API_OPEN_RATE": "2/m"}
    url = {"url": "https://example.com/"}
    try:
        assert [client.get("/api/check", url).status_code for _ in range(3)] == [200, 200, 429]
        # The count is in Redis, where another process would find it.
        keys = redis.Redis.from_url(_redis_url()).keys(f"{prefix}:*")
        assert len(keys) == 1
    finally:
        server = redis.Redis.from_url(_redis_url())
        for key in server.keys(f"{prefix}:*"):  # ours only: the server is shared
            server.delete(key)


def test_an_unreachable_redis_lets_requests_through(client, settings, caplog):
    # Nothing listens there (a port of this helper's range, never bound).
    settings.CACHES = _cache("redis://127.0.0.1:18899/0", "urlguard-test")
    settings.URLGUARD = {**settings.URLGUARD, "API_OPEN_RATE": "1/m"}
    statuses = [client.get("/api/check", {"url": "https://example.com/"}).status_code]
    statuses.append(client.get("/api/check", {"url": "https://example.com/"}).status_code)
    assert statuses == [200, 200]
    assert "rate limits not applied: the cache failed" in caplog.text
