"""A test run stays out of the checkout's var/ (tests/isolation.py): the settings were
imported with a temporary VAR_DIR, and the guard that fails the run sees a write."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import isolation

ROOT = Path(__file__).resolve().parent.parent


def test_the_settings_were_imported_with_a_temporary_var_dir():
    # urlguard_service.settings made VAR_DIR (and the SQLite file, the demo's secret key) at
    # import, before any fixture ran: it must not have been the checkout's.
    settings_module = sys.modules["urlguard_service.settings"]
    var = Path(settings_module.VAR_DIR).resolve()
    assert not var.is_relative_to(ROOT), var
    assert var == Path(os.environ["URLGUARD_VAR_DIR"]).resolve()
    assert "URLGUARD_FILTER_PATH" not in os.environ


def test_each_test_has_its_own_var_dir(settings, tmp_path):
    assert Path(settings.VAR_DIR) == tmp_path / "var"


def test_the_guard_sees_a_created_a_modified_and_a_removed_file(tmp_path):
    (tmp_path / "keep").write_text("a")
    (tmp_path / "gone").write_text("b")
    before = isolation.snapshot(tmp_path)
    assert isolation.changes(before, isolation.snapshot(tmp_path)) == []
    (tmp_path / "link-index").mkdir()
    (tmp_path / "link-index" / "meta.json").write_text("{}")
    (tmp_path / "keep").write_text("longer")
    (tmp_path / "gone").unlink()
    assert isolation.changes(before, isolation.snapshot(tmp_path)) == [
        "created link-index",
        "created link-index/meta.json",
        "removed gone",
        "modified keep",
    ]


def test_the_guard_finds_and_kills_an_orphan_of_the_run(tmp_path):
    # An orphan, as a killed worker's beat child becomes: its own session, parent gone.
    run_var = str(tmp_path / "run-var")
    env = {**os.environ, "URLGUARD_VAR_DIR": run_var}
    proc = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
    try:
        assert [pid for pid, _ in isolation.processes_of_run(run_var)] == [proc.pid]
        (left,) = isolation.kill_leftovers(run_var, grace=0.2)
        assert left.startswith(f"pid {proc.pid}: sleep 60")
        assert proc.wait(timeout=10) == -9
        assert isolation.processes_of_run(run_var) == []
    finally:
        proc.kill()
        proc.wait()
