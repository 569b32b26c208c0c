"""urlguard.nodesync.tasks: the change log reaches the filter file in seq order, exactly once,
whatever happens to the nudges; a file that cannot be trusted is rebuilt (and the
log says why); the node reports its state."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import zlib

import pytest
from django.db import transaction

from filterengine import ScalingCountingBloomFilter, fileformat
from urlguard.conf import conf
from urlguard.models import ChangeEvent, NodeStatus, SpamRule
from urlguard.nodesync import embedded, registry, sync, tasks, worker
from urlguard.writepath import changes
from urlguard_service.celery import app as celery_app

pytestmark = pytest.mark.django_db


def add(text: str, category: str = "spam") -> SpamRule:
    return changes.add_rule(text, category=category, source="test")


def entries(filt) -> int:
    """Entries the file holds (sum over stages): counts every double application."""
    return sum(int(stage["count"]) for stage in filt.info()["stages"])


def reader(filter_path) -> ScalingCountingBloomFilter:
    return registry.get_filter(str(filter_path))


def head() -> int:
    return sync.log_head()


def deliver(up_to_seq=None):
    """One delivery of the nudge, run here as the node's worker would."""
    return (
        celery_app.tasks["urlguard.tasks.apply_changes"]
        .apply(kwargs={"up_to_seq": up_to_seq})
        .get()
    )


def test_changes_apply_in_order_exactly_once(quiet, filter_path):
    rules = [add(f"host{i}.example.org") for i in range(5)]
    first = deliver(head())
    assert first["rebuilt"] == "the file is missing"  # the first nudge builds the file
    filt = reader(filter_path)
    assert filt.applied_seq == head() and entries(filt) == 5
    assert all(r.expression in filt for r in rules)

    changes.remove_rule(rules[0])
    late = add("late.example.org")
    result = deliver(head())
    assert (result["applied"], result["rebuilt"]) == (2, "")
    assert filt.applied_seq == head() and entries(filt) == 5
    assert late.expression in filt


def test_a_duplicate_delivery_changes_nothing(quiet, filter_path, sync_filter):
    sync_filter()  # the file exists, at seq 0
    add("a.example.org")
    seq = head()
    assert deliver(seq)["applied"] == 1
    again = deliver(seq)
    assert again["skipped"] and again["applied"] == 0
    assert deliver(None)["applied"] == 0  # a catch-up after it finds nothing either
    assert entries(reader(filter_path)) == 1


def test_out_of_order_deliveries(quiet, filter_path, sync_filter):
    sync_filter()
    a = add("a.example.org")
    seq_a = head()
    add("b.example.org")
    changes.remove_rule(a)
    seq_last = head()
    # The newest nudge arrives first: it applies everything, in log order.
    assert deliver(seq_last)["applied"] == 3
    # The older one arrives late: nothing left to do, nothing applied twice.
    assert deliver(seq_a)["skipped"]
    filt = reader(filter_path)
    assert entries(filt) == 1 and "b.example.org/" in filt
    assert filt.applied_seq == seq_last


def test_a_missed_message_is_caught_up_and_the_staleness_logged(
    quiet, filter_path, sync_filter, caplog
):
    sync_filter()
    assert reader(filter_path) is not None  # a process that mapped it before the change
    rule = add("missed.example.org")  # its nudge is lost (quiet)
    assert rule.expression not in reader(filter_path)
    with caplog.at_level(logging.WARNING, logger="urlguard.nodesync.sync"):
        result = celery_app.tasks["urlguard.tasks.catch_up"].apply().get()
    assert result["applied"] == 1
    assert rule.expression in reader(filter_path)
    assert any(
        "had missed" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records
    ), caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="urlguard.nodesync.sync"):
        celery_app.tasks["urlguard.tasks.catch_up"].apply().get()
    assert not caplog.records  # a catch-up with nothing missed is quiet


def test_catch_up_is_scheduled_and_nudges_reach_every_node(settings):
    schedule = celery_app.conf.beat_schedule["urlguard-catch-up"]
    assert schedule["task"] == "urlguard.tasks.catch_up"
    assert schedule["schedule"] == 60.0
    for name in ("apply_changes", "catch_up", "rebuild_filter"):
        route = celery_app.amqp.router.route({}, f"urlguard.tasks.{name}")
        assert route["queue"].exchange.type == "fanout"
        assert route["queue"].exchange.name == "urlguard.broadcast"
        # On Redis the publisher must know the exchange is a fanout, and publish on
        # the key the workers subscribe to, or every nudge silently vanishes.
        assert [e.type for e in route["declare"]] == ["fanout"]
        assert route["routing_key"] == route["queue"].routing_key == "urlguard.nudge"


def test_removal_of_a_rule_added_long_ago_reaches_its_stage(
    quiet, settings, filter_path, sync_filter
):
    settings.URLGUARD = {**settings.URLGUARD, "FILTER_CAPACITY": 50}
    old = add("old.example.org")
    sync_filter()
    changes.add_rules([f"h{i}.example.net" for i in range(400)], source="test")
    sync_filter()
    filt = reader(filter_path)
    stages = filt.info()["stages"]
    assert len(stages) >= 3, "a small capacity must have grown several stages"
    first_before = int(stages[0]["count"])

    changes.remove_rule(old)
    result = sync_filter()
    assert (result.applied, result.rebuilt) == (1, "")  # no KeyError: routed right
    stages = filt.info()["stages"]
    assert int(stages[0]["count"]) == first_before - 1  # the stage that took the add
    assert entries(filt) == 400
    live = list(SpamRule.objects.values_list("expression", flat=True))
    assert filt.contains_many(live).all()  # no false negative for anyone else


def test_add_and_remove_in_one_chunk_in_log_order(quiet, filter_path, sync_filter):
    sync_filter()
    a = add("a.example.org")
    changes.remove_rule(a)
    a2 = add("a.example.org")  # listed again: a new id
    assert a2.added_at != a.added_at
    assert sync_filter().applied == 3
    filt = reader(filter_path)
    assert entries(filt) == 1 and "a.example.org/" in filt


def _dirty(path) -> None:
    """A writer that dies (SIGKILL-like: os._exit) in the middle of a change."""
    code = textwrap.dedent(f"""
        import os
        from filterengine import ScalingCountingBloomFilter
        f = ScalingCountingBloomFilter.open({str(path)!r}, readonly=False)
        f.change().__enter__()
        f.add("half-applied.example/", 1)
        os._exit(9)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 9, proc.stderr


def _corrupt(path) -> None:
    with open(path, "r+b") as fh:
        fh.seek(8)
        fh.write(b"\xff" * 16)


def _older_version(path) -> None:
    """A file an earlier filterengine wrote: a valid header of the previous version."""
    with open(path, "r+b") as fh:
        head = bytearray(fh.read(128))
        head[8:10] = (fileformat.VERSION - 1).to_bytes(2, "little")
        head[120:124] = zlib.crc32(head[:120]).to_bytes(4, "little")
        fh.seek(0)
        fh.write(head)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda p: os.unlink(p), "missing"),
        (_dirty, "dirty"),
        (_corrupt, "unreadable"),
        (_older_version, "format version: expected"),
    ],
)
def test_a_bad_file_is_rebuilt_and_the_log_says_why(
    quiet, filter_path, sync_filter, caplog, damage, reason
):
    rules = [add(f"r{i}.example.org") for i in range(3)]
    sync_filter()
    damage(filter_path)
    registry.reset()
    extra = add("after.example.org")
    with caplog.at_level(logging.WARNING, logger="urlguard.nodesync.sync"):
        result = sync_filter()
    assert reason in result.rebuilt
    assert any(reason in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records), (
        caplog.text
    )
    filt = reader(filter_path)
    assert filt.is_clean and filt.applied_seq == head()
    assert entries(filt) == 4
    assert all(r.expression in filt for r in [*rules, extra])


def test_a_file_of_other_parameters_is_rebuilt(quiet, settings, filter_path, sync_filter):
    add("a.example.org")
    sync_filter()
    settings.URLGUARD = {**settings.URLGUARD, "FILTER_ERROR_RATE": 0.02}
    result = sync_filter()
    assert "FILTER_ERROR_RATE=0.02" in result.rebuilt
    assert sync_filter().rebuilt == ""  # and now it matches


def test_a_file_ahead_of_the_log_is_rebuilt(quiet, filter_path, sync_filter):
    add("a.example.org")
    sync_filter()
    with registry.writer(str(filter_path)) as filt, filt.change():
        filt.applied_seq = 10_000
    result = sync_filter()
    assert "another database" in result.rebuilt
    assert reader(filter_path).applied_seq == head()


def test_a_removal_the_file_cannot_honour_means_rebuild(quiet, filter_path, sync_filter):
    a = add("a.example.org")
    b = add("b.example.org")
    # A file that claims to be current but lacks `a` (someone built it wrongly).
    ScalingCountingBloomFilter.build(
        str(filter_path),
        [(b.expression, b.added_at)],
        capacity=conf.FILTER_CAPACITY,
        error_rate=conf.FILTER_ERROR_RATE,
        applied_seq=head(),
    )
    registry.reset()
    changes.remove_rule(a)
    result = sync_filter()
    assert "disagrees with the log" in result.rebuilt
    filt = reader(filter_path)
    assert entries(filt) == 1 and b.expression in filt


def test_rebuild_snapshot_matches_the_table(quiet, filter_path):
    for i in range(30):
        add(f"r{i}.example.org")
    changes.remove_rules(SpamRule.objects.all()[:10])
    rules, seq = sync.rebuild(str(filter_path))
    assert (rules, seq) == (20, head())
    filt = reader(filter_path)
    assert entries(filt) == 20 and filt.applied_seq == seq
    assert filt.contains_many(list(SpamRule.objects.values_list("expression", flat=True))).all()


def test_status_is_reported(quiet, settings, filter_path):
    settings.URLGUARD = {**settings.URLGUARD, "NODE_NAME": "node-a"}
    add("a.example.org")
    deliver(head())
    status = NodeStatus.objects.get(node="node-a")
    assert status.applied_seq == head() and status.is_clean
    assert status.filter_path == str(filter_path)
    assert len(status.info["stages"]) >= 1 and status.last_error == ""
    assert status.last_rebuild_at is not None  # the first delivery built the file


def test_rebuild_task_records_its_duration(quiet, settings, filter_path):
    settings.URLGUARD = {**settings.URLGUARD, "NODE_NAME": "node-b"}
    add("a.example.org")
    celery_app.tasks["urlguard.tasks.rebuild_filter"].apply(kwargs={"reason": "test"}).get()
    status = NodeStatus.objects.get(node="node-b")
    assert status.last_rebuild_seconds is not None and status.last_rebuild_seconds >= 0
    assert "a.example.org/" in reader(filter_path)


def test_in_process_mode_applies_on_commit(filter_path, django_capture_on_commit_callbacks):
    """The embedded default: the nudge runs the task in-process right after commit."""
    with django_capture_on_commit_callbacks(execute=True):
        rule = add("eager.example.org")
    assert rule.expression in reader(filter_path)
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        changes.remove_rule(rule)
    assert reader(filter_path).applied_seq == head()
    assert entries(reader(filter_path)) == 0


def test_a_busy_writer_fails_the_nudge_softly_and_catch_up_repairs(
    settings, filter_path, sync_filter, caplog, django_capture_on_commit_callbacks
):
    settings.URLGUARD = {**settings.URLGUARD, "WRITER_LOCK_TIMEOUT": 0.2}
    sync_filter()
    with registry.writer(str(filter_path)):  # e.g. a long rebuild in another process
        with (
            caplog.at_level(logging.WARNING, logger="urlguard"),
            django_capture_on_commit_callbacks(execute=True),
        ):
            rule = add("a.example.org")
        with pytest.raises(registry.WriterBusy, match="another process is writing"):
            sync.sync(path=str(filter_path))
    assert "nudge failed" in caplog.text
    assert SpamRule.objects.filter(pk=rule.pk).exists()  # the edit is never lost
    celery_app.tasks["urlguard.tasks.catch_up"].apply().get()
    assert rule.expression in reader(filter_path)


def test_broker_down_then_catch_up(
    settings, filter_path, sync_filter, django_capture_on_commit_callbacks
):
    sync_filter()
    assert reader(filter_path) is not None  # a process that mapped it before the change
    saved = {k: celery_app.conf[k] for k in ("task_always_eager", "broker_url")}
    celery_app.conf.update(task_always_eager=False, broker_url="redis://127.0.0.1:1/0")
    celery_app._pool = None
    celery_app.amqp._producer_pool = None
    try:
        with django_capture_on_commit_callbacks(execute=True):
            rule = add("a.example.org")
    finally:
        celery_app.conf.update(saved)
        celery_app._pool = None
        celery_app.amqp._producer_pool = None
    assert rule.expression not in reader(filter_path)
    try:
        worker._catch_up_at_boot()  # the worker's boot-time catch-up (beat's does the same)
    finally:
        embedded.stop()  # the watch it starts
    assert rule.expression in reader(filter_path)


def test_a_busy_node_retries_with_backoff_and_reports_it(monkeypatch, settings):
    """On a worker (not in-process), a held lock or a database hiccup is retried by
    Celery with exponential backoff, and the node's status shows the error meanwhile."""
    from types import SimpleNamespace

    from celery.exceptions import Retry

    settings.URLGUARD = {**settings.URLGUARD, "NODE_NAME": "busy-node"}

    def busy(*args, **kwargs):
        raise registry.WriterBusy("filter.bin: another process is writing this filter")

    monkeypatch.setattr(sync, "sync", busy)
    retries = []

    def retry(*, exc, countdown, max_retries):
        retries.append((exc, countdown, max_retries))
        return Retry(exc=exc, when=countdown)

    task = SimpleNamespace(request=SimpleNamespace(is_eager=False, retries=3), retry=retry)
    with pytest.raises(Retry):
        tasks._run(task, 7)
    ((exc, countdown, max_retries),) = retries
    assert isinstance(exc, registry.WriterBusy)
    assert 0 <= countdown <= 8 and max_retries == tasks.MAX_RETRIES  # 2**3 with full jitter
    assert "another process is writing" in NodeStatus.objects.get(node="busy-node").last_error
    # In-process (a web request): no sleeping retries, the error goes to the nudge's log.
    task.request.is_eager = True
    with pytest.raises(registry.WriterBusy):
        tasks._run(task, 7)


def test_the_log_is_applied_in_chunks_each_ending_at_its_seq(
    quiet, filter_path, sync_filter, monkeypatch
):
    sync_filter()
    start = sync.log_head()
    rules = [add(f"c{i}.example.org") for i in range(7)]
    changes.remove_rule(rules[2])
    seqs = list(
        ChangeEvent.objects.filter(seq__gt=start).order_by("seq").values_list("seq", flat=True)
    )
    calls = []
    for name in ("add_many", "remove_many"):
        real = getattr(ScalingCountingBloomFilter, name)

        def recording(self, keys, ids, _real=real, _name=name):
            calls.append((_name, len(list(keys)), self.applied_seq))
            return _real(self, keys, ids)

        monkeypatch.setattr(ScalingCountingBloomFilter, name, recording)
    monkeypatch.setattr(sync, "APPLY_CHUNK", 3)
    assert sync_filter().applied == 8
    # Chunks of 3 rows in log order; each starts at the mark the previous one set,
    # and runs of one action go in one call.
    assert calls == [
        ("add_many", 3, start),
        ("add_many", 3, seqs[2]),
        ("add_many", 1, seqs[5]),
        ("remove_many", 1, seqs[5]),
    ]
    filt = reader(filter_path)
    assert filt.applied_seq == seqs[-1] and entries(filt) == 6


def test_a_rebuild_sizes_the_first_stage_to_the_rules(quiet, settings, filter_path, sync_filter):
    settings.URLGUARD = {**settings.URLGUARD, "FILTER_CAPACITY": 50, "REBUILD_HEADROOM": 1.5}
    changes.add_rules([f"h{i}.example.net" for i in range(400)], source="test")
    assert sync_filter().rebuilt == "the file is missing"
    filt = reader(filter_path)
    assert filt.stage_count == 1 and filt.capacity == 600
    assert sync_filter().rebuilt == ""  # a first stage above the minimum is no mismatch


def test_the_periodic_catch_up_compacts_a_file_of_too_many_stages(
    quiet, settings, filter_path, sync_filter
):
    settings.URLGUARD = {**settings.URLGUARD, "FILTER_CAPACITY": 50, "FILTER_MAX_STAGES": 2}
    add("first.example.org")
    sync_filter()
    rules = changes.add_rules([f"h{i}.example.net" for i in range(400)], source="test")
    assert sync_filter().rebuilt == ""  # applying a nudge never compacts
    filt = reader(filter_path)
    assert filt.stage_count >= 3

    result = celery_app.tasks["urlguard.tasks.catch_up"].apply().get()
    assert result["rebuilt"].startswith("compacting")
    assert filt.stage_count == 1 and entries(filt) == 401
    assert all(e in filt for e in [*rules.added, "first.example.org/"])
    assert celery_app.tasks["urlguard.tasks.catch_up"].apply().get()["rebuilt"] == ""


def test_the_full_verify_is_scheduled_and_reaches_every_node():
    schedule = celery_app.conf.beat_schedule["urlguard-verify"]
    assert schedule["task"] == "urlguard.tasks.verify_filter"
    assert schedule["schedule"] == float(conf.VERIFY_INTERVAL)
    route = celery_app.amqp.router.route({}, "urlguard.tasks.verify_filter")
    assert route["queue"].exchange.type == "fanout"
    assert route["queue"].exchange.name == conf.BROADCAST_QUEUE


def test_the_verify_task_repairs_damaged_counters(quiet, filter_path, sync_filter):
    rules = changes.add_rules([f"h{i}.example.net" for i in range(50)], source="test").added
    sync_filter()
    with open(filter_path, "r+b") as f:  # every counter zeroed, the header intact
        f.seek(fileformat.DATA_OFFSET)
        f.write(bytes(os.path.getsize(filter_path) - fileformat.DATA_OFFSET))
    result = celery_app.tasks["urlguard.tasks.verify_filter"].apply().get()
    assert result["missing"] == 50
    assert all(r in reader(filter_path) for r in rules)


def test_a_broker_reconnect_catches_up_at_once(monkeypatch):
    """The consumer step starts on every (re)connection; the first is boot (caught up
    by worker_ready). The real reconnect is in test_services.py."""
    from types import SimpleNamespace

    calls = []
    monkeypatch.setattr(worker, "_catch_up_now", calls.append)
    from celery.signals import celeryd_init

    # Added to the site's app as a worker starts (not at import: no app of our own).
    celeryd_init.send(sender="node", instance=SimpleNamespace(app=celery_app), conf=None)
    assert worker.CatchUpOnReconnect in celery_app.steps["consumer"]
    step = worker.CatchUpOnReconnect(SimpleNamespace())
    step.start(None)
    assert calls == []
    step.start(None)
    assert calls == ["broker-reconnect"]
