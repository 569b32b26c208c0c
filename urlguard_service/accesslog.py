"""gunicorn's access-log atoms without credentials: an API key arrives as a bearer
token, as basic auth's user name or password (exports accept it where a consumer can
send nothing else) or in a query parameter, and whoever reads the log must not
collect it there. Set by urlguard_service.gunicornconf (`logger_class`), so every
access-log format, the operator's own included, gets the redacted values."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote_plus

from gunicorn.glogging import Logger  # type: ignore[import-untyped]

__all__ = ["REDACTED", "RedactingLogger", "redact_query"]

REDACTED = "[redacted]"
# Request and response headers, and their WSGI environ names, that carry credentials.
_HEADERS = ("authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key")
_CREDENTIAL_ATOMS = frozenset(
    [f"{{{h}}}i" for h in _HEADERS]
    + [f"{{{h}}}o" for h in _HEADERS]
    + [f"{{http_{h.replace('-', '_')}}}e" for h in _HEADERS]
)
# Query parameters that name a credential (the Safe Browsing API's `key` among them).
_CREDENTIAL_PARAMETERS = frozenset(
    ("key", "api_key", "apikey", "access_token", "password", "passwd", "secret")
)


def redact_query(query: str) -> str:
    """`query` with the value of every credential-named parameter replaced."""
    if not query:
        return query
    parts = query.split("&")
    for n, part in enumerate(parts):
        name, sep, _ = part.partition("=")
        if unquote_plus(name).strip().lower() in _CREDENTIAL_PARAMETERS:
            parts[n] = f"{name}={REDACTED}"
    return "&".join(parts)


# An absolute URL's user info (scheme://user:password@host), where a key may ride.
_USER_INFO = re.compile(r"^([a-z][a-z0-9+.-]*://)[^/?#]*@", re.IGNORECASE)


def _redact_target(target: str) -> str:
    """A request target or a URL (a Referer) without user info or credential values."""
    target = _USER_INFO.sub(rf"\1{REDACTED}@", target, count=1)
    path, sep, query = target.partition("?")
    return f"{path}{sep}{redact_query(query)}" if sep else target


class RedactingLogger(Logger):
    def atoms(self, resp: Any, req: Any, environ: Any, request_time: Any) -> dict[str, Any]:
        atoms: dict[str, Any] = super().atoms(resp, req, environ, request_time)
        # gunicorn's %(u)s is basic auth's user name, where a client may put its key.
        atoms["u"] = "-"
        raw_uri = _redact_target(str(environ.get("RAW_URI", "")))
        atoms["r"] = f"{environ.get('REQUEST_METHOD')} {raw_uri} {environ.get('SERVER_PROTOCOL')}"
        atoms["q"] = redact_query(str(environ.get("QUERY_STRING") or ""))
        atoms["{raw_uri}e"] = raw_uri
        atoms["{query_string}e"] = atoms["q"]
        atoms["{request_uri}e"] = _redact_target(str(environ.get("REQUEST_URI", "")))
        # The Referer (in gunicorn's default format) may be a URL with a key in it.
        referer = environ.get("HTTP_REFERER")
        if referer is not None:
            atoms["f"] = atoms["{referer}i"] = atoms["{http_referer}e"] = _redact_target(referer)
        for name in _CREDENTIAL_ATOMS.intersection(atoms):
            atoms[name] = REDACTED
        return atoms
