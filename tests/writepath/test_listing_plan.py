"""The seam between the feeds and the write path: a listing plan is data (entries on
disk, keys to withdraw, figures), urlguard.writepath.apply.apply_listing writes any
plan, made by a refresh or by hand, in one change set, and a refresh whose apply
fails part way records the change set it left partial."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.faults import fail_on_call
from urlguard.feeds.refresh import refresh_source
from urlguard.models import (
    AdminJob,
    AllowedHost,
    ChangeSet,
    FeedRefresh,
    RuleSource,
    Source,
    SpamRule,
    expression_key,
)
from urlguard.writepath import apply, bulkload, changes
from urlguard.writepath.apply import apply_listing
from urlguard.writepath.plan import Additions, ChangePlan, Entries, ListingPlan

pytestmark = pytest.mark.django_db


def listed(source: Source) -> set[str]:
    return set(RuleSource.objects.filter(source=source).values_list("rule__expression", flat=True))


def additions(*expressions: str) -> Additions:
    return Additions.of((e, "spam", expression_key(e)) for e in expressions)


def test_additions_are_an_entry_file_read_back_in_order():
    spool = additions(*(f"h{i}.example/" for i in range(40_000)))
    try:
        assert spool.count == 40_000
        rows = list(spool.rows())
        assert rows[0] == ("h0.example/", "spam", expression_key("h0.example/"))
        assert [e for e, _, _ in rows] == [f"h{i}.example/" for i in range(40_000)]
        assert list(spool.rows()) == rows  # read again from the start
    finally:
        spool.close()


def test_only_the_picked_entries_are_additions_numbered_from_the_first():
    expressions = ["a.example/", "b.example/", "c.example/", "d.example/"]
    spool = Additions.of((e, "spam", expression_key(e)) for e in expressions)
    # The same file as entries 10-13 of a body whose first ten the memo resolved.
    keys = np.concatenate((np.zeros(10, dtype=np.int64), spool.keys))
    picked = np.zeros(14, dtype=bool)
    picked[[11, 13]] = True
    later = Additions(spool.file, 10, keys, picked)
    try:
        assert later.count == 2
        assert [e for e, _, _ in later.rows()] == ["b.example/", "d.example/"]
    finally:
        spool.close()


def test_a_plan_made_by_hand_is_applied_in_one_change_set(nudges, monkeypatch):
    feed = Source.objects.create(name="f", kind=Source.Kind.FEED, url="file:///dev/null")
    changes.add_rules(["old.example", "kept.example"], source=feed)
    changes.add_rules(["old.example"], source="admin")
    spool = additions("new.example/", "kept-too.example/")
    plan = ListingPlan(
        source=feed,
        reason="by hand",
        additions=spool,
        withdrawals=np.sort(np.array([expression_key("old.example/")], dtype=np.int64)),
        listed=2,
        refused=3,
    )
    job = AdminJob.objects.create(kind=AdminJob.Kind.REFRESH, state=AdminJob.State.RUNNING)
    steps: list[str] = []
    real = apply._record_progress

    def seen(*args):
        steps.append(args[1])
        real(*args)

    monkeypatch.setattr(apply, "_record_progress", seen)
    try:
        applied = apply_listing(plan, job=job.pk)
    finally:
        spool.close()
    assert listed(feed) == {"kept.example/", "new.example/", "kept-too.example/"}
    # Withdrawn, not removed: the admin lists it too.
    assert "old.example/" in set(SpamRule.objects.values_list("expression", flat=True))
    assert (applied.rules_added, applied.rules_removed, applied.refused) == (2, 0, [])
    cs = ChangeSet.objects.get(pk=applied.change_set)
    assert (cs.kind, cs.reason, cs.source, cs.added, cs.refused) == (
        "refresh",
        "by hand",
        feed,
        2,
        3,
    )
    assert cs.finished is not None
    assert steps == ["writing", "adding", "removing", "withdrawing"]


def test_the_apply_refuses_a_host_allowlisted_after_the_plan_was_made(nudges):
    feed = Source.objects.create(name="f", kind=Source.Kind.FEED, url="file:///dev/null")
    spool = additions("code-host.example/", "evil.example/")
    plan = ListingPlan(
        source=feed,
        reason="by hand",
        additions=spool,
        withdrawals=np.zeros(0, dtype=np.int64),
        listed=0,
        allowlist_digest="the allowlist the plan was screened against",
    )
    AllowedHost.objects.create(host="code-host.example")
    try:
        applied = apply_listing(plan)
    finally:
        spool.close()
    assert listed(feed) == {"evil.example/"}
    assert [(e, c) for e, c, _ in applied.refused] == [("code-host.example/", "spam")]
    assert ChangeSet.objects.get(pk=applied.change_set).refused == 1


def test_a_refresh_whose_apply_fails_part_way_records_the_partial_change_set(
    server, nudges, monkeypatch
):
    url = server.serve("/l", "".join(f"h{i}.example\n" for i in range(30)).encode())
    feed = Source.objects.create(name="f", kind=Source.Kind.FEED, url=url)
    real = changes.add_listed

    def in_chunks_of_ten(*args, **kwargs):
        return real(*args, **{**kwargs, "chunk_size": 10})

    monkeypatch.setattr(changes, "add_listed", in_chunks_of_ten)
    # The second chunk fails, written by the chunked writes or the bulk loader.
    fail_on_call(monkeypatch, changes, "_add_chunk", 2, OSError("the disk went away"))
    fail_on_call(monkeypatch, bulkload, "_add_listed_chunk", 2, OSError("the disk went away"))
    result = refresh_source(feed)
    assert result.status == "failed" and "the disk went away" in result.error
    partial = ChangeSet.objects.get(kind="refresh")
    assert partial.finished is None and partial.added == 10
    assert result.change_set == partial.pk
    assert FeedRefresh.objects.get().change_set_id == partial.pk
    monkeypatch.undo()
    again = refresh_source(feed)
    assert (again.status, again.change_set) == ("ok", partial.pk)
    assert len(listed(feed)) == 30


def test_entries_keep_each_note_and_list_a_repeated_expression_once():
    notes = ["", "tab\there", "two\nlines\r", "back\\slash \\n not a line end"]
    rows = [(f"n{i}.example/", "malware", note) for i, note in enumerate(notes)]
    entries = Entries.of("import:x", [*rows, ("n1.example/", "spam", "again")])
    try:
        assert entries.count == 4
        assert list(entries.rows()) == [(e, c, expression_key(e), n) for e, c, n in rows]
    finally:
        entries.close()


def test_an_apply_writes_its_progress_to_the_job_row_chunk_by_chunk(nudges, monkeypatch):
    """The admin's bar reads the job's row: the apply writes it after each chunk, with
    no callable handed in."""
    job = AdminJob.objects.create(kind=AdminJob.Kind.IMPORT, state=AdminJob.State.RUNNING)
    seen: list[tuple[int, int, str]] = []

    def reading_the_row(module, name):
        real = getattr(module, name)

        def chunk(*args, **kwargs):
            seen.append(AdminJob.objects.values_list("done", "total", "message").get(pk=job.pk))
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, chunk)

    reading_the_row(changes, "_add_chunk")
    reading_the_row(bulkload, "_add_listed_chunk")
    plan = ChangePlan(
        kind=ChangeSet.Kind.IMPORT,
        additions=[Entries.of("import:x", ((f"p{i}.example/", "spam", "") for i in range(10)))],
        chunk_size=3,
    )
    try:
        applied = apply_listing(plan, job=job.pk)
    finally:
        plan.close()
    assert applied.rules_added == 10
    assert seen == [(done, 10, "Adding…") for done in (0, 3, 6, 9)]
    job.refresh_from_db()
    assert (job.done, job.total, job.message) == (10, 10, "Written…")


def test_a_refresh_job_shows_the_apply_writing_on_its_row(server, nudges, monkeypatch):
    """The job's id crosses the seam as data; the apply writes the bar's figures."""
    url = server.serve("/l", "".join(f"j{i}.example\n" for i in range(30)).encode())
    feed = Source.objects.create(name="f", kind=Source.Kind.FEED, url=url)
    job = AdminJob.objects.create(kind=AdminJob.Kind.REFRESH, state=AdminJob.State.RUNNING)
    real = changes.add_listed
    monkeypatch.setattr(changes, "add_listed", lambda *a, **kw: real(*a, **kw, chunk_size=10))
    assert refresh_source(feed, job=job.pk).status == "ok"
    job.refresh_from_db()
    assert (job.done, job.total, job.message) == (30, 30, "Adding…")
