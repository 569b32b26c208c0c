"""API keys of the batch check API: made (the key shown once, only its hash kept),
looked up from an `Authorization: Bearer <key>` header, revoked, and their last use
recorded at most once a minute (not a database write per request). Every place that
takes a key (the check API, /lists/) goes through authenticate_request, which counts
missing and wrong keys per client address and refuses an address past
API_FAILED_KEY_RATE: no place is an unthrottled one to guess keys at."""

from __future__ import annotations

import contextlib
import hashlib
import secrets
from datetime import timedelta

from django.db import DatabaseError
from django.http import HttpRequest
from django.utils import timezone

from urlguard.conf import conf
from urlguard.models import APIKey
from urlguard.runtime.ratelimits import Limited, limited, per_client

__all__ = [
    "KEY_PREFIX",
    "WRONG_KEYS",
    "authenticate",
    "authenticate_request",
    "create_api_key",
    "hash_key",
    "revoke",
]

#: Marks a string as one of our keys (for people and secret scanners alike).
KEY_PREFIX = "ugk_"
#: Characters of a key kept in clear to tell keys apart in the admin.
SHOWN = len(KEY_PREFIX) + 6
#: How stale APIKey.last_used_at may be.
LAST_USED_EVERY = timedelta(minutes=1)
#: The rate-limit group of missing and wrong keys, one count per client address
#: whichever place took them.
WRONG_KEY_GROUP = "urlguard.api.wrong-key"
#: What that limit counts, as a refusal names it.
WRONG_KEYS = "requests with a wrong API key reached for this address"


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


def revoke(queryset) -> int:
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


def authenticate_request(request: HttpRequest, header: str) -> APIKey | Limited | None:
    """The live key named by `header` (an Authorization value), None if it is missing,
    unknown or revoked (counted against the client address, IPv6 by its /64), or
    Limited once that address sent more than API_FAILED_KEY_RATE of those in the
    window: then not even a right key is looked up (no oracle for guesses). Raises
    DatabaseError when the table cannot be read."""
    rate = conf.API_FAILED_KEY_RATE
    refused = limited(request, WRONG_KEY_GROUP, per_client, rate, count=False)
    if refused is not None:
        return refused
    key = authenticate(header)
    if key is None:
        limited(request, WRONG_KEY_GROUP, per_client, rate, count=True)
    return key


def _touch(key: APIKey) -> None:
    now = timezone.now()
    if key.last_used_at is not None and now - key.last_used_at < LAST_USED_EVERY:
        return
    key.last_used_at = now
    with contextlib.suppress(DatabaseError):  # a statistic: the check matters more
        APIKey.objects.filter(pk=key.pk).update(last_used_at=now)
