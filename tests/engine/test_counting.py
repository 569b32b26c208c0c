"""CountingBloomFilter and the packed counters: properties, saturation, removal rules."""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from filterengine import CountingBloomFilter, FilterFileError
from filterengine.counters import (
    counter_value,
    counter_values,
    stage_add_many,
    stage_counter_indices,
    stage_counters,
)
from filterengine.hashing import hash_pair, hash_pairs

key_st = st.one_of(st.text(max_size=12), st.binary(max_size=12))
# Operations: ("add", key) or ("remove", index into the keys present so far).
ops_st = st.lists(
    st.one_of(st.tuples(st.just("add"), key_st), st.tuples(st.just("remove"), st.integers(0, 99))),
    max_size=80,
)


def counters_of(f, key):
    # Slice i's position is (h1 + i*h2) mod cells; slices pair up in the two
    # nibbles of one region of `cells` bytes (counters.py).
    h1, h2 = hash_pair(key)
    return [
        counter_value(f._buf, 2 * ((i // 2) * f.cells + (h1 + i * h2) % f.cells) + i % 2)
        for i in range(f.k)
    ]


@settings(max_examples=80, deadline=None)
@given(ops_st, st.booleans())
def test_no_false_negatives_for_any_add_remove_sequence(ops, tiny):
    # A tiny filter forces collisions and saturation; a roomy one the normal case.
    f = CountingBloomFilter(3 if tiny else 500, 0.2 if tiny else 0.01)
    present = []
    for op, arg in ops:
        if op == "add":
            f.add(arg)
            present.append(arg)
        elif present:
            f.remove(present.pop(arg % len(present)))
        assert all(f.contains(k) for k in present)
    assert f.contains_many(present).all() if present else True
    assert f.count == len(present)


@settings(max_examples=60, deadline=None)
@given(st.lists(key_st, min_size=1, max_size=60), st.data())
def test_batch_remove_keeps_the_rest(keys, data):
    f = CountingBloomFilter(20, 0.1)
    f.add_many(keys)
    doomed_idx = data.draw(st.sets(st.integers(0, len(keys) - 1)))
    doomed = [keys[i] for i in sorted(doomed_idx)]
    kept = [k for i, k in enumerate(keys) if i not in doomed_idx]
    f.remove_many(doomed)
    assert f.contains_many(kept).all() if kept else True
    assert f.count == len(kept)


@settings(max_examples=40, deadline=None)
@given(st.lists(key_st, max_size=60))
def test_batch_and_scalar_adds_agree(keys):
    a, b = CountingBloomFilter(30, 0.05), CountingBloomFilter(30, 0.05)
    for k in keys:
        a.add(k)
    b.add_many(keys)
    assert a.to_bytes() == b.to_bytes()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c", b"d", "e" * 9]), max_size=70), st.booleans())
@example(["a"] * 17, False)  # one key past saturation in one sparse batch
def test_batch_adds_count_repeated_keys_as_scalar_adds_do(keys, roomy):
    # Few distinct keys in a big filter: the sparse batch path, where every
    # repeated key's positions collide within the batch (and saturate past 15).
    a, b = (
        CountingBloomFilter(5000 if roomy else 200, 0.01),
        CountingBloomFilter(5000 if roomy else 200, 0.01),
    )
    for k in keys:
        a.add(k)
    b.add_many(keys)
    assert a.to_bytes() == b.to_bytes()


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.sampled_from(["a", "b", "c", b"d"]), max_size=40),
    st.lists(st.sampled_from(["a", "b", "c", b"d"]), max_size=40),
)
@example(["a"] * 3, ["a"] * 4)  # one removal too many in one batch
@example(["a"] * 17, ["a"] * 2)  # saturated counters stay at 15
def test_batch_removes_of_repeated_keys_match_scalar_removes(added, removed):
    a, b = CountingBloomFilter(5000, 0.01), CountingBloomFilter(5000, 0.01)
    a.add_many(added)
    b.add_many(added)
    before = b.to_bytes()
    try:
        for k in removed:
            a.remove(k)
    except KeyError:
        with pytest.raises(KeyError):
            b.remove_many(removed)
        assert b.to_bytes() == before  # all or nothing
    else:
        b.remove_many(removed)
        assert a.to_bytes() == b.to_bytes()


@settings(max_examples=40, deadline=None)
@given(st.integers(16, 40), st.integers(1, 40), st.booleans())
def test_saturated_counters_stay_saturated(adds, removes, batch):
    f = CountingBloomFilter(100, 0.01)
    if batch:
        f.add_many(["hot"] * adds)
    else:
        for _ in range(adds):
            f.add("hot")
    assert counters_of(f, "hot") == [15] * f.k  # saturated, not wrapped to 0
    removes = min(removes, adds)
    if batch:
        f.remove_many(["hot"] * removes)
    else:
        for _ in range(removes):
            f.remove("hot")
    assert counters_of(f, "hot") == [15] * f.k
    assert "hot" in f


def test_remove_absent_key_raises_and_changes_nothing():
    f = CountingBloomFilter(1000, 0.01)
    f.add_many(["a", "b"])
    before = f.to_bytes()
    with pytest.raises(KeyError):
        f.remove("zzz-not-there")
    with pytest.raises(KeyError, match="not present"):
        f.remove_many(["a", "zzz-not-there"])
    assert f.to_bytes() == before
    # Removing a key more often than it was added, within one batch, is refused too.
    with pytest.raises(KeyError, match="more often"):
        f.remove_many(["a", "a"])
    assert f.to_bytes() == before
    f.remove("a")
    with pytest.raises(KeyError):
        f.remove("a")
    assert "b" in f and "a" not in f


def test_duplicates_within_a_batch_are_counted():
    f = CountingBloomFilter(1000, 0.01)
    f.add_many(["x", "x", "x"])
    assert counters_of(f, "x") == [3] * f.k
    f.remove_many(["x", "x"])
    assert counters_of(f, "x") == [1] * f.k


def test_counter_packing_two_slices_per_byte_region():
    # k=3 slices of 4 cells: slice 0 in the low and slice 1 in the high nibbles
    # of bytes 0-3, slice 2 in the low nibbles of bytes 4-7.
    array = np.zeros(8, dtype=np.uint8)
    h1 = np.array([1, 1, 2], dtype=np.uint64)
    h2 = np.array([1, 1, 1], dtype=np.uint64)  # positions 1,2,3 / 1,2,3 / 2,3,0
    stage_add_many(array, 0, 3, 4, h1, h2)
    assert list(array) == [0x00, 0x02, 0x21, 0x10, 0x01, 0x00, 0x00, 0x02]
    assert stage_counters(0, 3, 4, 2, 1) == [4, 7, 8]  # byte 2 low, 3 high, 4 low
    c = stage_counter_indices(0, 4, 2, h1, h2)
    assert list(counter_values(array, c)) == [2, 2, 1]


def test_measured_fpr_within_1_25x():
    f = CountingBloomFilter(100_000, 0.01)
    f.add_many([f"https://p{i}.example.com/x/{i}" for i in range(100_000)])
    fpr = f.contains_many([f"https://a{i}.example.org/y/{i}" for i in range(100_000)]).mean()
    assert fpr <= 0.0125
    assert f.expected_fpp() == pytest.approx(0.01, rel=0.25)
    assert f.approximate_count() == pytest.approx(100_000, rel=0.02)
    assert f.nbytes <= 100_000 * 4.8 * 1.05


@pytest.mark.parametrize("capacity,rate", [(10, 0.01), (100, 0.001)])
def test_tiny_filters_keep_their_rate(capacity, rate):
    # Sized without the double-hashing floor (hashing.min_cells), these
    # measured several times their rate: a stored key's (h1 mod m, h2 mod m)
    # pair, hit by an absent key, matches in every slice.
    hits = 0
    filters, probes = 300, 1000
    for trial in range(filters):
        f = CountingBloomFilter(capacity, rate)
        f.add_many([f"https://k{trial}-{i}.example/" for i in range(capacity)])
        absent = [f"https://absent-{trial}-{i}.example.net/" for i in range(probes)]
        hits += int(f.contains_many(absent).sum())
    assert hits / (filters * probes) <= rate * 1.25


def test_round_trip_and_kind_check():
    from filterengine import BloomFilter

    f = CountingBloomFilter(500, 0.01)
    f.add_many(["a", "b", "b"])
    g = CountingBloomFilter.from_bytes(f.to_bytes())
    assert g.to_bytes() == f.to_bytes() and g.count == 3
    g.remove("b")
    assert "b" in g
    with pytest.raises(FilterFileError, match="kind"):
        CountingBloomFilter.from_bytes(BloomFilter(500, 0.01).to_bytes())
    with pytest.raises(FilterFileError, match="kind"):
        BloomFilter.from_bytes(f.to_bytes())


@pytest.mark.parametrize("bad", [3, None, 2.0, bytearray(b"a")])
def test_non_str_bytes_key_is_type_error(bad):
    f = CountingBloomFilter(10, 0.1)
    for call in (
        f.add,
        f.contains,
        f.remove,
        lambda k: f.remove_many([k]),
        lambda k: f.add_many([k]),
    ):
        with pytest.raises(TypeError, match=type(bad).__name__):
            call(bad)


@pytest.mark.parametrize(("capacity", "rate"), [(0, 0.01), (-5, 0.01), (10, 0.0), (10, 1.0)])
def test_bad_parameters(capacity, rate):
    with pytest.raises(ValueError):
        CountingBloomFilter(capacity, rate)


def test_hash_pairs_of_generator():
    h1, _ = hash_pairs(k for k in ["a", "b"])
    assert len(h1) == 2


def test_a_batch_larger_than_one_numbered_part_counts_every_key():
    # stage_add_many numbers keys in parts of 65,535: repeats across the boundary
    # must count as repeats within one part do.
    keys = [f"k{i % 40_000}" for i in range(70_000)]
    a, b = CountingBloomFilter(200_000, 0.01), CountingBloomFilter(200_000, 0.01)
    for k in keys:
        a.add(k)
    b.add_many(keys)
    assert a.to_bytes() == b.to_bytes()
