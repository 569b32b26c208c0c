"""A stage of a scaling file (filterengine.stage): its table entry and its counters,
on a buffer of its own, as the scaling filter and the removal routing use them."""

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from filterengine import fileformat as ff
from filterengine.hashing import hash_pair, hash_pairs
from filterengine.stage import Stage

HEADER = ff.Header(seed=0, capacity=50, error_rate=0.01, growth=2.0, tightening=0.5, generation=1)


def fresh(index=0):
    entry = ff.stage_plan(HEADER, index, ff.DATA_OFFSET)
    buf = bytearray(entry.end)
    ff.pack_entry(buf, index, entry)
    return Stage(index, entry), memoryview(buf), np.frombuffer(buf, dtype=np.uint8)


def test_took_and_gave_keep_count_and_id_range():
    stage, buf, _ = fresh(1)
    assert stage.dynamic(buf) == (0, ff.NO_ID_FIRST, ff.NO_ID_LAST)
    assert stage.room(buf) == stage.capacity
    stage.took(buf, 3, 10, 20)
    stage.took(buf, 1, 5, 5)
    assert stage.dynamic(buf) == (4, 5, 20)
    assert stage.holds_id(buf, 5) and stage.holds_id(buf, 20) and not stage.holds_id(buf, 21)
    stage.gave(buf, 2)
    assert stage.dynamic(buf) == (2, 5, 20)  # the range still routes later removals
    assert stage.room(buf) == stage.capacity - 2


@given(st.lists(st.binary(max_size=6), min_size=1, max_size=30), st.integers(0, 29))
@example([b"x", b"x"], 0)  # a key held twice gives up one occurrence
def test_take_and_put_back_restore_the_counters(keys, which):
    stage, buf, array = fresh()
    h1, h2 = hash_pairs(keys)
    stage.add_many(array, h1, h2)
    before = bytes(buf)
    key = keys[which % len(keys)]
    moved = stage.take(buf, *hash_pair(key))
    assert moved is not None
    assert bytes(buf) != before or not moved  # only saturated counters stay put
    stage.put_back(buf, moved)
    assert bytes(buf) == before
    assert stage.contains_many(array, h1, h2).all()  # no false negative after the undo


def test_take_refuses_an_absent_key_and_changes_nothing():
    stage, buf, array = fresh()
    h1, h2 = hash_pairs(["a", "b"])
    stage.add_many(array, h1, h2)
    before = bytes(buf)
    assert stage.take(buf, *hash_pair("never added")) is None
    assert bytes(buf) == before


def test_batch_removal_plan_matches_single_takes():
    stage, buf, array = fresh()
    keys = [f"k{i}" for i in range(20)]
    h1, h2 = hash_pairs(keys)
    stage.add_many(array, h1, h2)
    twin = bytearray(buf)
    plan, short = stage.plan_removal(array, h1[:5], h2[:5])
    assert not short.any()
    stage.apply_removal(array, plan)
    for key in keys[:5]:
        assert stage.take(memoryview(twin), *hash_pair(key)) is not None
    assert bytes(buf) == bytes(twin)
    assert stage.contains_many(array, h1[5:], h2[5:]).all()


@given(
    st.lists(st.sampled_from(["a", "b", "c", b"d", "e"]), max_size=40),
    st.lists(st.sampled_from(["a", "b", "c", b"d", "x"]), max_size=40),
)
@example(["a"] * 3, ["a"] * 4)  # one removal too many, in one batch
@example(["a"] * 17, ["a"] * 3)  # saturated counters stay at 15
@example(["a", "b"], ["a", "x"])  # a key never added
def test_one_pass_batch_removal_agrees_with_the_plan(added, removed):
    stage, buf, array = fresh()
    stage.add_many(array, *hash_pairs(added))
    twin = np.array(array)
    before = bytes(buf)
    h1, h2 = hash_pairs(removed)
    plan, short = stage.plan_removal(twin, h1, h2)
    log = stage.remove_many(array, h1, h2)
    if short.any():
        assert log is None
        assert bytes(buf) == before  # refused: every counter as it was
    else:
        assert log is not None
        stage.apply_removal(twin, plan)
        assert bytes(buf) == twin.tobytes()
        stage.undo_removal(array, log)
        assert bytes(buf) == before


def test_a_batch_removal_larger_than_one_numbered_part():
    # Keys are numbered in parts of 65,535: a key removed in two parts is taken
    # twice, and one removal too many in the last part undoes the first part too.
    header = ff.Header(
        seed=0, capacity=200_000, error_rate=0.01, growth=2.0, tightening=0.5, generation=1
    )
    entry = ff.stage_plan(header, 0, ff.DATA_OFFSET)
    raw = bytearray(entry.end)
    stage, array = Stage(0, entry), np.frombuffer(raw, dtype=np.uint8)
    keys = [f"k{i % 40_000}" for i in range(70_000)]
    stage.add_many(array, *hash_pairs(keys))
    before = bytes(raw)
    assert stage.remove_many(array, *hash_pairs([*keys, "k1"])) is None
    assert bytes(raw) == before
    assert stage.remove_many(array, *hash_pairs(keys)) is not None
    assert not any(raw[entry.offset :])
