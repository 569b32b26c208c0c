"""A long write killed with SIGKILL is finished by running it again, with real
processes on the embedded default (SQLite in a throw-away var dir): a feed refresh
and a revert die right after a known number of chunks committed (the child kills
itself: no sleep-then-kill race), the state they leave is shown for what it is, and
the command run again finishes the work with nothing left claimed or running."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Runs a management command (or code) with chunks of CHUNK rules, SIGKILLing itself
# right after the KILL_AFTER-th chunk committed (tests.service.killhook).
CHILD = textwrap.dedent("""
    import sys
    import django
    django.setup()
    import tests.service.killhook  # noqa: F401  (the kill, from the environment)
    from django.core.management import call_command

    if sys.argv[1] == "--python":
        exec(sys.argv[2])
    else:
        call_command(*sys.argv[1:])
""")

RULES = 3000
CHUNK = 500


@pytest.fixture
def node(tmp_path):
    """A throw-away var dir, migrated: run(*command, kill_after=N) runs a management
    command in a process of its own; db() reads its database."""
    var = tmp_path / "node"
    var.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env.update(
        URLGUARD_VAR_DIR=str(var),
        URLGUARD_FILTER_PATH=str(var / "filter.bin"),
        DJANGO_SETTINGS_MODULE="urlguard.settings",
        PYTHONDONTWRITEBYTECODE="1",
    )
    child = tmp_path / "child.py"
    child.write_text(CHILD)

    class Node:
        path = tmp_path

        def run(self, *command: str, kill_after: int = 0) -> subprocess.CompletedProcess:
            extra = {
                "URLGUARD_TEST_KILL_AFTER": str(kill_after),
                "URLGUARD_TEST_CHUNK": str(CHUNK),
                "PYTHONPATH": str(ROOT),
            }
            return subprocess.run(
                [sys.executable, str(child), *command],
                cwd=ROOT,
                env={**env, **extra},
                capture_output=True,
                text=True,
                timeout=300,
            )

        def ok(self, *command: str) -> str:
            done = self.run(*command)
            assert done.returncode == 0, done.stdout + done.stderr
            return done.stdout

        def killed(self, *command: str, kill_after: int) -> None:
            done = self.run(*command, kill_after=kill_after)
            assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr

        def db(self, query: str, *params) -> list[tuple]:
            with sqlite3.connect(var / "urlguard.sqlite3") as connection:
                return connection.execute(query, params).fetchall()

        def one(self, query: str, *params):
            (row,) = self.db(query, *params)
            return row[0] if len(row) == 1 else row

    made = Node()
    made.ok("migrate", "-v", "0")
    return made


def _feed(node, count: int) -> Path:
    body = node.path / "feed.txt"
    body.write_text("".join(f"crash{i}.example.net\n" for i in range(count)))
    return body


def test_a_refresh_killed_mid_load_is_finished_by_the_next_refresh(node):
    body = _feed(node, RULES)
    node.ok("add_feed", "big", f"file://{body}")
    node.killed("refresh_feeds", "big", kill_after=2)
    written = node.one("SELECT COUNT(*) FROM urlguard_spamrule")
    assert written == 2 * CHUNK
    claimed = node.one("SELECT refreshing_since FROM urlguard_source WHERE name = 'big'")
    assert claimed is not None, "the killed refresh left no claim: nothing was tested"
    # The claim's owner is dead: shown as such, and partial.
    info = node.ok("feeds_info")
    assert f"partial: {written:,} rules of a refresh interrupted at" in info, info
    assert "stuck: the refresh claimed at" in info and "is dead" in info, info
    # Run again at once (not after FEED_CLAIM_TIMEOUT): it takes the claim over and
    # finishes the interrupted refresh's change set.
    out = node.ok("refresh_feeds", "big")
    assert "ok" in out and "another refresh" not in out, out
    assert node.one("SELECT COUNT(*) FROM urlguard_spamrule") == RULES
    assert node.one(
        "SELECT refreshing_since, refresh_owner FROM urlguard_source WHERE name = 'big'"
    ) == (None, "")
    sets = node.db("SELECT added, finished, owner FROM urlguard_changeset WHERE kind = 'refresh'")
    assert len(sets) == 1 and sets[0][0] == RULES and sets[0][1] is not None and sets[0][2] == ""
    assert "partial" not in node.ok("feeds_info")
    assert f"OK: all {RULES:,} rules are in" in node.ok("verify_filter")


def test_a_revert_killed_mid_way_is_finished_by_reverting_again(node):
    body = _feed(node, RULES)
    node.ok("import_rules", str(body))
    imported = node.one("SELECT id FROM urlguard_changeset WHERE kind = 'import'")
    node.killed("revert_change_set", str(imported), kill_after=2)
    left = node.one("SELECT COUNT(*) FROM urlguard_spamrule")
    assert left == RULES - 2 * CHUNK
    # The plan of the rest: what the killed revert undid is skipped.
    plan = node.ok("revert_change_set", str(imported), "--dry-run")
    assert "was interrupted after 1,000 removed" in plan, plan
    assert f"removes {left:,} rule(s)" in plan, plan
    assert node.one("SELECT COUNT(*) FROM urlguard_spamrule") == left  # a dry run
    out = node.ok("revert_change_set", str(imported))
    assert f"{RULES:,} rule(s) removed" in out, out
    assert node.one("SELECT COUNT(*) FROM urlguard_spamrule") == 0
    reverts = node.db(
        "SELECT removed, finished, owner FROM urlguard_changeset WHERE reverts_id = ?", imported
    )
    assert len(reverts) == 1 and reverts[0][0] == RULES and reverts[0][1] is not None
    assert reverts[0][2] == ""
    assert "OK: all 0 rules are in" in node.ok("verify_filter")
    # Done now: a third revert is refused, saying by which.
    again = node.run("revert_change_set", str(imported))
    assert again.returncode != 0 and "already reverted by Revert #" in again.stderr


# The admin's revert, as the embedded default runs it (on the runner thread of the
# serving process); the process dies in the middle.
ADMIN_REVERT = """
from urlguard.admin import jobs
from urlguard.models import ChangeSet
job = jobs.create_revert(ChangeSet.objects.get(kind="import"), user=None)
jobs.runner.join()
job.refresh_from_db()
assert job.state == "previewed", (job.state, job.message)
jobs.start_revert(job, reason="bad import")
jobs.runner.join()
job.refresh_from_db()
print(job.pk, job.state, job.message)
"""


def test_an_admin_revert_whose_process_died_is_marked_failed_and_runs_again(node):
    node.ok("import_rules", str(_feed(node, RULES)))
    node.killed("--python", ADMIN_REVERT, kill_after=2)
    job, state = node.one("SELECT id, state FROM urlguard_adminjob WHERE kind = 'revert'")
    assert state == "running"
    # The serving process that comes back sweeps (its runner, like a worker's boot
    # and the beat): the job is failed, saying what to do.
    node.ok("--python", "from urlguard.feeds import runner; runner.run_once()")
    state, message = node.one("SELECT state, message FROM urlguard_adminjob WHERE id = ?", job)
    assert (state, message) == ("failed", "The worker stopped; run it again to finish.")
    # Run again from the admin: the revert is not refused, and finishes.
    out = node.ok("--python", ADMIN_REVERT)
    assert " done Reverted Import #" in out, out
    assert node.one("SELECT COUNT(*) FROM urlguard_spamrule") == 0
    assert node.db("SELECT state FROM urlguard_adminjob WHERE kind = 'revert' ORDER BY id") == [
        ("failed",),
        ("done",),
    ]
    assert node.one("SELECT COUNT(*) FROM urlguard_changeset WHERE finished IS NULL") == 0


def test_an_import_killed_mid_way_is_finished_by_importing_again(node):
    body = _feed(node, RULES)
    node.killed("import_rules", str(body), kill_after=2)
    assert node.one("SELECT COUNT(*) FROM urlguard_spamrule") == 2 * CHUNK
    out = node.ok("import_rules", str(body))
    assert f"{RULES - 2 * CHUNK} added, {2 * CHUNK} skipped" in out, out
    assert node.one("SELECT COUNT(*) FROM urlguard_spamrule") == RULES
    # One change set, finished: reverting the import reverts all of it.
    assert node.db("SELECT added, finished IS NOT NULL FROM urlguard_changeset") == [(RULES, 1)]
