"""Long writes of hosts whose clocks disagree with the database's by an hour, in one
process: the database's clock and each node's are injected (ownership.database_now and
django.utils.timezone.now), and each node is a host of its own name. A node ahead that
died is taken over once HEARTBEAT_TIMEOUT has passed on the database's clock; the live
work of a node behind is never taken over. tests/service/test_clock_skew_services.py
does the same with real processes under libfaketime on PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from urlguard.feeds import refresh
from urlguard.jobs import dispatch
from urlguard.models import AdminJob, ChangeSet, Source
from urlguard.runtime import ownership
from urlguard.writepath import changes

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)
TIMEOUT = 60
INTERVAL = 10


class Clocks:
    """The database's clock, which the test moves on, and the clock of the node the
    code runs on (the database's plus the node's skew). Nothing beats by itself: the
    test beats for the nodes that are alive."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.db = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
        self.skew = timedelta(0)
        monkeypatch.setattr(ownership, "database_now", lambda using="default": self.db)
        monkeypatch.setattr(timezone, "now", lambda: self.db + self.skew)
        monkeypatch.setattr(ownership, "beat_while_owned", lambda: None)

    def wait(self, seconds: float) -> None:
        self.db += timedelta(seconds=seconds)

    @contextmanager
    def node(self, name: str, skew: timedelta) -> Iterator[None]:
        """Code inside runs on host `name`, its clock `skew` off the database's."""
        before = self.skew
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(ownership, "this_host", lambda: name)
            self.skew = skew
            try:
                yield
            finally:
                self.skew = before

    def beat(self, name: str, skew: timedelta) -> None:
        """The heartbeat of node `name`'s process, as its thread writes it."""
        with self.node(name, skew):
            assert ownership.beat(str(ownership.me()).partition(" task ")[0])


@pytest.fixture
def clocks(monkeypatch, settings) -> Clocks:
    settings.URLGUARD = {
        **settings.URLGUARD,
        "HEARTBEAT_TIMEOUT": TIMEOUT,
        "HEARTBEAT_INTERVAL": INTERVAL,
    }
    return Clocks(monkeypatch)


def test_the_database_clock_is_the_database_s_not_this_host_s(monkeypatch):
    # The host's clock an hour ahead: the database (SQLite here reads the system's
    # clock itself; PostgreSQL its server's) is not.
    monkeypatch.setattr(timezone, "now", lambda: datetime.now(UTC) + HOUR)
    read = ownership.database_now()
    assert read.tzinfo is not None
    assert abs((read - datetime.fromtimestamp(time.time(), UTC)).total_seconds()) < 30


# -- admin jobs -------------------------------------------------------------------------


def _begin_job(clocks: Clocks, node: str, skew: timedelta) -> AdminJob:
    job = AdminJob.objects.create(kind="revert", state="queued")
    with clocks.node(node, skew):
        begun = dispatch.begin(job.pk, "revert")
    assert begun is not None
    return begun


def test_a_job_of_a_node_ahead_that_died_is_failed_after_the_timeout(clocks):
    job = _begin_job(clocks, "ahead", HOUR)
    assert job.started == job.heartbeat == clocks.db
    with clocks.node("observer", -HOUR):
        clocks.wait(TIMEOUT - 1)
        assert ownership.recover_orphans()["jobs"] == 0
        clocks.wait(2)
        assert ownership.recover_orphans()["jobs"] == 1
    job.refresh_from_db()
    assert (job.state, job.message) == ("failed", ownership.ORPHANED_JOB)
    assert job.finished == clocks.db


def test_a_job_of_a_node_behind_that_beats_is_never_failed(clocks):
    job = _begin_job(clocks, "behind", -HOUR)
    for _ in range(3 * TIMEOUT // INTERVAL):
        clocks.wait(INTERVAL)
        clocks.beat("behind", -HOUR)
        with clocks.node("observer", HOUR):
            assert ownership.recover_orphans()["jobs"] == 0
    job.refresh_from_db()
    assert job.state == "running" and job.heartbeat == clocks.db


# -- feed claims ------------------------------------------------------------------------


def _feed() -> Source:
    return Source.objects.create(name="skewed", kind=Source.Kind.FEED, url="file:///nowhere")


def _claim(clocks: Clocks, source: Source, node: str, skew: timedelta) -> str:
    with clocks.node(node, skew):
        return refresh._claim(source, str(ownership.me()))


def test_a_claim_of_a_node_ahead_that_died_mid_refresh_is_taken_over_after_the_timeout(clocks):
    source = _feed()
    assert _claim(clocks, source, "ahead", HOUR) == ""
    clocks.wait(INTERVAL)
    clocks.beat("ahead", HOUR)  # it refreshed a while, then was killed
    clocks.wait(TIMEOUT - 1)
    assert "pid" in _claim(clocks, source, "observer", timedelta(0))
    clocks.wait(2)
    assert _claim(clocks, source, "observer", timedelta(0)) == ""
    assert Source.objects.get(pk=source.pk).refresh_owner.startswith("observer:")


def test_the_sweep_releases_a_dead_claim_of_a_node_ahead_after_the_timeout(clocks):
    source = _feed()
    assert _claim(clocks, source, "ahead", HOUR) == ""
    clocks.beat("ahead", HOUR)
    with clocks.node("observer", timedelta(0)):
        clocks.wait(TIMEOUT - 1)
        assert ownership.recover_orphans()["claims"] == 0
        clocks.wait(2)
        assert ownership.recover_orphans()["claims"] == 1
    assert Source.objects.get(pk=source.pk).refreshing_since is None


def test_a_live_claim_of_a_node_behind_is_not_taken_over(clocks):
    source = _feed()
    assert _claim(clocks, source, "behind", -HOUR) == ""
    for _ in range(3 * TIMEOUT // INTERVAL):
        clocks.wait(INTERVAL)
        clocks.beat("behind", -HOUR)
        assert "pid" in _claim(clocks, source, "observer", timedelta(0))
    assert Source.objects.get(pk=source.pk).refresh_owner.startswith("behind:")


def test_a_claim_of_a_node_ahead_that_died_before_its_first_beat_is_taken_over(clocks):
    source = _feed()
    assert _claim(clocks, source, "ahead", HOUR) == ""
    clocks.wait(TIMEOUT + 1)
    assert _claim(clocks, source, "observer", timedelta(0)) == ""


# -- change sets ------------------------------------------------------------------------


@contextmanager
def _writing(clocks: Clocks, node: str, skew: timedelta) -> Iterator[ChangeSet]:
    """A change set that node `node` opened (and, while the block runs, still holds)."""
    with clocks.node(node, skew), changes.change_set(kind=ChangeSet.Kind.IMPORT) as cs:
        yield cs


def _died_holding(clocks: Clocks, node: str, skew: timedelta, *, beaten: bool) -> ChangeSet:
    """A change set whose writer on `node` died inside it: its row as the block left it
    while open (the block's own end, which lets go of it, never came)."""
    with _writing(clocks, node, skew) as cs:
        if beaten:
            clocks.wait(INTERVAL)
            clocks.beat(node, skew)
        row = ChangeSet.objects.filter(pk=cs.pk).values("owner", "heartbeat").get()
    ChangeSet.objects.filter(pk=cs.pk).update(finished=None, **row)
    return cs


def test_a_change_set_of_a_node_ahead_that_died_is_partial_after_the_timeout(clocks):
    cs = _died_holding(clocks, "ahead", HOUR, beaten=True)
    with clocks.node("observer", -HOUR):
        clocks.wait(TIMEOUT - 1)
        assert changes.interrupted(kind=ChangeSet.Kind.IMPORT) is None
        clocks.wait(2)
        assert changes.interrupted(kind=ChangeSet.Kind.IMPORT) == cs


def test_a_change_set_of_a_node_behind_that_beats_is_never_partial(clocks):
    with _writing(clocks, "behind", -HOUR) as cs:
        for _ in range(3 * TIMEOUT // INTERVAL):
            clocks.wait(INTERVAL)
            clocks.beat("behind", -HOUR)
            with clocks.node("observer", HOUR):
                assert changes.interrupted(kind=ChangeSet.Kind.IMPORT) is None
                assert ownership.recover_orphans()["change_sets"] == 0
    cs.refresh_from_db()
    assert cs.finished is not None


def test_a_change_set_of_a_node_ahead_that_died_before_its_first_beat_is_partial(clocks):
    cs = _died_holding(clocks, "ahead", HOUR, beaten=False)
    clocks.wait(TIMEOUT + 1)
    with clocks.node("observer", timedelta(0)):
        assert changes.interrupted(kind=ChangeSet.Kind.IMPORT) == cs
