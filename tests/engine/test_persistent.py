"""PersistentBloomFilter: old versions never change, untouched blocks are shared by
identity, batches copy each block once, diff names exactly the changed blocks."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filterengine import PersistentBloomFilter
from filterengine.persistent import diff

keys_strategy = st.lists(st.text(max_size=12) | st.binary(max_size=12), max_size=60)


def test_add_returns_a_new_version_and_leaves_the_old_one_unchanged():
    v0 = PersistentBloomFilter(1000, 0.01)
    before = v0.to_bytes()
    v1 = v0.add("a")
    assert v1 is not v0
    assert "a" in v1 and "a" not in v0
    assert v0.to_bytes() == before
    assert v0.count == 0 and v1.count == 1


def test_untouched_blocks_are_the_same_objects():
    v1 = PersistentBloomFilter(50_000, 0.01, fanout=8, block_bytes=64).add_many(
        f"seed{i}" for i in range(200)
    )
    v2 = v1.add("one more")
    changed = set(diff(v1, v2))
    assert 0 < len(changed) <= v1.info()["k"]
    b1, b2 = v1.blocks(), v2.blocks()
    for i, (x, y) in enumerate(zip(b1, b2, strict=True)):
        if i in changed:
            assert x is not y and x != y
        else:
            assert x is y, f"block {i} was copied though the add did not touch it"


def test_adding_a_present_key_copies_nothing():
    v1 = PersistentBloomFilter(1000, 0.01).add("k")
    assert v1.add("k") is v1


def test_transient_batch_copies_each_block_once_and_then_seals():
    v0 = PersistentBloomFilter(1000, 0.01, fanout=4, block_bytes=16)
    t = v0.transient()
    assert t.add("a") and t.add("b")
    assert not t.add("a")
    # Both keys went into blocks the transient owns: its first copy of a block is
    # mutated in place, so touching a block again makes no new object.
    after_two = t._root
    t.add("c")
    assert t._root is after_two
    v1 = t.persistent()
    assert {"a", "b", "c"} <= {k for k in "abc" if k in v1}
    assert not any(k in v0 for k in "abc")
    with pytest.raises(RuntimeError, match="sealed"):
        t.add("d")
    # The sealed version is immutable: a later add copies rather than mutating it.
    snapshot = v1.to_bytes()
    v1.add("d")
    assert v1.to_bytes() == snapshot


def test_transient_with_nothing_added_returns_the_source():
    v0 = PersistentBloomFilter(100, 0.01)
    assert v0.transient().persistent() is v0


def test_diff_rejects_incompatible_filters():
    with pytest.raises(ValueError, match="different shapes"):
        diff(PersistentBloomFilter(100, 0.01), PersistentBloomFilter(1000, 0.01))


@pytest.mark.parametrize(("fanout", "block_bytes"), [(3, 64), (8, 100), (1, 64)])
def test_shape_must_be_powers_of_two(fanout, block_bytes):
    with pytest.raises(ValueError, match="power of two"):
        PersistentBloomFilter(100, 0.01, fanout=fanout, block_bytes=block_bytes)


@settings(max_examples=60, deadline=None)
@given(
    base=keys_strategy,
    more=keys_strategy,
    shape=st.sampled_from([(2, 2), (4, 16), (16, 256), (64, 1024)]),
)
def test_versions_are_independent_and_have_no_false_negatives(base, more, shape):
    fanout, block_bytes = shape
    v0 = PersistentBloomFilter(200, 0.01, fanout=fanout, block_bytes=block_bytes)
    v1 = v0.add_many(base)
    snapshot = v1.to_bytes()
    v2 = v1
    for key in more:
        v2 = v2.add(key)
    assert all(k in v1 for k in base)
    assert all(k in v2 for k in base + more)
    assert v1.to_bytes() == snapshot
    # diff is exactly the set of blocks whose bytes differ.
    block = block_bytes
    a, b = v1.to_bytes(), v2.to_bytes()
    expected = [
        i
        for i in range(len(a) // block + 1)
        if a[i * block : (i + 1) * block] != b[i * block : (i + 1) * block]
    ]
    assert diff(v1, v2) == expected


@settings(max_examples=30, deadline=None)
@given(keys=keys_strategy)
def test_batch_and_one_by_one_give_the_same_bits(keys):
    v0 = PersistentBloomFilter(300, 0.01, fanout=4, block_bytes=32)
    one_by_one = v0
    for key in keys:
        one_by_one = one_by_one.add(key)
    assert v0.add_many(keys).to_bytes() == one_by_one.to_bytes()


def test_false_positive_rate_at_capacity():
    f = PersistentBloomFilter(3000, 0.01).add_many(f"in{i}" for i in range(3000))
    false = sum(f"out{i}" in f for i in range(30_000))
    assert false / 30_000 <= 0.013
