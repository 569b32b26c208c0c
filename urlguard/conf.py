"""App settings under the one URLGUARD namespace, read at access time so that
override_settings just works. Defaults are documented here and in README.md."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from django.conf import settings

# The values ON_FILTER_ERROR may take (the system check and Guard both refuse others).
ON_FILTER_ERROR_POLICIES = ("database", "open", "closed")

DEFAULTS: dict[str, Any] = {
    # The scaling counting Bloom filter file (one per node).
    "FILTER_PATH": None,  # None: <VAR_DIR>/filter.bin
    # The smallest first stage. A rebuild sizes the first stage to the rules it holds
    # times REBUILD_HEADROOM (never below this); later stages grow as rules arrive.
    "FILTER_CAPACITY": 100_000,
    # Compounded false-positive bound over all stages. Each clean URL probes ~10
    # expressions, so 0.001 keeps the share of clean redirects that cost a confirming
    # query near 1% (0.01 would make it ~10%) for ~2.4 more bytes per rule.
    "FILTER_ERROR_RATE": 0.001,
    "REBUILD_HEADROOM": 1.5,
    # Every stage costs each lookup a few probes: the periodic catch-up rebuilds
    # (compacts into one right-sized stage) a file that has grown more stages than this.
    "FILTER_MAX_STAGES": 4,
    # What Guard.check does when the filter cannot be read:
    # "database" answers every check from the spam table (correct, slower),
    # "open" lets redirects through, "closed" warns on every redirect. Always logged.
    "ON_FILTER_ERROR": "database",
    # Check redirects to this site's own hosts too (off: only off-site destinations).
    "CHECK_INTERNAL_REDIRECTS": False,
    # Location schemes other than http(s) that pass unchecked; any other scheme
    # (javascript:, data:, ...) gets the warning page.
    "ALLOWED_OTHER_SCHEMES": ("mailto", "tel"),
    # Lifetime of the signed "continue anyway" token on the warning page.
    "CONTINUE_TOKEN_MAX_AGE": 15 * 60,
    # Allowed redirects are cacheable this long, so a later block reaches returning visitors.
    "REDIRECT_MAX_AGE": 90,
    # Rules on addresses outside the public internet (private, loopback, link-local)
    # are refused unless this is on: from outside they block nothing.
    "ALLOW_PRIVATE_ADDRESS_RULES": False,
    # Popular hosts a whole-host rule needs an explicit confirmation for (None: the
    # shipped list, urlguard.safety.DEFAULT_PROTECTED_HOSTS); likewise link shorteners.
    "PROTECTED_HOSTS": None,
    "LINK_SHORTENERS": None,
    # A rule that would block more short links than this needs a confirmation (0: never).
    "CONFIRM_IMPACT_LINKS": 100,
    # Where "report a mistake" on the warning page points (mailto: or a URL).
    "REPORT_MISTAKE_URL": "mailto:abuse@localhost",
    # This node's name in NodeStatus (one filter file per node).
    "NODE_NAME": None,  # None: the host name
    # Periodic catch-up for a node that missed a broadcast (Celery beat), seconds.
    "CATCHUP_INTERVAL": 60,
    # With no broker (Celery in-process), each serving process runs that periodic
    # catch-up in a daemon thread instead of beat.
    "EMBEDDED_CATCH_UP": True,
    "BROADCAST_QUEUE": "urlguard.broadcast",
    # Rules of the table the periodic catch-up (and `sync_filter`) probes in the file,
    # drawn at random; a miss (damaged counters) rebuilds the file. 0: off.
    "SPOT_CHECK_SAMPLE": 200,
    # Seconds between full verifies of the file against the table (about 1 s per
    # million rules), by the worker or the embedded catch-up thread; a miss
    # rebuilds the file. 0: off.
    "VERIFY_INTERVAL": 3600,
    # How long a change-applying process waits for another one holding the filter's
    # writer lock (e.g. during a rebuild) before giving up and retrying later, seconds.
    "WRITER_LOCK_TIMEOUT": 30,
}


class Settings:
    """Reads settings.URLGUARD[name], falling back to DEFAULTS, on every access."""

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"unknown URLGUARD setting {name!r}")
        value = getattr(settings, "URLGUARD", {}).get(name, DEFAULTS[name])
        if name == "FILTER_PATH" and value is None:
            value = str(Path(settings.VAR_DIR) / "filter.bin")
        elif name == "NODE_NAME" and value is None:
            value = socket.gethostname()
        return value


conf = Settings()
