"""Keeps a test run out of the checkout's var/, where `make run` keeps the developer's
database, filter file and short-link index. A plugin (`-p tests.isolation` in
pyproject.toml's addopts) because it must run before pytest-django imports the
settings: those make and use VAR_DIR at import.

- URLGUARD_VAR_DIR names a temporary directory for the whole run (settings.VAR_DIR,
  and every subprocess that inherits the environment); each test still gets its own
  (tests/conftest.py's `filter_path`). Work a test leaves running (a thread, a
  subprocess) writes there, not into the checkout.
- The run fails if anything under the checkout's var/ changed while it ran.
- The run fails if a process it started is still alive at its end: every subprocess
  inherits URLGUARD_VAR_DIR, so one still carrying this run's value in its environment
  is a leak, even after its parent died and PID 1 adopted it. It is killed, then named."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

CHECKOUT_VAR = Path(__file__).resolve().parent.parent / "var"


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """(mtime in ns, size) of every entry under `root`, by relative path."""
    found: dict[str, tuple[int, int]] = {}
    for folder, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            path = os.path.join(folder, name)
            try:
                stat = os.lstat(path)
            except FileNotFoundError:
                continue
            found[os.path.relpath(path, root)] = (stat.st_mtime_ns, stat.st_size)
    return found


def changes(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[str]:
    """What differs between two snapshots, one line per entry."""
    lines = [f"created {p}" for p in sorted(after.keys() - before.keys())]
    lines += [f"removed {p}" for p in sorted(before.keys() - after.keys())]
    lines += [
        f"modified {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]
    ]
    return lines


_before = {".": (0, 0), **snapshot(CHECKOUT_VAR)} if CHECKOUT_VAR.exists() else {}
_run_var = tempfile.mkdtemp(prefix="urlguard-test-var-")
os.environ["URLGUARD_VAR_DIR"] = _run_var
# The settings read it too; a developer's shell may name the real file.
os.environ.pop("URLGUARD_FILTER_PATH", None)
atexit.register(shutil.rmtree, _run_var, True)


@pytest.fixture(scope="session", autouse=True)
def _checkout_var_untouched() -> Iterator[None]:
    yield
    after = {".": (0, 0), **snapshot(CHECKOUT_VAR)} if CHECKOUT_VAR.exists() else {}
    touched = changes(_before, after)
    assert not touched, (
        f"the tests wrote into the checkout's {CHECKOUT_VAR}: {', '.join(touched[:20])}; "
        "a test's files belong in its tmp_path (settings.VAR_DIR is one), and work it "
        "leaves running must resolve its paths before the test ends"
    )


def processes_of_run(run_var: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live process but this one whose environment says
    it belongs to the test run that uses `run_var`."""
    marker = f"URLGUARD_VAR_DIR={run_var}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
            command = Path(entry.path, "cmdline").read_bytes()
        except OSError:  # gone meanwhile, or a zombie
            continue
        # multiprocessing's resource tracker serves this process and ends with it.
        if b"multiprocessing.resource_tracker" in command:
            continue
        if marker in environ.split(b"\0"):
            found.append((int(entry.name), command.replace(b"\0", b" ").decode(errors="replace")))
    return found


def kill_leftovers(run_var: str, grace: float = 5.0) -> list[str]:
    """Waits up to `grace` seconds for the run's processes to end (one a test just
    stopped may still be exiting), then kills those left and returns their names."""
    deadline = time.monotonic() + grace
    while (left := processes_of_run(run_var)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid, _ in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return [f"pid {pid}: {command[:200]}" for pid, command in left]


@pytest.fixture(scope="session", autouse=True)
def _no_process_left_running() -> Iterator[None]:
    yield
    if not os.path.isdir("/proc"):
        return
    left = kill_leftovers(_run_var)
    assert not left, (
        "processes this test run started were still running at its end (now killed): "
        + "; ".join(left)
        + ". A test that starts a process must stop it, and its children, before it ends."
    )
