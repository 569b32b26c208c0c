"""System checks of the standalone service's own settings (its var directory)."""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Warning, register


@register("urlguard")
def check_var_dir(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """The var directory holds the SQLite database (sessions, password hashes) and the
    demo's secret key: nobody but its owner may read it."""
    var = str(settings.VAR_DIR)
    try:
        mode = os.stat(var).st_mode & 0o777
    except OSError:
        return []  # not there yet (E001 says so if it cannot be made)
    if not mode & 0o077:
        return []
    return [
        Warning(
            f"The var directory {var} can be read by other users (mode {mode:o}); it "
            "holds the database and the secret key.",
            hint=f"chmod 700 {var}  (and chmod 600 the files in it)",
            id="urlguard.W003",
        )
    ]
