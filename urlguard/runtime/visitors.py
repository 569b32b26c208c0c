"""A visitor's id: (client address, user agent) hashed under SECRET_KEY, so that clicks,
a warning's "continue anyway" token and a mistake report can be tied to the same visitor
without storing either value."""

from __future__ import annotations

import hashlib

from django.conf import settings
from django.http import HttpRequest

_visitor_key: tuple[str, bytes] | None = None


def _key() -> bytes:
    # Derived once per SECRET_KEY (override_settings in tests changes it); BLAKE2b
    # keys are at most 64 bytes, and a personalised hash keeps this key apart
    # from any other use of the secret.
    global _visitor_key
    secret = settings.SECRET_KEY
    if _visitor_key is None or _visitor_key[0] != secret:
        derived = hashlib.blake2b(
            secret.encode(), digest_size=32, person=b"urlguard.visitor"
        ).digest()
        _visitor_key = (secret, derived)
    return _visitor_key[1]


def visitor_id(request: HttpRequest) -> str:
    """32 hex characters identifying (client address, user agent) under SECRET_KEY."""
    address = request.META.get("REMOTE_ADDR", "") or ""
    agent = request.META.get("HTTP_USER_AGENT", "") or ""
    # NUL cannot occur in either header value: the join is unambiguous.
    data = f"{address}\x00{agent}".encode("utf-8", "surrogateescape")
    return hashlib.blake2b(data, key=_key(), digest_size=16).hexdigest()
