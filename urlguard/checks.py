"""System checks for the URLGUARD settings (stable ids urlguard.E000 ..., W001 ...):
one per row of the settings table in urlguard/conf.py, plus the few that look at
more than one value. `refuse_to_start` makes the WSGI/ASGI entry points stop on
the same errors `manage.py check` and `runserver` stop on.

A missing filter file is only a warning: the command that fixes it
(`manage.py rebuild_filter`) runs the checks too and must not be blocked by them."""

from __future__ import annotations

import difflib
import os
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register, run_checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import SystemCheckError

from urlguard.conf import SETTINGS, is_placeholder

MIDDLEWARE_PATH = "urlguard.middleware.RedirectGuardMiddleware"
PROXY_MIDDLEWARE_PATH = "urlguard.middleware.TrustedProxyMiddleware"


def _writable_dir(directory: str) -> str:
    """ "" if `directory` exists and is writable, or can be created; else why not."""
    probe = os.path.abspath(directory)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        return f"{probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable by this user (uid {os.getuid()})"
    return ""


def _unknown(name: str) -> Warning:
    close = difflib.get_close_matches(name, SETTINGS, n=1, cutoff=0.6)
    hint = (
        f"Did you mean {close[0]!r}?"
        if close
        else f"Known settings: {', '.join(sorted(SETTINGS))}."
    )
    return Warning(
        f"Unknown URLGUARD setting {name!r}; it is ignored.",
        hint=hint,
        id="urlguard.W002",
    )


@register("urlguard")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    namespace = getattr(settings, "URLGUARD", {})
    if not isinstance(namespace, dict):
        return [
            Error(
                f"settings.URLGUARD must be a dict; got {type(namespace).__name__}.",
                hint="e.g. URLGUARD = {'FILTER_PATH': '/var/lib/urlguard/filter.bin'}",
                id="urlguard.E000",
            )
        ]

    messages: list[CheckMessage] = []
    for row in SETTINGS.values():
        problem = row.problem(row.raw())
        if problem:
            messages.append(Error(problem, hint=row.full_hint(), id=row.check_id))
    messages.extend(_unknown(name) for name in namespace if name not in SETTINGS)

    if MIDDLEWARE_PATH not in getattr(settings, "MIDDLEWARE", ()):
        messages.append(
            Error(
                f"{MIDDLEWARE_PATH} is not in settings.MIDDLEWARE, so no redirect is checked.",
                hint=f"Add '{MIDDLEWARE_PATH}' near the top of MIDDLEWARE.",
                id="urlguard.E004",
            )
        )
    proxies = SETTINGS["TRUSTED_PROXIES"].raw()
    if proxies and PROXY_MIDDLEWARE_PATH not in getattr(settings, "MIDDLEWARE", ()):
        messages.append(
            Error(
                f"URLGUARD['TRUSTED_PROXIES'] names proxies, but {PROXY_MIDDLEWARE_PATH} is "
                "not in settings.MIDDLEWARE, so REMOTE_ADDR stays the proxy's: every "
                "visitor shares its rate limits.",
                hint=f"Add '{PROXY_MIDDLEWARE_PATH}' first in MIDDLEWARE.",
                id="urlguard.E084",
            )
        )

    path_row = SETTINGS["FILTER_PATH"]
    if path_row.problem(path_row.raw()):
        return messages  # E010 said it; the directory of a wrong path means nothing
    try:
        path = path_row.resolve(path_row.raw())
    except ImproperlyConfigured:
        return messages  # under a DATA_DIR that E025 refused
    directory = os.path.dirname(os.path.abspath(path))
    problem = _writable_dir(directory)
    if problem:
        messages.append(
            Error(
                f"The filter directory {directory} cannot be used: {problem}.",
                hint="Create it and give the web server's user write access, or point "
                "URLGUARD['DATA_DIR'] (or URLGUARD['FILTER_PATH']) somewhere writable.",
                id="urlguard.E001",
            )
        )
    elif not os.path.exists(path):
        policy = SETTINGS["ON_FILTER_ERROR"].raw()
        messages.append(
            Warning(
                f"The filter file {path} does not exist yet; until it does, every check "
                f"follows ON_FILTER_ERROR={policy!r}.",
                hint="Run `python manage.py rebuild_filter` (or start the Celery worker, "
                "which builds it at boot).",
                id="urlguard.W001",
            )
        )
    return messages


# The key the standalone service falls back to, and Django's own marker of a generated
# development key: either one is known to anyone who has read the source.
_KNOWN_KEYS = ("dev-only-insecure-key-change-me-in-production",)
_KNOWN_KEY_PREFIX = "django-insecure-"


def _weak_secret_key(key: object) -> str:
    """Why `key` must not sign anything in production, or ""."""
    if not isinstance(key, str) or key in _KNOWN_KEYS or key.startswith(_KNOWN_KEY_PREFIX):
        return "is the shipped default, known to anyone who has read the source"
    if is_placeholder(key):
        return "is a placeholder (such as deploy/'s CHANGE-ME-...), known to anyone who has read it"
    # Django's own bar for check --deploy (security.W009).
    if len(key) < 50 or len(set(key)) < 5:
        return f"is too short ({len(key)} characters, {len(set(key))} distinct; at least 50 and 5)"
    return ""


# A deployment check: judging the host's own SECRET_KEY must not stop a host's test run
# on a development key. The standalone service promotes it to an ordinary check.
@register("urlguard", deploy=True)
def check_secret_key(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """With DEBUG off, refuse a known or short SECRET_KEY: whoever knows it can sign a
    "continue anyway" link to any URL (the continue view then redirects unchecked)
    and reverse the visitor hashes of the click table to addresses."""
    if settings.DEBUG:
        return []
    weakness = _weak_secret_key(getattr(settings, "SECRET_KEY", None))
    if not weakness:
        return []
    return [
        Error(
            f"SECRET_KEY {weakness}, and DEBUG is off.",
            hint="Set SECRET_KEY to a long random value, the same on every node (the "
            "standalone service reads the environment variable DJANGO_SECRET_KEY), e.g. "
            "the output of `python -c 'import secrets; print(secrets.token_urlsafe(50))'`.",
            id="urlguard.E100",
        )
    ]


# A deployment check for the same reason as check_secret_key; the service promotes it.
@register("urlguard", deploy=True)
def check_database_passwords(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """With DEBUG off, refuse a database password that is a placeholder: a database
    that accepts it is open to anyone who has read the example it was copied from."""
    if settings.DEBUG:
        return []
    databases = getattr(settings, "DATABASES", {})
    return [
        Error(
            f"DATABASES[{alias!r}]['PASSWORD'] is a placeholder (such as deploy/'s "
            "CHANGE-ME), and DEBUG is off.",
            hint="Give the database user a password of its own and put it in the database "
            "URL (the standalone service reads DATABASE_URL, "
            "postgres://USER:PASSWORD@HOST:5432/NAME).",
            id="urlguard.E101",
        )
        for alias, database in databases.items()
        if isinstance(database, dict) and is_placeholder(database.get("PASSWORD"))
    ]


def refuse_to_start() -> None:
    """Raise SystemCheckError if the system checks find an error, as `runserver` does
    before it serves: gunicorn and ASGI servers run no checks of their own, and a
    wrong setting must stop the boot, not answer every request with an error."""
    errors = [m for m in run_checks() if m.is_serious() and not m.is_silenced()]
    if errors:
        lines = "\n".join(str(e) for e in errors)
        raise SystemCheckError(
            f"The system checks found {len(errors)} error(s); not starting:\n{lines}"
        )
