"""urlguard.nodesync.sync beyond applying the log (test_tasks.py): one rebuild per node at a
time, a dirty file degraded and repaired at once, damaged counters found by the
spot check and the scheduled full verify."""

from __future__ import annotations

import errno
import io
import logging
import os
import subprocess
import sys
import textwrap
import time
from contextlib import contextmanager

import pytest
from django.core.management import call_command
from django.db import OperationalError
from django.urls import reverse

from filterengine import FilterSpaceError, ScalingCountingBloomFilter, fileformat
from urlguard.hotpath.guard import get_guard
from urlguard.models import NodeStatus
from urlguard.nodesync import embedded, registry, sync
from urlguard.writepath import changes
from urlguard_service.celery import app as celery_app

pytestmark = pytest.mark.django_db


def add(text: str) -> str:
    return changes.add_rule(text, category="spam", source="test").expression


def zero_counters(path) -> None:
    """Tampering or bit rot: every counter zeroed in place, the header intact."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(fileformat.DATA_OFFSET)
        f.write(bytes(size - fileformat.DATA_OFFSET))


# A writer that dies in the middle of a change, at a chosen point (no timing).
DIES_MID_CHANGE = textwrap.dedent("""
    import os, sys
    from filterengine import ScalingCountingBloomFilter
    f = ScalingCountingBloomFilter.open(sys.argv[1], readonly=False)
    with f.change():
        f.add("torn.example/", 1)
        os._exit(9)
""")


def die_mid_change(path) -> None:
    assert subprocess.run([sys.executable, "-c", DIES_MID_CHANGE, str(path)]).returncode == 9


# -- one rebuild per node at a time -------------------------------------------------


def test_two_processes_facing_a_missing_file_rebuild_once(quiet, filter_path, monkeypatch):
    add("a.example.org")
    builds = []
    real_build = ScalingCountingBloomFilter.build.__func__

    def counting_build(cls, *args, **kwargs):
        builds.append(args[0])
        return real_build(cls, *args, **kwargs)

    monkeypatch.setattr(ScalingCountingBloomFilter, "build", classmethod(counting_build))
    real_lock = registry.sync_lock

    @contextmanager
    def contended(path, **kwargs):
        # Another process held the lock and rebuilt the missing file while we waited.
        with real_lock(path, **kwargs):
            sync.rebuild(path)
        with real_lock(path, **kwargs):
            yield

    monkeypatch.setattr(registry, "sync_lock", contended)
    assert not filter_path.exists()
    result = sync.sync(path=str(filter_path))
    assert result.rebuilt == "" and len(builds) == 1
    assert "a.example.org/" in registry.get_filter()


def test_the_sync_lock_waits_a_bounded_time(filter_path):
    with registry.sync_lock(str(filter_path)):
        started = time.monotonic()
        with (
            pytest.raises(registry.WriterBusy, match="another process is syncing"),
            registry.sync_lock(str(filter_path), timeout=0.2),
        ):
            pass
        assert time.monotonic() - started < 3


# -- a dirty file ---------------------------------------------------------------------


def test_a_dirty_file_is_degraded_and_the_table_answers(
    quiet, filter_path, sync_filter, fresh_guard, caplog
):
    sync_filter()
    die_mid_change(filter_path)
    listed = add("after-the-crash.example.org")  # committed, never applied
    registry.reset()
    with caplog.at_level(logging.WARNING, logger="urlguard.nodesync.registry"):
        verdict = get_guard().check(f"http://{listed}x")
    assert verdict.blocked and verdict.degraded
    assert "could not be opened or used: it is dirty" in verdict.reason
    assert "dirty" in caplog.text
    assert "dirty" in registry.problem()
    result = sync_filter()
    assert result.rebuilt.startswith("the file is dirty")
    verdict = get_guard().check(f"http://{listed}x")
    assert verdict.blocked and not verdict.degraded


@pytest.mark.django_db(transaction=True)
def test_the_embedded_thread_rebuilds_a_dirty_file_at_once(settings, client, filter_path, quiet):
    settings.URLGUARD = {**settings.URLGUARD, "CATCHUP_INTERVAL": 3600}
    sync.sync(path=str(filter_path))
    embedded.install()
    try:
        client.get("/api/check?url=http://a.example/")
        die_mid_change(filter_path)
        listed = add("after-the-crash.example.org")
        started = time.monotonic()
        while time.monotonic() - started < 10:
            filt = registry.get_filter(str(filter_path))
            if filt is not None and listed in filt:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the dirty file was not rebuilt")
        # The registry notices within a second, the thread within the next.
        assert time.monotonic() - started < registry.CHECK_SECONDS + 2 * embedded.WATCH_SECONDS + 2
        assert filt.is_clean and "torn.example/" not in filt
    finally:
        embedded.stop()


# -- damaged counters ------------------------------------------------------------------


def test_the_spot_check_finds_zeroed_counters_and_rebuilds(quiet, filter_path, sync_filter, caplog):
    rules = changes.add_rules([f"h{i}.example.net" for i in range(300)], source="test").added
    sync_filter()
    zero_counters(filter_path)
    filt = registry.get_filter()
    assert filt.is_clean and not any(r in filt for r in rules)  # silent until checked
    with caplog.at_level(logging.ERROR, logger="urlguard.nodesync.sync"):
        celery_app.tasks["urlguard.tasks.catch_up"].apply().get()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "spot check found" in errors[0].getMessage()
    filt = registry.get_filter()
    assert all(r in filt for r in rules)
    status = NodeStatus.objects.get()
    assert status.last_rebuild_reason.startswith("the spot check found")


def test_the_spot_check_is_bounded(
    quiet, settings, filter_path, sync_filter, django_assert_max_num_queries
):
    settings.URLGUARD = {**settings.URLGUARD, "SPOT_CHECK_SAMPLE": 50}
    changes.add_rules([f"h{i}.example.net" for i in range(500)], source="test")
    sync_filter()
    registry.get_filter(str(filter_path))  # mapped (and compared with the log) first
    with django_assert_max_num_queries(2):
        check = sync.verify(str(filter_path), sample=50)
    assert 0 < check.checked <= 50 and check.missing == 0


def test_a_rule_committed_while_checking_is_no_miss(quiet, filter_path, sync_filter, caplog):
    add("a.example.org")
    sync_filter()
    assert registry.get_filter() is not None  # mapped before the next commit
    add("late.example.org")  # in the table, not yet in the file
    with caplog.at_level(logging.ERROR, logger="urlguard.nodesync.sync"):
        check = sync.verify_and_repair(str(filter_path))
    assert check.missing == 0 and check.checked == 2
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "late.example.org/" in registry.get_filter()  # applied on the second look


def test_sync_filter_spot_checks(quiet, filter_path, sync_filter):
    changes.add_rules([f"h{i}.example.net" for i in range(100)], source="test")
    sync_filter()
    out = io.StringIO()
    call_command("sync_filter", stdout=out)
    assert "spot check" in out.getvalue() and "none missing" in out.getvalue()
    zero_counters(filter_path)
    out = io.StringIO()
    call_command("sync_filter", stdout=out)
    assert "rebuilt from the table" in out.getvalue()
    assert "h1.example.net/" in registry.get_filter()


def test_the_full_verify_finds_every_damaged_rule_and_is_reported(
    quiet, filter_path, sync_filter, caplog, editor
):
    rules = changes.add_rules([f"h{i}.example.net" for i in range(300)], source="test").added
    sync_filter()
    zero_counters(filter_path)
    with caplog.at_level(logging.ERROR, logger="urlguard.nodesync.sync"):
        check = sync.verify_and_repair(str(filter_path))
    assert check.kind == "full verify" and check.checked == 300 and check.missing == 300
    assert "full verify found 300 of 300" in caplog.text
    assert all(r in registry.get_filter() for r in rules)
    status = NodeStatus.objects.get()
    assert status.last_verify_missing == 300 and status.last_verify_at is not None
    html = editor.get(reverse("admin:urlguard_spamrule_dashboard")).content.decode()
    assert "300 rule(s) missing, rebuilt" in html and "the full verify found 300" in html


def test_a_clean_full_verify_is_reported_too(quiet, filter_path, sync_filter):
    add("a.example.org")
    sync_filter()
    check = sync.verify_and_repair(str(filter_path))
    assert check.missing == 0 and check.checked == 1
    assert NodeStatus.objects.get().last_verify_missing == 0


def test_the_upkeep_verifies_at_its_interval_and_backs_off(settings):
    settings.URLGUARD = {**settings.URLGUARD, "CATCHUP_INTERVAL": 60, "VERIFY_INTERVAL": 600}
    schedule = embedded.Upkeep(now=0.0)
    assert schedule.due(1.0, unusable=False, woken=False) == (False, False)
    assert schedule.due(1.0, unusable=True, woken=False) == (True, False)  # at once
    schedule.done(1.0, caught_up=True, verified=False, ok=False)
    assert schedule.due(2.0, unusable=True, woken=False) == (False, False)  # backing off
    assert schedule.due(3.0, unusable=True, woken=False) == (True, False)
    assert schedule.due(600.0, unusable=False, woken=False) == (True, True)
    schedule.done(600.0, caught_up=True, verified=True, ok=True)
    assert schedule.due(1100.0, unusable=False, woken=False) == (True, False)
    assert schedule.due(1200.0, unusable=False, woken=False) == (True, True)


def test_no_verify_when_switched_off(settings):
    settings.URLGUARD = {**settings.URLGUARD, "VERIFY_INTERVAL": 0}
    schedule = embedded.Upkeep(now=0.0)
    assert schedule.due(10**9, unusable=False, woken=False)[1] is False


def test_a_catch_up_that_failed_on_the_database_runs_as_soon_as_it_answers(
    settings, filter_path, monkeypatch
):
    settings.URLGUARD = {**settings.URLGUARD, "CATCHUP_INTERVAL": 3600}
    ScalingCountingBloomFilter.build(str(filter_path), [], capacity=1000, error_rate=0.01)
    runs = []

    def database_down(**kwargs):
        runs.append("failed")
        raise OperationalError("could not connect to server: Connection refused")

    monkeypatch.setattr(sync, "sync_and_report", database_down)
    upkeep = embedded.Upkeep(now=0.0, path=str(filter_path))
    assert upkeep.tick(1.0, woken=True) == (True, False)
    assert upkeep.database_down and runs == ["failed"]

    answers = iter([False, True])
    monkeypatch.setattr(embedded, "_database_answers", lambda: next(answers))
    monkeypatch.setattr(sync, "sync_and_report", lambda **kwargs: runs.append("caught up"))
    assert upkeep.tick(2.0) == (False, False)  # still away: nothing is tried
    # Back: at once, not after the back-off or the hour's CATCHUP_INTERVAL.
    assert upkeep.tick(3.0) == (True, False)
    assert runs == ["failed", "caught up"] and not upkeep.database_down


NO_SPACE = [
    OSError(errno.ENOSPC, "No space left on device"),
    FilterSpaceError("filter.bin", 1 << 20, 4096, "a new stage"),
]


@pytest.mark.parametrize("error", NO_SPACE, ids=["ENOSPC", "FilterSpaceError"])
def test_a_file_that_cannot_take_changes_degrades_the_node_until_a_sync_succeeds(
    quiet, filter_path, sync_filter, monkeypatch, fresh_guard, caplog, error
):
    sync_filter()
    listed = add("full-disk.example.org")
    url = f"http://{listed}x"

    def no_space(self, keys, ids):
        raise error

    with monkeypatch.context() as patched:
        patched.setattr(ScalingCountingBloomFilter, "add_many", no_space)
        with (
            pytest.raises(type(error)),
            caplog.at_level(logging.ERROR, logger="urlguard.nodesync.sync"),
        ):
            sync_filter()
    assert "cannot take the committed changes" in caplog.text
    for state in registry._paths.values():  # every process's once-a-second check is due
        state.next_check = 0.0
    assert "behind the change log" in registry.problem()
    verdict = get_guard().check(url)
    assert verdict.blocked and verdict.degraded  # the table answers: nothing listed passes

    sync_filter()  # space again
    for state in registry._paths.values():
        state.next_check = state.retry_at = 0.0
    verdict = get_guard().check(url)
    assert verdict.blocked and not verdict.degraded
    assert not os.path.exists(str(filter_path) + registry.BEHIND_SUFFIX)
