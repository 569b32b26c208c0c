"""urlguard.feeds.partitions: a body staged in partitions on disk gives what Staged's
whole arrays give (the known units, the diff, the entries to add, the refusals, the
next memo), on generated bodies with duplicates, churn and rules deleted by hand; a
memo save killed part way leaves the last memo whole; and the memory a partitioned
read holds does not grow with the feed as Staged's does. The refresh's own scenarios
run in partitions too (tests/feeds/conftest.py's whole_and_in_partitions)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from urlguard.feeds import memo, partitions, staging
from urlguard.feeds.outcome import RefreshResult
from urlguard.writepath import allowlist

_POOL = ["a.example", "A.example", "b.example", "http://b.example/", "c.example/x", "com"]
_POOL += ["d.example", "e.example/p?q=1", "two words.example", "", "# note"]
_POOL += [f"h{i}.example" for i in range(30)]
_BODY = st.lists(st.sampled_from(_POOL), max_size=40)
_NOTHING = np.zeros(0, dtype=np.int64)


def _read(fmt: str, body: list[str], bits: int | None, remembered, listed: np.ndarray):
    """`body` staged and resolved, by Staged (bits None) or in 2**bits partitions."""
    if bits is None:
        staged = staging.Staged(fmt, "spam", remembered, listed)
    else:
        staged = partitions.Partitioned(fmt, "spam", 1 << bits, remembered, listed)
    result = RefreshResult(source="x")
    texts = (f"0.0.0.0 {line}" if fmt == "hosts" and line else line for line in body)
    staged.add_lines((n, t) for n, t in enumerate(texts, start=1) if t and t[0] != "#")
    staged.finish()
    staged.resolve(allowlist.Allowlist({}), result)
    return staged, result


def _refresh(fmt: str, source_id: int, body: list[str], bits: int | None, listed: np.ndarray):
    """What a refresh reads of `body` for a source listing `listed`, its memo saved."""
    if bits is None:
        remembered = memo.load(source_id, "stamp")
    else:
        remembered = memo.open_file(source_id, "stamp")  # type: ignore[assignment]
    staged, result = _read(fmt, body, bits, remembered, listed)
    try:
        diff = staged.diff()
        seen = {
            "known": staged.known,
            "count": staged.count(),
            "new": diff.count,
            "gone": diff.gone.tolist(),
            "rows": [row[1:] for row in staged.rows(diff.new)],
            "refusals": result.refusals,
            "refused": result.refused,
            "has": staged.has(np.array(listed.tolist() + [1, -1], dtype=np.int64)).tolist(),
        }
        keys = staged.sorted_keys() if bits is not None else staged.unique_keys.copy()
        staged.remember(source_id, "stamp", remembered)
        return seen, keys
    finally:
        staged.close()


def _memo_arrays(source_id: int) -> tuple[list[int], list[int], list[int], str]:
    saved = memo.load(source_id, "stamp")
    assert saved is not None
    return saved.high.tolist(), saved.low.tolist(), saved.keys.tolist(), saved.listed


@settings(max_examples=120, deadline=None)
@given(
    st.sampled_from(["urls", "hosts"]),
    _BODY,
    _BODY,
    _BODY,
    st.lists(st.integers(0, 60), max_size=5),
    st.integers(0, 3),
)
@example("urls", ["a.example"] * 3, ["a.example", "A.example"], [], [], 2)
@example("urls", ["h1.example", "h2.example"], ["h1.example", "h3.example"], [], [0], 3)
@example("hosts", ["a.example b.example"], ["a.example b.example", "com"], [], [1], 1)
def test_partitions_stage_what_the_whole_arrays_stage(fmt, first, second, third, dropped, bits):
    # Three refreshes of one source by each path, the listing of the second without a
    # few rules (deleted by hand), each against the memo its own path saved.
    try:
        listed = {None: _NOTHING, bits: _NOTHING}
        seen: dict[int | None, list] = {None: [], bits: []}
        for step, body in enumerate((first, second, third)):
            for path, source_id in ((None, 1), (bits, 2)):
                found, keys = _refresh(fmt, source_id, body, path, listed[path])
                seen[path].append(found)
                if step == 0 and len(keys):
                    keys = np.delete(keys, [i % len(keys) for i in dropped])
                listed[path] = keys
            assert seen[bits][-1] == seen[None][-1], step
            assert _memo_arrays(2) == _memo_arrays(1), step
    finally:
        for source_id in (1, 2):
            memo.path_for(source_id).unlink(missing_ok=True)


def test_a_partitioned_memo_save_killed_part_way_leaves_the_last_memo(monkeypatch):
    body = [f"h{i}.example" for i in range(30)]
    try:
        _refresh("urls", 3, body[:20], 2, _NOTHING)
        before = _memo_arrays(3)
        staged, _ = _read("urls", body, 2, memo.open_file(3, "stamp"), _NOTHING)

        def killed(self):
            yield np.zeros(1, dtype=np.int64)
            raise KeyboardInterrupt  # what a kill leaves: a temp file cut short

        monkeypatch.setattr(memo.FileColumn, "slices", killed)
        try:
            with pytest.raises(KeyboardInterrupt):
                staged.remember(3, "stamp", None)
        finally:
            staged.close()
        assert _memo_arrays(3) == before
        opened = memo.open_file(3, "stamp")
        assert opened is not None and len(opened) == 20
        opened.close()
    finally:
        memo.path_for(3).unlink(missing_ok=True)


@pytest.mark.parametrize(
    "entries, parts",
    [(0, 1), (partitions.PARTITION_ENTRIES, 1), (partitions.PARTITION_ENTRIES + 1, 16)]
    + [(32 * partitions.PARTITION_SIZE, 32), (10**12, 1 << partitions._MAX_BITS)],
)
def test_a_partition_holds_at_most_partition_size_entries(entries, parts):
    assert partitions.partitions_for(entries) == parts


def test_a_body_is_estimated_by_its_lines_or_its_last_refresh():
    import gzip
    import io

    from urlguard.models import Source

    plain = b"".join(b"http://h%d.example/\n" % i for i in range(1000))
    assert partitions.estimate(io.BytesIO(plain), len(plain)) == 1001
    document = b"[" + b'"x",' * 5000 + b"]"
    assert partitions.estimate(io.BytesIO(document), len(document)) == len(document) // 64
    packed = gzip.compress(plain)
    assert partitions.estimate(io.BytesIO(packed), len(packed)) == len(packed) // 2
    last = Source(last_bytes=len(plain), last_entries=500)
    assert partitions.estimate(io.BytesIO(plain), 2 * len(plain), last) == 1000
    body = io.BytesIO(plain)
    partitions.estimate(body, len(plain))
    assert body.tell() == 0


# -- memory ----------------------------------------------------------------------------


def _traced_peak(entries: int, bits: int | None) -> int:
    """tracemalloc's peak (bytes) of a first read and a 1% churn of `entries` lines, as
    a refresh does them (the churn's listing, 8 bytes a unit either way, not counted)."""
    lines = [f"http://h{i}.example/p/{i}" for i in range(entries)]
    churned = lines[entries // 100 :] + [f"http://n{i}.example/" for i in range(entries // 100)]
    peaks = []
    try:
        tracemalloc.start()
        listed = _NOTHING
        for body in (lines, churned):
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            remembered = memo.open_file(4, "s") if bits is not None else memo.load(4, "s")
            staged, _ = _read("urls", body, bits, remembered, listed)
            try:
                staged.diff()
                staged.remember(4, "s", remembered)
                del remembered
                peaks.append(tracemalloc.get_traced_memory()[1] - base)
                listed = staged.sorted_keys() if bits is not None else staged.unique_keys.copy()
            finally:
                staged.close()
        return max(peaks)
    finally:
        tracemalloc.stop()
        memo.path_for(4).unlink(missing_ok=True)


def test_a_partitioned_read_holds_a_partition_not_the_feed(monkeypatch):
    # Partitions of about the same size whatever the feed, and every batch and span
    # smaller than the feeds: a partitioned read's peak grows by the bytes a unit
    # held whole (which units are left, which memo entries kept, which entries are
    # new: one each), where Staged's grows by the feed's arrays (about a hundred).
    monkeypatch.setattr(partitions, "_SPAN", 1 << 10)
    monkeypatch.setattr(partitions, "_GATHER", 1 << 10)
    monkeypatch.setattr(staging, "_BATCH", 1 << 10)
    monkeypatch.setattr(staging, "_SPAN_UNITS", 1 << 10)
    monkeypatch.setattr(memo, "_SLICE", 1 << 8)
    small, large = 6_000, 18_000
    _traced_peak(1_000, 1)  # what a first run allocates once (imports, caches)
    grown = _traced_peak(large, 3) - _traced_peak(small, 1)
    whole = _traced_peak(large, None) - _traced_peak(small, None)
    assert whole > 40 * (large - small), whole
    assert grown < 8 * (large - small), (grown, whole)
