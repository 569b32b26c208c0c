"""An older filter file put in place of the live one (moved, or copied over it by
another process) is never answered from as current: checks are degraded and the
node's writer is woken until it has the log's head; `restore_filter` is the
supported restore; a sync sweeps what a killed rebuild left."""

from __future__ import annotations

import logging
import os
import subprocess

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from filterengine import FilterFileError, ScalingCountingBloomFilter
from urlguard.hotpath.guard import get_guard
from urlguard.models import SpamRule
from urlguard.nodesync import embedded, registry, sync, worker
from urlguard.writepath import changes

pytestmark = pytest.mark.django_db


def add(text: str) -> str:
    return changes.add_rule(text, category="spam", source="test").expression


@pytest.fixture
def checks_at_once(monkeypatch):
    """The registry's once-a-second checks and retries happen at every call."""
    monkeypatch.setattr(registry, "CHECK_SECONDS", 0.0)
    monkeypatch.setattr(registry, "RETRY_SECONDS", 0.0)


@pytest.fixture
def woken(monkeypatch):
    """The paths the registry asked this node's writer to catch up."""
    calls: list[str] = []
    monkeypatch.setattr(registry, "_behind_callbacks", [calls.append])
    return calls


@pytest.fixture
def backup(filter_path, quiet, sync_filter, checks_at_once, tmp_path):
    """A backup taken (by `cp`, another process) at one rule; two changes after it."""
    add("old.example.org")
    sync_filter()
    assert registry.get_filter() is not None  # this process maps the live file
    copy = tmp_path / "backup.bin"
    subprocess.run(["cp", str(filter_path), str(copy)], check=True)
    later = add("later.example.org")
    changes.remove_rule(SpamRule.objects.get(expression="old.example.org/"), source="test")
    sync_filter()
    assert later in registry.get_filter() and "old.example.org/" not in registry.get_filter()
    return copy, later


@pytest.mark.parametrize("put", ["mv", "cp"])
def test_an_older_file_put_in_place_is_degraded_until_the_writer_caught_it_up(
    put, filter_path, backup, sync_filter, checks_at_once, woken, client, caplog
):
    copy, later = backup
    # Another process restores the backup the way an operator would.
    subprocess.run([put, str(copy), str(filter_path)], check=True)
    with caplog.at_level(logging.WARNING, logger="urlguard.nodesync.registry"):
        assert registry.get_filter() is None
        assert "behind the change log" in registry.problem()
        assert "mapped anew at change #1, the log is at #3" in registry.problem()
    # Its position went back from the #3 this process saw: the alarm, not mere lag.
    assert any(
        r.levelno == logging.WARNING and "e.g. a backup" in r.getMessage() for r in caplog.records
    )
    assert woken == [str(filter_path)]
    verdict = get_guard().check(f"http://{later.rstrip('/')}/x")
    assert verdict.blocked and verdict.degraded  # answered from the table, not the file
    ready = client.get("/readyz")
    assert (
        ready.status_code == 503
        and "behind the change log" in ready.json()["checks"]["filter"]["error"]
    )
    sync_filter()  # what the woken writer does
    filt = registry.get_filter()
    assert filt is not None and later in filt and "old.example.org/" not in filt
    assert not get_guard().check(f"http://{later.rstrip('/')}/x").degraded
    assert client.get("/readyz").status_code == 200


def test_a_file_at_the_head_moved_in_is_trusted_with_one_query(
    filter_path, quiet, sync_filter, checks_at_once, woken, tmp_path, django_assert_num_queries
):
    add("a.example.org")
    sync_filter()
    copy = tmp_path / "copy.bin"
    subprocess.run(["cp", str(filter_path), str(copy)], check=True)
    os.replace(copy, filter_path)
    with django_assert_num_queries(1):
        assert registry.get_filter() is not None
    with django_assert_num_queries(0):
        for _ in range(3):  # the mapping is not compared with the log again
            assert registry.get_filter() is not None
    assert woken == []


def test_the_mapping_made_at_start_up_is_compared_with_the_log_at_its_first_check(
    filter_path, quiet, sync_filter, woken
):
    sync_filter()
    add("a.example.org")  # not applied: the file is behind
    registry.reset()
    registry.open_at_startup()  # no query while the apps load
    assert registry.get_filter() is None
    assert "behind the change log" in registry.problem() and woken


# -- another process's write, not applied here yet, is lag: no alarm --------------------
def _alarms(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("urlguard") and r.levelno >= logging.WARNING
    ]


def _rules_file(tmp_path, *hosts: str) -> str:
    path = tmp_path / "rules.txt"
    path.write_text("".join(f"{host}\n" for host in hosts), encoding="utf-8")
    return str(path)


@pytest.mark.django_db(transaction=True)  # each rule's nudge runs at its own commit
def test_the_first_make_run_seeds_without_an_alarm(filter_path, fresh_guard, caplog):
    # seed_demo on a fresh var/: it builds the empty file, then each rule's nudge
    # finds the file one change behind the rule just committed.
    with caplog.at_level(logging.DEBUG, logger="urlguard"):
        call_command("seed_demo", "--no-superuser", stdout=_Out())
    assert _alarms(caplog) == []
    filt = registry.get_filter()
    assert filt is not None and filt.applied_seq == sync.log_head() > 0


@pytest.mark.parametrize(
    "command",
    [
        lambda tmp_path: ("import_rules", _rules_file(tmp_path, "spam1.example.com", "b.example")),
        lambda tmp_path: ("allow_host", "good.example.org"),
    ],
    ids=["import_rules", "allow_host"],
)
def test_a_command_line_write_beside_a_serving_process_is_no_alarm(
    command, filter_path, sync_filter, committed, tmp_path, caplog
):
    add("before.example.org")
    sync_filter()
    caplog.clear()
    # The serving process holds its mapping throughout.
    with ScalingCountingBloomFilter.open(str(filter_path), readonly=True) as serving:
        registry.reset()  # the command's own process: it never mapped the file
        with caplog.at_level(logging.DEBUG, logger="urlguard"), committed():
            call_command(*command(tmp_path), stdout=_Out())
        assert _alarms(caplog) == []
        assert serving.applied_seq == sync.log_head()  # the command applied its write
    filt = registry.get_filter()
    assert filt is not None and filt.applied_seq == sync.log_head()


def test_a_host_process_mapping_before_the_import_is_applied_logs_lag_not_an_alarm(
    filter_path, sync_filter, nudges, checks_at_once, woken, tmp_path, caplog
):
    sync_filter()
    # The command-line import commits; its own process has not applied it yet.
    call_command("import_rules", _rules_file(tmp_path, "spam1.example.com"), stdout=_Out())
    registry.reset()
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="urlguard"):
        registry.open_at_startup()  # the host site starts meanwhile
        verdict = get_guard().check("http://spam1.example.com/x")
        assert verdict.blocked and verdict.degraded  # the table answers while it lags
        assert "not applied here yet" in registry.problem() and woken
        sync_filter()  # the import's apply
        assert registry.get_filter() is not None
    assert _alarms(caplog) == []
    assert "behind the change log" in caplog.text  # said, at DEBUG/INFO: lag


def test_a_worker_watch_catches_a_restored_backup_up_at_once(
    settings, filter_path, backup, checks_at_once, monkeypatch
):
    settings.URLGUARD = {**settings.URLGUARD, "CATCHUP_INTERVAL": 3600, "VERIFY_INTERVAL": 0}
    # Its thread closes its own connections; here it runs in the test's.
    monkeypatch.setattr(embedded.connections, "close_all", lambda: None)
    copy, later = backup
    watch = embedded.Upkeep(0.0, periodic=False)
    assert watch.tick(1.0) == (False, False)  # a usable file: nothing to do
    os.replace(copy, filter_path)
    assert watch.tick(2.0) == (True, False)
    filt = registry.get_filter()
    assert filt is not None and later in filt and "old.example.org/" not in filt
    # Never the periodic work: beat schedules that on a worker.
    assert watch.due(10.0**9, unusable=False, woken=False) == (False, False)


def test_the_worker_starts_its_watch_when_ready(filter_path, sync_filter):
    sync_filter()
    try:
        worker._catch_up_at_boot()
        assert embedded.upkeep.thread is not None and embedded.upkeep.thread.is_alive()
    finally:
        embedded.stop()


def test_a_file_truncated_by_another_process_degrades_checks(
    filter_path, quiet, sync_filter, checks_at_once
):
    listed = add("listed.example.org")
    sync_filter()
    url = f"http://{listed.rstrip('/')}/x"
    assert get_guard().check(url).blocked
    subprocess.run(["truncate", "-s", "0", str(filter_path)], check=True)
    verdict = get_guard().check(url)  # this process is alive to answer
    assert verdict.blocked and verdict.degraded
    assert "truncated" in verdict.reason


# -- restore_filter ----------------------------------------------------------------------
def test_restore_filter_replays_the_log_after_the_backup_and_replaces_atomically(
    filter_path, backup, caplog
):
    copy, later = backup
    reader = registry.get_filter()
    before = os.stat(filter_path).st_ino
    with caplog.at_level(logging.WARNING, logger="urlguard.nodesync.sync"):
        call_command("restore_filter", str(copy), stdout=(out := _Out()))
    assert "2 change(s) after the backup replayed; now at change #3" in out.text
    assert os.stat(filter_path).st_ino != before  # a new file, moved into place
    # The process that mapped the old file follows it, never answering stale.
    filt = registry.get_filter()
    assert filt is reader and later in filt and "old.example.org/" not in filt
    assert filt.is_clean and filt.applied_seq == sync.log_head()
    assert ScalingCountingBloomFilter.open(str(copy), readonly=True).applied_seq == 1
    assert "restored filter" in caplog.text
    assert not [n for n in os.listdir(filter_path.parent) if n.endswith(".tmp")]


class _Out:
    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


def _dirty(path):
    dirty = str(path) + ".dirty"
    subprocess.run(["cp", str(path), dirty], check=True)
    f = ScalingCountingBloomFilter.open(dirty)
    f._begin()  # a copy of a file a writer was changing
    f.close()  # with the change open: not flushed, left dirty
    return dirty


def _other_capacity(path):
    other = str(path) + ".small"
    ScalingCountingBloomFilter.build(other, [], capacity=1000, error_rate=0.01)
    return other


def _not_a_filter(path):
    with open(str(path) + ".txt", "w") as f:
        f.write("not a filter file\n" * 1000)
    return str(path) + ".txt"


def _ahead(path):
    ahead = str(path) + ".ahead"
    with ScalingCountingBloomFilter.open(str(path), readonly=True) as live:
        capacity, error_rate = live.capacity, live.error_rate
    ScalingCountingBloomFilter.build(
        ahead, [], capacity=capacity, error_rate=error_rate, applied_seq=99
    )
    return ahead


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (_dirty, "the file is dirty"),
        (_other_capacity, "capacity=1000"),
        (_not_a_filter, "magic"),
        (_ahead, "has applied change #99 but the change log ends at #1"),
        (lambda path: str(path), "is the live filter file itself"),
    ],
)
def test_restore_filter_refuses_what_it_cannot_restore(make, words, filter_path, sync_filter):
    add("a.example.org")
    sync_filter()
    before = filter_path.read_bytes()
    with pytest.raises(CommandError, match=words):
        call_command("restore_filter", make(filter_path))
    assert filter_path.read_bytes() == before
    assert not [n for n in os.listdir(filter_path.parent) if n.endswith(".tmp")]


# -- temp files of a killed rebuild ------------------------------------------------------
def test_a_sync_sweeps_the_temp_files_a_killed_rebuild_left(
    filter_path, sync_filter, quiet, caplog
):
    sync_filter()
    stale = filter_path.parent / f".{filter_path.name}.k1lled_r.tmp"
    stale.write_bytes(bytes(4096))
    other = filter_path.parent / "keep.tmp"  # not one of ours
    other.write_bytes(b"x")
    with caplog.at_level(logging.WARNING, logger="urlguard.nodesync.sync"):
        sync.sync_and_report(periodic=True)
    assert not stale.exists() and other.exists()
    assert "removed 1 temp file(s) a killed rebuild left" in caplog.text


def test_a_file_that_goes_bad_between_the_lookup_and_the_cache_still_answers():
    """Truncated by another process after the lookup said maybe: the table answers."""
    from tests.support.webfakes import SetFilter
    from urlguard.hotpath.guard import Guard

    class GoesBad(SetFilter):
        def __getattribute__(self, name):
            if name == "applied_seq":
                raise FilterFileError("f.bin: file size: truncated or overwritten while mapped")
            return super().__getattribute__(name)

    add("evil.example.org")
    verdict = Guard(lambda: GoesBad(everything=True)).check("http://evil.example.org/x")
    assert verdict.blocked and verdict.rule.expression == "evil.example.org/"
