"""Waiting for a server the tests started to accept connections."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable


def wait_until_listening(
    port: int, proc: subprocess.Popen, *, within: float, what: str, log: Callable[[], str]
) -> None:
    """Return once 127.0.0.1:`port` accepts a connection; AssertionError with `log()` if
    `proc` exits first or `within` seconds pass."""
    deadline = time.monotonic() + within
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{what} did not start:\n{log()}") from None
            time.sleep(0.05)
