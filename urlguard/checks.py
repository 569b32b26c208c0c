"""System checks for the URLGUARD settings (stable ids urlguard.E001 ..., W001 ...).

A missing filter file is only a warning: the command that fixes it
(`manage.py rebuild_filter`) runs the checks too and must not be blocked by them."""

from __future__ import annotations

import os
from numbers import Real
from typing import Any

from django.conf import settings
from django.core.checks import Error, Warning, register

from urlguard.conf import DEFAULTS, conf
from urlguard.conf import ON_FILTER_ERROR_POLICIES as POLICIES

MIDDLEWARE_PATH = "urlguard.middleware.RedirectGuardMiddleware"


def _number(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


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


@register("urlguard")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    messages: list[Any] = []
    namespace = getattr(settings, "URLGUARD", {})
    if not isinstance(namespace, dict):
        return [
            Error(
                "settings.URLGUARD must be a dict.",
                hint="e.g. URLGUARD = {'FILTER_PATH': '/var/lib/urlguard/filter.bin'}",
                id="urlguard.E000",
            )
        ]

    path = conf.FILTER_PATH
    directory = os.path.dirname(os.path.abspath(str(path)))
    problem = _writable_dir(directory)
    if problem:
        messages.append(
            Error(
                f"The filter directory {directory} cannot be used: {problem}.",
                hint="Create it and give the service user write access, or point "
                "URLGUARD['FILTER_PATH'] (or URLGUARD_VAR_DIR) somewhere writable.",
                id="urlguard.E001",
            )
        )

    rate = conf.FILTER_ERROR_RATE
    if not _number(rate) or not 0 < rate < 1:
        messages.append(
            Error(
                f"URLGUARD['FILTER_ERROR_RATE'] must be a number between 0 and 1 (exclusive); "
                f"got {rate!r}.",
                hint="e.g. 0.01 for a 1% false-positive rate (false positives only cost a "
                "database query; they never warn a user).",
                id="urlguard.E002",
            )
        )

    capacity = conf.FILTER_CAPACITY
    if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0:
        messages.append(
            Error(
                f"URLGUARD['FILTER_CAPACITY'] must be a positive integer; got {capacity!r}.",
                hint="The capacity of the first stage, e.g. 100000; later stages grow.",
                id="urlguard.E003",
            )
        )

    headroom = conf.REBUILD_HEADROOM
    if not _number(headroom) or headroom < 1:
        messages.append(
            Error(
                f"URLGUARD['REBUILD_HEADROOM'] must be a number of at least 1; got {headroom!r}.",
                hint="A rebuild sizes the first stage to the rules times this, e.g. 1.5.",
                id="urlguard.E008",
            )
        )

    max_stages = conf.FILTER_MAX_STAGES
    if not isinstance(max_stages, int) or isinstance(max_stages, bool) or max_stages < 1:
        messages.append(
            Error(
                f"URLGUARD['FILTER_MAX_STAGES'] must be a positive integer; got {max_stages!r}.",
                hint="A file with more stages is compacted by the periodic catch-up, e.g. 4.",
                id="urlguard.E009",
            )
        )

    if MIDDLEWARE_PATH not in getattr(settings, "MIDDLEWARE", ()):
        messages.append(
            Error(
                f"{MIDDLEWARE_PATH} is not in settings.MIDDLEWARE, so no redirect is checked.",
                hint=f"Add '{MIDDLEWARE_PATH}' near the top of MIDDLEWARE.",
                id="urlguard.E004",
            )
        )

    policy = conf.ON_FILTER_ERROR
    if policy not in POLICIES:
        messages.append(
            Error(
                f"URLGUARD['ON_FILTER_ERROR'] must be one of {', '.join(POLICIES)}; "
                f"got {policy!r}.",
                hint="'database' answers from the spam table when the filter cannot be read; "
                "'open' lets redirects through; 'closed' warns on every redirect.",
                id="urlguard.E005",
            )
        )

    for name, check_id in (
        ("CATCHUP_INTERVAL", "urlguard.E006"),
        ("WRITER_LOCK_TIMEOUT", "urlguard.E007"),
    ):
        value = getattr(conf, name)
        if not _number(value) or value <= 0:
            messages.append(
                Error(
                    f"URLGUARD['{name}'] must be a positive number of seconds; got {value!r}.",
                    hint=f"The default is {DEFAULTS[name]}.",
                    id=check_id,
                )
            )

    unknown = sorted(set(namespace) - set(DEFAULTS))
    if unknown:
        messages.append(
            Warning(
                f"Unknown URLGUARD setting(s): {', '.join(unknown)}; they are ignored.",
                hint=f"Known settings: {', '.join(sorted(DEFAULTS))}.",
                id="urlguard.W002",
            )
        )

    if not problem and not os.path.exists(str(path)):
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
