"""The test tooling itself: the Hypothesis profiles and the commands that pick them,
so that `make test` and CI give the same answer on every run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = (
    "import tests.conftest; from hypothesis import settings as s; "
    "print(s.get_current_profile_name(), s.default.derandomize, s.default.database is None)"
)


def _profile(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("CI", "HYPOTHESIS_PROFILE")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "dev False False"),
        ({"CI": "1"}, "ci True True"),
        ({"HYPOTHESIS_PROFILE": "ci"}, "ci True True"),
        ({"CI": "1", "HYPOTHESIS_PROFILE": "dev"}, "dev False"),
    ],
)
def test_hypothesis_profile_ci_is_deterministic_and_chosen_by_ci(env, expected):
    # (under CI, Hypothesis's own defaults keep no example database for `dev` either)
    assert _profile(**env).startswith(expected)


def test_make_test_and_ci_use_the_ci_profile():
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", "-o", "install", "-o", ".venv/.installed", "test"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    runs = [line for line in done.stdout.splitlines() if "-m pytest" in line]
    assert len(runs) == 2 and all("--hypothesis-profile=ci" in line for line in runs)
    assert 'export CI="${CI:-1}"' in (ROOT / ".ci" / "run").read_text()


def test_make_test_installs_no_benchmark_peers():
    done = subprocess.run(
        ["make", "-n", "-B", "install"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert "pip install" in done.stdout and "bench" not in done.stdout
    bench = subprocess.run(
        ["make", "-n", "-B", "bench"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert ".[bench]" in bench.stdout


def _make_n(*targets: str) -> list[str]:
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", "-o", "install", "-o", ".venv/.installed", *targets],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [line for line in done.stdout.splitlines() if not line.startswith("#")]


def test_make_test_lints_checks_format_and_types_before_the_suite():
    lines = _make_n("test")
    first_pytest = next(i for i, line in enumerate(lines) if "-m pytest" in line)
    before = "\n".join(lines[:first_pytest])
    assert "ruff check ." in before and "ruff format --check ." in before
    assert "mypy filterengine" in before


def test_pre_commit_runs_the_same_checks():
    config = (ROOT / ".pre-commit-config.yaml").read_text()
    for hook in ("id: ruff\n", "id: ruff-format\n", "id: mypy\n"):
        assert hook in config
    assert "typecheck" in config and _make_n("typecheck") == [
        line for line in _make_n("test") if "mypy" in line
    ]


def test_make_run_takes_a_port_and_stops_on_a_busy_one_before_migrating():
    import socket

    assert any(
        "runserver 127.0.0.1:8123" in line and "seed_demo" not in line
        for line in _make_n("run", "PORT=8123")
    )
    assert any("--base-url http://127.0.0.1:8123" in line for line in _make_n("run", "PORT=8123"))
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        done = subprocess.run(
            [
                "make",
                "--no-print-directory",
                "-o",
                "install",
                "-o",
                ".venv/.installed",
                "run",
                f"PORT={port}",
                f"PY={sys.executable}",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        busy.close()
    assert done.returncode != 0
    assert f"port {port} is busy" in done.stderr and "migrate" not in done.stdout


def test_make_test_fast_is_pass_one_without_browser_slow_and_live_tests():
    lines = _make_n("test-fast")
    (run,) = [line for line in lines if "-m pytest" in line]
    assert "--hypothesis-profile=ci" in run
    assert '-m "not live and not browser and not slow"' in run
    assert not [line for line in lines if "ruff" in line or "mypy" in line]


def test_a_pass_started_in_the_background_by_sh_still_stops_on_ctrl_c():
    # `make test` runs pass two as `cmd &`: sh starts it with SIGINT ignored.
    probe = "import signal, tests.conftest; print(signal.getsignal(signal.SIGINT))"
    done = subprocess.run(
        ["sh", "-c", '"$0" -c "$1" & wait', sys.executable, probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "default_int_handler" in done.stdout, done.stdout + done.stderr
