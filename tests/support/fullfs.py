"""A small file system of its own for a test (a tmpfs: CI runs as root), and a way to
fill it to the last byte: the real "No space left on device", not an injected one."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

# Under CI the real full file system must be tested, not skipped (CI runs as root).
_MUST_RUN = bool(os.environ.get("CI"))


@pytest.fixture
def small_filesystem(tmp_path):
    """small_filesystem(size) -> a folder on a tmpfs of `size` bytes of its own,
    unmounted after the test."""
    mounted: list[Path] = []

    def mount(size: int) -> Path:
        where = tmp_path / f"tmpfs{len(mounted)}"
        where.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode:
            reason = f"mounting a tmpfs failed (root is needed): {done.stderr.strip()}"
            if _MUST_RUN:
                pytest.fail(f"{reason} (CI is set: this test must run, not skip)")
            pytest.skip(reason)
        mounted.append(where)
        return where

    yield mount
    busy = []
    for where in mounted:
        if subprocess.run(["umount", str(where)], capture_output=True, check=False).returncode:
            # A file left open on it: detach it all the same, and say so.
            subprocess.run(["umount", "--lazy", str(where)], check=True)
            busy.append(str(where))
    assert not busy, f"files were left open on {busy}"


def fill(folder: Path) -> None:
    """Write a ballast file in `folder` until its file system has no room left."""
    with open(folder / "ballast", "wb", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
