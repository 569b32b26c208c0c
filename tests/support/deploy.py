"""Running deploy/entrypoint.sh as the image and the units do: its environment (this
interpreter, a var directory of the test's own, nothing of the caller's settings), one
role run to its end, and the web role served for a block; the deploy files' own tools
(a test skips, naming the package, where one is absent)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
ENTRYPOINT = DEPLOY / "entrypoint.sh"
BIN = Path(sys.executable).parent


def environment(var: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "URLGUARD_", "DATABASE_URL", "CELERY_", "PROMETHEUS_"))
    }
    return {**env, "URLGUARD_PYTHON": sys.executable, "URLGUARD_VAR_DIR": str(var), **extra}


def entrypoint(*args: str, env: dict[str, str], script: Path = ENTRYPOINT, timeout: float = 120):
    return subprocess.run(
        ["sh", str(script), *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def web_role(env: dict[str, str], log: Path, *args: str) -> Iterator[None]:
    """`entrypoint.sh web ARGS` with `env` (URLGUARD_BIND set) for the block, entered
    once its healthcheck passes; its whole process group is stopped after, its output
    is in `log`."""
    with log.open("w") as out:
        web = subprocess.Popen(
            ["sh", str(ENTRYPOINT), "web", *args], env=env, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while entrypoint("healthcheck", env=env, timeout=30).returncode != 0:
                assert web.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
            yield
        finally:
            os.killpg(web.pid, signal.SIGTERM)
            web.wait(timeout=30)


def tool(name: str, package: str) -> str:
    found = shutil.which(name, path=f"{BIN}:/usr/sbin:/usr/bin:/sbin:/bin")
    if found is None:
        pytest.skip(f"`{name}` is not installed ({package}; .ci/run installs it)")
    return found


def run(*argv: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=120
    )
