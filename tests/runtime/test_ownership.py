"""Owners and heartbeats of long writes: who is alive, who is gone (a dead process on
this host at once; any host after HEARTBEAT_TIMEOUT without a heartbeat), the
heartbeat thread, and the sweep that fails orphaned jobs and releases claims."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from urlguard.models import AdminJob, ChangeSet, Source
from urlguard.runtime import ownership
from urlguard.runtime.ownership import Owner

pytestmark = pytest.mark.django_db


def dead_owner() -> str:
    """The owner string of a process of this host that has exited."""
    pid = int(
        subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    return f"{ownership.this_host()}:{pid}:1"


def elsewhere() -> str:
    return "other-host.invalid:4242:777 task 0f1e"


def test_an_owner_reads_back_and_describes_itself():
    me = ownership.me()
    assert Owner.parse(str(me)) == me and me.pid == os.getpid() and me.start
    other = Owner.parse(elsewhere())
    assert other == Owner("other-host.invalid", 4242, "777", "0f1e")
    assert other.describe() == "pid 4242 on other-host.invalid (Celery task 0f1e)"
    assert Owner.parse("") is None and Owner.parse("nonsense") is None


def test_this_process_is_alive_and_an_exited_one_is_not():
    assert ownership.me().alive()
    assert not Owner.parse(dead_owner()).alive()  # type: ignore[union-attr]


def test_a_pid_that_now_names_another_process_is_not_the_owner():
    me = ownership.me()
    assert not Owner(me.host, me.pid, str(int(me.start) + 1)).alive()


def test_an_owner_on_another_host_is_judged_by_its_heartbeat(settings):
    settings.URLGUARD = {**settings.URLGUARD, "HEARTBEAT_TIMEOUT": 60}
    now = timezone.now()
    assert ownership.gone_reason(elsewhere(), now - timedelta(seconds=30), now) == ""
    stale = ownership.gone_reason(elsewhere(), now - timedelta(seconds=90), now)
    assert stale.startswith("no heartbeat from pid 4242 on other-host.invalid")
    assert "HEARTBEAT_TIMEOUT=60" in stale
    assert ownership.gone_reason("", now, now) == "nobody owns it"
    assert ownership.gone_reason(dead_owner(), now, now).endswith("is dead")


def test_the_sweep_fails_orphaned_jobs_and_leaves_live_ones():
    now = timezone.now()
    old = now - timedelta(minutes=10)
    dead = AdminJob.objects.create(kind="revert", state="running", owner=dead_owner())
    mine = AdminJob.objects.create(
        kind="import", state="running", owner=str(ownership.me()), heartbeat=old
    )
    silent = AdminJob.objects.create(
        kind="delete", state="previewing", owner=elsewhere(), heartbeat=old
    )
    beating = AdminJob.objects.create(
        kind="refresh", state="running", owner=elsewhere(), heartbeat=now
    )
    queued = AdminJob.objects.create(kind="rescan", state="queued")
    # Started before jobs named their runner: judged by their age.
    unnamed_new = AdminJob.objects.create(kind="rescan", state="running", started=now)
    unnamed_old = AdminJob.objects.create(kind="rescan", state="running", started=old)
    assert ownership.recover_orphans()["jobs"] == 3
    states = {
        job.pk: (job.state, job.message)
        for job in AdminJob.objects.filter(pk__in=[dead.pk, silent.pk, unnamed_old.pk])
    }
    failed = ("failed", "The worker stopped; run it again to finish.")
    assert states == {dead.pk: failed, silent.pk: failed, unnamed_old.pk: failed}
    assert AdminJob.objects.get(pk=unnamed_new.pk).state == "running"
    # On this host a live process is alive whatever its heartbeat (a database busy
    # with a long write may hold the beat back).
    assert AdminJob.objects.get(pk=mine.pk).state == "running"
    assert AdminJob.objects.get(pk=beating.pk).state == "running"
    assert AdminJob.objects.get(pk=queued.pk).state == "queued"


def test_the_sweep_releases_claims_and_change_sets_of_dead_owners():
    now = timezone.now()
    feed = Source.objects.create(
        name="f", url="file:///nowhere", refreshing_since=now, refresh_owner=dead_owner()
    )
    live = Source.objects.create(
        name="g",
        url="file:///nowhere",
        refreshing_since=now,
        refresh_owner=str(ownership.me()),
        refresh_heartbeat=now,
    )
    # Claimed before claims named their owner: FEED_CLAIM_TIMEOUT still decides.
    unowned = Source.objects.create(name="h", url="file:///nowhere", refreshing_since=now)
    partial = ChangeSet.objects.create(kind="refresh", finished=None, owner=dead_owner())
    assert ownership.recover_orphans() == {"jobs": 0, "claims": 1, "change_sets": 1}
    unowned.refresh_from_db()
    assert unowned.refreshing_since is not None
    feed.refresh_from_db()
    live.refresh_from_db()
    assert (feed.refreshing_since, feed.refresh_owner) == (None, "")
    assert live.refreshing_since is not None
    partial.refresh_from_db()
    assert (partial.owner, partial.finished) == ("", None)  # partial, nobody's


def test_a_beat_writes_what_this_process_owns_only():
    long_ago = timezone.now() - timedelta(hours=1)
    me = ownership.me()
    task = f"{me.host}:{me.pid}:{me.start} task abc"
    mine = AdminJob.objects.create(kind="revert", state="running", owner=task, heartbeat=long_ago)
    done = AdminJob.objects.create(kind="revert", state="done", owner=str(me), heartbeat=long_ago)
    theirs = AdminJob.objects.create(
        kind="revert", state="running", owner=elsewhere(), heartbeat=long_ago
    )
    assert ownership.beat(str(me)) == 1
    beaten = dict(AdminJob.objects.values_list("pk", "heartbeat"))
    assert beaten[mine.pk] > long_ago
    assert beaten[done.pk] == long_ago and beaten[theirs.pk] == long_ago


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_thread_beats_while_something_is_owned(settings):
    settings.URLGUARD = {**settings.URLGUARD, "HEARTBEAT_INTERVAL": 0.05}
    long_ago = timezone.now() - timedelta(hours=1)
    job = AdminJob.objects.create(
        kind="revert", state="running", owner=str(ownership.me()), heartbeat=long_ago
    )
    ownership.beat_while_owned()
    deadline = time.monotonic() + 10
    while AdminJob.objects.get(pk=job.pk).heartbeat == long_ago:
        assert time.monotonic() < deadline, "no heartbeat was written"
        time.sleep(0.02)
    AdminJob.objects.filter(pk=job.pk).update(state="done")
    thread = ownership._heart.thread
    deadline = time.monotonic() + 10
    while thread is not None and thread.is_alive():
        assert time.monotonic() < deadline, "the heartbeat thread did not stop"
        time.sleep(0.02)
