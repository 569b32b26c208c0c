"""A long write killed with SIGKILL is finished by running it again, with real
processes on the embedded default (SQLite in a throw-away var dir): a feed refresh
and a revert die right after a known number of chunks committed (the child kills
itself: no sleep-then-kill race), the state they leave is shown for what it is, and
the command run again finishes the work with nothing left claimed or running."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Runs steps (a management command, or Python code) one after another in one process,
# each output after a "=== step" line, with chunks of CHUNK rules; with KILL_AFTER set
# it SIGKILLs itself right after that many chunks committed (tests.support.killhook).
CHILD = textwrap.dedent("""
    import io, json, os, sys
    import django
    django.setup()
    from django.conf import settings
    # The feeds these steps subscribe to are files of the test's own directory.
    settings.URLGUARD = {**settings.URLGUARD, "FEED_FILE_ROOT": os.environ["TEST_FEED_ROOT"]}
    import tests.support.killhook  # noqa: F401  (the kill, from the environment)
    from django.core.management import CommandError, call_command

    for step in json.loads(sys.argv[1]):
        out = io.StringIO()
        if step[0] == "python":
            sys.stdout, real = out, sys.stdout
            try:
                exec(step[1])
            finally:
                sys.stdout = real
        else:
            try:
                call_command(*step, stdout=out, stderr=out)
            except CommandError as exc:
                out.write(f"CommandError: {exc}")
        print("=== step", flush=True)
        print(out.getvalue(), flush=True)
""")

RULES = 3000
CHUNK = 500


@pytest.fixture
def node(tmp_path, migrated_database):
    """A throw-away var dir with a migrated database: steps() runs steps in a process
    of its own (killed() one that dies at a known point); db() reads its database."""
    var = tmp_path / "node"
    var.mkdir()
    shutil.copy(migrated_database, var / "urlguard.sqlite3")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env.update(
        URLGUARD_VAR_DIR=str(var),
        URLGUARD_FILTER_PATH=str(var / "filter.bin"),
        DJANGO_SETTINGS_MODULE="urlguard_service.settings",
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONPATH=str(ROOT),
        URLGUARD_TEST_CHUNK=str(CHUNK),
        TEST_FEED_ROOT=str(tmp_path),
    )
    child = tmp_path / "child.py"
    child.write_text(CHILD)

    class Node:
        path = tmp_path

        def _run(self, steps, kill_after: int) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, str(child), json.dumps(steps)],
                cwd=ROOT,
                env={**env, "URLGUARD_TEST_KILL_AFTER": str(kill_after)},
                capture_output=True,
                text=True,
                timeout=300,
            )

        def steps(self, *steps: list[str]) -> list[str]:
            """Each step's output."""
            done = self._run(steps, 0)
            assert done.returncode == 0, done.stdout + done.stderr
            return done.stdout.split("=== step\n")[1:]

        def killed(self, *steps: list[str], kill_after: int) -> None:
            done = self._run(steps, kill_after)
            assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr

        def db(self, query: str, *params) -> list[tuple]:
            with sqlite3.connect(var / "urlguard.sqlite3") as connection:
                return connection.execute(query, params).fetchall()

        def one(self, query: str, *params):
            (row,) = self.db(query, *params)
            return row[0] if len(row) == 1 else row

    return Node()


def _feed(node, count: int) -> str:
    body = node.path / "feed.txt"
    body.write_text("".join(f"crash{i}.example.net\n" for i in range(count)))
    return str(body)


def test_a_refresh_killed_mid_load_is_finished_by_the_next_refresh(node):
    body = _feed(node, RULES)
    node.killed(["add_feed", "big", f"file://{body}"], ["refresh_feeds", "big"], kill_after=2)
    written = node.one("SELECT COUNT(*) FROM urlguard_spamrule")
    assert written == 2 * CHUNK
    claimed = node.one("SELECT refreshing_since FROM urlguard_source WHERE name = 'big'")
    assert claimed is not None, "the killed refresh left no claim: nothing was tested"
    info, out, info_after, verified = node.steps(
        ["feeds_info"], ["refresh_feeds", "big"], ["feeds_info"], ["verify_filter"]
    )
    # The claim's owner is dead: shown as such, and partial.
    assert f"partial: {written:,} rules of a refresh interrupted at" in info, info
    assert "stuck: the refresh claimed at" in info and "is dead" in info, info
    # Run again at once (not after FEED_CLAIM_TIMEOUT): it takes the claim over and
    # finishes the interrupted refresh's change set.
    assert "big: ok" in out and "another refresh" not in out, out
    assert node.one("SELECT COUNT(*) FROM urlguard_spamrule") == RULES
    assert node.one(
        "SELECT refreshing_since, refresh_owner FROM urlguard_source WHERE name = 'big'"
    ) == (None, "")
    sets = node.db("SELECT added, finished, owner FROM urlguard_changeset WHERE kind = 'refresh'")
    assert len(sets) == 1 and sets[0][0] == RULES and sets[0][1] is not None and sets[0][2] == ""
    assert "partial" not in info_after and "stuck" not in info_after
    assert f"OK: all {RULES:,} rules are in" in verified


REVERT_THE_IMPORT = """
from django.core.management import call_command
from urlguard.models import ChangeSet
call_command("revert_change_set", str(ChangeSet.objects.get(kind="import").pk), *ARGS)
"""


def _revert(*args: str) -> list[str]:
    return ["python", f"ARGS = {list(args)!r}\n{REVERT_THE_IMPORT}"]


def test_a_revert_killed_mid_way_is_finished_by_reverting_again(node):
    # Killed after the import's chunks and two of the revert's.
    node.killed(["import_rules", _feed(node, RULES)], _revert(), kill_after=RULES // CHUNK + 2)
    left = node.one("SELECT COUNT(*) FROM urlguard_spamrule")
    assert left == RULES - 2 * CHUNK
    imported = node.one("SELECT id FROM urlguard_changeset WHERE kind = 'import'")
    plan, out, verified, again = node.steps(
        ["revert_change_set", str(imported), "--dry-run"],
        ["revert_change_set", str(imported)],
        ["verify_filter"],
        ["revert_change_set", str(imported)],
    )
    # The plan of the rest: what the killed revert undid is skipped.
    assert "was interrupted after 1,000 removed" in plan, plan
    assert f"removes {left:,} rule(s)" in plan and "Dry run: nothing was changed." in plan
    assert f"{RULES:,} rule(s) removed" in out, out
    assert node.one("SELECT COUNT(*) FROM urlguard_spamrule") == 0
    reverts = node.db(
        "SELECT removed, finished, owner FROM urlguard_changeset WHERE reverts_id = ?", imported
    )
    assert len(reverts) == 1 and reverts[0][0] == RULES and reverts[0][1] is not None
    assert reverts[0][2] == ""
    assert "OK: all 0 rules are in" in verified
    # Done now: a third revert is refused, saying by which.
    assert "CommandError: " in again and "already reverted by Change set #" in again


# The admin's revert, as the embedded default runs it (on the runner thread of the
# serving process); the process dies in the middle.
ADMIN_REVERT = """
from urlguard import jobs
from urlguard.jobs import dispatch
from urlguard.models import ChangeSet
job = jobs.create_revert(ChangeSet.objects.get(kind="import"), actor=None)
dispatch.runner.join()
job.refresh_from_db()
assert job.state == "previewed", (job.state, job.message)
jobs.start_revert(job, reason="bad import")
dispatch.runner.join()
job.refresh_from_db()
print(job.pk, job.state, job.message)
"""


def test_an_admin_revert_whose_process_died_is_marked_failed_and_runs_again(node):
    node.killed(
        ["import_rules", _feed(node, RULES)],
        ["python", ADMIN_REVERT],
        kill_after=RULES // CHUNK + 2,
    )
    job, state = node.one("SELECT id, state FROM urlguard_adminjob WHERE kind = 'revert'")
    assert state == "running"
    # The serving process that comes back sweeps (its runner, like a worker's boot and
    # the beat): the job is failed, saying what to do. Run again from the admin, the
    # revert is not refused, and finishes.
    _, out = node.steps(
        ["python", "from urlguard.feeds import runner; runner.run_once()"],
        ["python", ADMIN_REVERT],
    )
    state, message = node.one("SELECT state, message FROM urlguard_adminjob WHERE id = ?", job)
    assert (state, message) == ("failed", "The worker stopped; run it again to finish.")
    assert " done Reverted Change set #" in out, out
    assert node.one("SELECT COUNT(*) FROM urlguard_spamrule") == 0
    assert node.db("SELECT state FROM urlguard_adminjob WHERE kind = 'revert' ORDER BY id") == [
        ("failed",),
        ("done",),
    ]
    assert node.one("SELECT COUNT(*) FROM urlguard_changeset WHERE finished IS NULL") == 0


def test_an_import_killed_mid_way_is_finished_by_importing_again(node):
    body = _feed(node, RULES)
    node.killed(["import_rules", body], kill_after=2)
    assert node.one("SELECT COUNT(*) FROM urlguard_spamrule") == 2 * CHUNK
    (out,) = node.steps(["import_rules", body])
    assert f"{RULES - 2 * CHUNK} added, {2 * CHUNK} skipped" in out, out
    assert node.one("SELECT COUNT(*) FROM urlguard_spamrule") == RULES
    # One change set, finished: reverting the import reverts all of it.
    assert node.db("SELECT added, finished IS NOT NULL FROM urlguard_changeset") == [(RULES, 1)]
