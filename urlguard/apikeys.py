"""API keys of the batch check API: made (the key shown once, only its hash kept),
looked up from an `Authorization: Bearer <key>` header, revoked, and their last use
recorded at most once a minute (not a database write per request)."""

from __future__ import annotations

import contextlib
import hashlib
import secrets
from datetime import timedelta

from django.db import DatabaseError
from django.utils import timezone

from urlguard.models import APIKey

__all__ = ["KEY_PREFIX", "authenticate", "create_api_key", "hash_key", "revoke"]

#: Marks a string as one of our keys (for people and secret scanners alike).
KEY_PREFIX = "ugk_"
#: Characters of a key kept in clear to tell keys apart in the admin.
SHOWN = len(KEY_PREFIX) + 6
#: How stale APIKey.last_used_at may be.
LAST_USED_EVERY = timedelta(minutes=1)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def new_key() -> tuple[str, str, str]:
    """(key, prefix, hash) of a new random key."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, key[:SHOWN], hash_key(key)


def create_api_key(name: str) -> tuple[APIKey, str]:
    """A new key named `name`; returns (row, key). The key is nowhere else."""
    key, prefix, digest = new_key()
    return APIKey.objects.create(name=name, prefix=prefix, key_hash=digest), key


def revoke(queryset) -> int:  # type: ignore[no-untyped-def]
    """Revoke the keys of `queryset` not revoked yet; returns how many."""
    return int(queryset.filter(revoked_at=None).update(revoked_at=timezone.now()))


def bearer(header: str) -> str:
    """The token of an `Authorization: Bearer <token>` header ("" if none)."""
    scheme, _, token = header.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def authenticate(header: str) -> APIKey | None:
    """The live key named by an Authorization header value, or None (missing, unknown
    or revoked). Raises DatabaseError when the table cannot be read."""
    token = bearer(header)
    if not token:
        return None
    key = APIKey.objects.filter(key_hash=hash_key(token), revoked_at=None).first()
    if key is not None:
        _touch(key)
    return key


def _touch(key: APIKey) -> None:
    now = timezone.now()
    if key.last_used_at is not None and now - key.last_used_at < LAST_USED_EVERY:
        return
    key.last_used_at = now
    with contextlib.suppress(DatabaseError):  # a statistic: the check matters more
        APIKey.objects.filter(pk=key.pk).update(last_used_at=now)
