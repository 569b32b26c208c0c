"""urlguard.feeds.staging: a body read a block at a time into units (the ones the
memo knows resolved as read), the units read back from the spool, and the memo's
lookups and merges against the plain numpy operations they stand for."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from urlguard.feeds import memo, staging
from urlguard.feeds.decoding import numbered, open_text


@pytest.mark.parametrize("span_bytes", [1 << 23, 8])
def test_units_read_back_are_the_lines_staged(monkeypatch, span_bytes):
    monkeypatch.setattr(staging, "_SPAN_UNITS", 3)
    monkeypatch.setattr(staging, "_SPAN_BYTES", span_bytes)  # 8: each unit on its own
    lines = [f"http://h{i}.example/{'x' * i}\n" for i in range(10)] + ["caf\u00e9.example\n"]
    staged = staging.Staged("urls", "spam")
    try:
        staged.add_lines(enumerate(lines, start=1))
        staged.finish()
        staged.units.flush()
        ends = staged.ends
        wanted = np.array([0, 2, 3, 4, 9, 10], dtype=np.int64)
        got = list(staged._texts(wanted, ends))
        assert got == [(i, lines[i].rstrip("\n")) for i in wanted.tolist()]
        assert list(staged._texts(np.zeros(0, dtype=np.int64), ends)) == []
        spans = [text for _, texts in staged._spans() for text in texts]
        assert spans == [line.rstrip("\n") for line in lines]
    finally:
        staged.close()


def _read_by_blocks(body: bytes, comments: str, max_line: int, size: int):
    """(line numbers, texts, refused line numbers) of the units add_block stages."""
    refused: list[int] = []
    staged = staging.Staged("urls", "spam")
    try:
        with open_text(io.BytesIO(body), limit=1 << 20, max_line=max_line) as text:
            for first, block in text.blocks(size):
                staged.add_block(
                    first,
                    block,
                    comments=comments,
                    max_line=max_line,
                    refuse=lambda lineno, raw, reason: refused.append(lineno),
                )
        staged.finish()
        staged.units.flush()
        texts = [text for _, texts in staged._spans() for text in texts]
        return staged.linenos.tolist(), texts, refused
    finally:
        staged.close()


def _read_by_lines(body: bytes, comments: str, max_line: int):
    """The same from the line-by-line reader (decoding.numbered) and the length rule."""
    numbers, texts, refused = [], [], []
    with open_text(io.BytesIO(body), limit=1 << 20) as text:
        for lineno, line in numbered(text, comments):
            line = line.rstrip("\n")
            if max_line and len(line.removesuffix("\r")) > max_line:
                refused.append(lineno)
                continue
            numbers.append(lineno)
            texts.append(line)
    return numbers, texts, refused


_LINES = st.lists(
    st.text(alphabet="ab.#! \t\r\x0b\x1c\u00e9\u2003/", max_size=12)
    | st.sampled_from(["", " ", "#c", "!c", "a.example", "\u2003", "x" * 12]),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(_LINES, st.sampled_from(["", "#", "!"]), st.sampled_from([0, 4, 8]), st.integers(1, 64))
@example(["a.example", "", "b.example"], "#", 0, 1 << 18)
@example(["#comment", " a.example", "a.example\r"], "#", 0, 5)
@example(["xxxxxxxxxxxx", "a"], "#", 8, 3)  # too long, within one block and across
@example(["\u2003", "a"], "#", 0, 64)  # non-ASCII white space: a blank line
@example(["!", "a"], "!", 0, 64)
@example(["a.example"] * 3, "#", 0, 1)
@example(["aaaa\ra"], "", 4, 1)  # cut across blocks just after a CR: still too long
@example(["aaaa\r", "b"], "", 4, 1)  # a CRLF line of max_line characters
@example(["aaaa\r\ra"], "", 4, 1)  # cut after CRs
@example(["      a"], "", 4, 1)  # cut where it is still white space: not blank
@example(["      "], "", 4, 1)  # blank however long
@example(["aaaaaaaa\r\r"], "", 8, 1)  # max_line characters and two CRs: too long
def test_a_body_read_by_blocks_stages_what_the_line_reader_reads(lines, comments, max_line, size):
    body = ("\n".join(lines)).encode("utf-8")
    assert _read_by_blocks(body, comments, max_line, size) == _read_by_lines(
        body, comments, max_line
    )


def test_lines_the_memo_knows_of_listed_rules_are_neither_spooled_nor_normalized():
    lines = [f"http://h{i}.example/p" for i in range(6)]
    first = staging.Staged("urls", "spam")
    try:
        first.add_lines(enumerate(lines, start=1))
        first.finish()
        from urlguard.feeds.outcome import RefreshResult
        from urlguard.writepath import allowlist

        first.resolve(allowlist.Allowlist({}), RefreshResult(source="x"))
        remembered = memo.Memo(*memo._sorted_unique(first.high, first.low, first.keys))
        listed = np.sort(first.keys[[0, 1, 2, 3]])  # h4 and h5 no longer listed
    finally:
        first.close()
    again = staging.Staged("urls", "spam", remembered, listed)
    try:
        again.add_lines(enumerate([*lines, "http://new.example/p"], start=1))
        again.finish()
        assert again.known == 4 and len(again) == 7
        again.units.flush()
        texts = [text for _, texts in again._spans() for text in texts]
        assert texts == [lines[4], lines[5], "http://new.example/p"]
        assert again.linenos.tolist() == [5, 6, 7]
    finally:
        again.close()


_KEYS = st.lists(
    st.integers(-(2**63), 2**63 - 1) | st.sampled_from([-(2**63), 2**63 - 1, 0, -1, 1]),
    max_size=200,
)


@settings(max_examples=300, deadline=None)
@given(_KEYS, _KEYS)
@example([], [1, 2])
@example([5, 5, 5], [5, 4, 6])
@example([-(2**63), 2**63 - 1], [-(2**63), 2**63 - 1, 0])
def test_the_bucket_index_finds_what_a_binary_search_finds(pool, values):
    pool_array = np.sort(np.array(pool, dtype=np.int64))
    value_array = np.array(values, dtype=np.int64)
    index = memo.Index(pool_array)
    assert index.positions(value_array).tolist() == (
        np.searchsorted(pool_array, value_array).tolist() if len(pool) else [0] * len(values)
    )
    assert index.contains(value_array).tolist() == [v in set(pool) for v in values]
    assert memo.search(pool_array, value_array).tolist() == (
        np.searchsorted(pool_array, value_array).tolist()
    )


def test_the_bucket_index_of_a_large_pool_finds_what_a_binary_search_finds():
    # Buckets enough that the table is built in several slices of them.
    rng = np.random.default_rng(27)
    pool = np.sort(rng.integers(-(2**63), 2**63 - 1, 300_000, dtype=np.int64, endpoint=True))
    values = np.concatenate((pool[::7], rng.integers(-(2**63), 2**63 - 1, 50_000, dtype=np.int64)))
    index = memo.Index(pool)
    assert len(index.table) - 1 > 4 * memo._SLICE
    assert (index.positions(values) == np.searchsorted(pool, values)).all()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(-50, 50), unique=True, max_size=40),
    st.lists(st.integers(-60, 60), max_size=40),
    st.data(),
)
def test_a_merged_memo_is_the_memo_saved_from_scratch(old, new, data):
    def entries(highs):
        highs = np.array(highs, dtype=np.int64)
        return highs, highs * 7, highs * 13

    before = memo.Memo(*memo._sorted_unique(*entries(old)))
    kept = np.array(
        data.draw(st.lists(st.sampled_from(range(len(old))), max_size=len(old))) if old else [],
        dtype=np.int64,
    )
    high, low, keys = (part() for part in before.merged_parts(kept, *entries(new)))
    expected_high = sorted({int(before.high[k]) for k in kept.tolist()} | set(new))
    assert high.tolist() == expected_high
    assert low.tolist() == [h * 7 for h in expected_high]
    assert keys.tolist() == [h * 13 for h in expected_high]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(-50, 50), unique=True, max_size=40),
    st.lists(st.integers(-60, 60), max_size=40),
    st.data(),
)
@example(old=[], new=[3, 1], data=None)
@example(old=list(range(-50, 50)), new=[-60, 60, 0], data=None)
def test_a_merged_memo_written_a_slice_at_a_time_is_the_merge_made_whole(old, new, data):
    from unittest import mock

    def entries(highs):
        highs = np.array(highs, dtype=np.int64)
        return highs, highs * 7, highs * 13

    before = memo.Memo(*memo._sorted_unique(*entries(old)))
    picks = data.draw(st.lists(st.sampled_from(range(len(old))))) if old and data else []
    kept = np.array(sorted(set(picks)) if data else range(0, len(old), 2), dtype=np.int64)
    whole = [part() for part in before.merged_parts(kept, *entries(new))]
    with mock.patch.object(memo, "_SLICE", 4):  # slices of 4 old entries, and a tail
        for merged, expected in zip(before.merged_parts(kept, *entries(new)), whole, strict=True):
            out = io.BytesIO()
            memo._write_slices(out, merged)
            out.seek(0)
            assert np.load(out, allow_pickle=False).tolist() == expected.tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-20, 20), max_size=60))
@example(highs=[5, 5, 5, 5, 5, 4, 4, 4, 4])  # a run of one high word across slices
def test_a_memo_saved_a_slice_at_a_time_is_the_memo_sorted_whole(highs):
    from unittest import mock

    high = np.array(highs, dtype=np.int64)
    low, keys = high * 7 + np.arange(len(high)), high * 13
    expected = memo._sorted_unique(high, low, keys)
    with mock.patch.object(memo, "_SLICE", 4):
        parts = memo._sorted_unique_parts(high, low, keys)
        for part, whole in zip(parts, expected, strict=True):
            out = io.BytesIO()
            memo._write_slices(out, part)
            out.seek(0)
            assert np.load(out, allow_pickle=False).tolist() == whole.tolist()


@pytest.mark.parametrize(
    "extra",
    [[], ["HTTPS://Mixed.Case.example/A?q=1", "com", "two words.example"]],
    ids=["all plain", "with lines the full path reads"],
)
def test_resolve_gives_what_normalize_rule_gives_line_by_line(monkeypatch, extra):
    from urlguard.feeds.outcome import RefreshResult
    from urlguard.models import expression_key
    from urlguard.writepath import allowlist
    from urlguard.writepath.rules import RuleError, normalize_rule

    monkeypatch.setattr(staging, "_SPAN_UNITS", 4)  # spans all plain and mixed
    lines = [f"http://h{i}.example/p/{i}" for i in range(9)] + extra + ["h9.example"]
    expected = []
    for line in lines:
        tokens = line.split()
        try:
            expected.append(normalize_rule(tokens[0]) if len(tokens) == 1 else None)
        except RuleError:
            expected.append(None)
    staged = staging.Staged("urls", "spam")
    try:
        staged.add_lines(enumerate(lines, start=1))
        staged.finish()
        result = RefreshResult(source="x")
        staged.resolve(allowlist.Allowlist({}), result)
        got = [expression for expression, _ in staged.lines(np.ones(len(staged.keys), bool))]
        assert got == [e for e in expected if e is not None]
        assert staged.keys.tolist() == [expression_key(e) for e in got]
        assert staged.unit_of.tolist() == [i for i, e in enumerate(expected) if e is not None]
        assert result.refused == sum(e is None for e in expected)
    finally:
        staged.close()
