"""OppositeBloomFilter: the Go original's tests ported, its two false-positive bugs
fixed, and its promise (never a false "seen") checked by property and under threads."""

import threading

import mmh3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filterengine import OppositeBloomFilter
from filterengine.opposite import MAX_SIZE


def test_the_basics_replays_the_go_original():
    # jmhodges/opposite_of_a_bloom_filter go/oppobloom/oppobloom_test.go TestTheBasics,
    # call for call (Go's Contains is our contains_and_add).
    f = OppositeBloomFilter(2)
    twenty_nine = bytes([27, 28, 29])
    thirty = bytes([27, 28, 30])
    thirty_three = bytes([27, 28, 33])
    # The collisions the sequence relies on hold for our default hash too.
    assert mmh3.hash(thirty, 0) & 1 == mmh3.hash(thirty_three, 0) & 1
    assert mmh3.hash(twenty_nine, 0) & 1 != mmh3.hash(thirty, 0) & 1

    assert not f.contains_and_add(twenty_nine), "nothing should be contained at all"
    assert f.contains_and_add(twenty_nine), "now it should"
    assert not f.contains_and_add(thirty), "false unless the hash collides"
    assert f.contains_and_add(twenty_nine), "original should still return true"
    assert f.contains_and_add(thirty), "new array should still return true"
    assert not f.contains_and_add(thirty_three), "colliding array returns false"
    assert f.contains_and_add(thirty_three), "colliding array returns true in second call"
    assert not f.contains_and_add(thirty), "original colliding array returns false"
    assert f.contains_and_add(thirty), "original colliding array returns true"
    assert not f.contains_and_add(thirty_three), "colliding array returns false"


@pytest.mark.parametrize(
    ("asked", "rounded"), [(1, 1), (2, 2), (3, 4), (4, 4), (129, 256), (1000, 1024)]
)
def test_size_rounds_up_to_a_power_of_two(asked, rounded):
    assert OppositeBloomFilter(asked).size == rounded


@pytest.mark.parametrize("size", [0, -1, -(2**40)])
def test_too_small_size_is_an_error(size):
    with pytest.raises(ValueError, match="at least 1"):
        OppositeBloomFilter(size)


def test_too_large_size_is_an_error():
    with pytest.raises(ValueError, match=r"at most 2\*\*30"):
        OppositeBloomFilter(MAX_SIZE + 1)


@pytest.mark.parametrize("size", [1.5, "8", None, True])
def test_non_int_size_is_a_type_error(size):
    with pytest.raises(TypeError):
        OppositeBloomFilter(size)


def test_empty_slot_does_not_equal_the_empty_key():
    # Go: bytes.Equal(nil, []byte{}) is true, so a fresh filter "had seen" b"".
    f = OppositeBloomFilter(4)
    assert not f.contains(b"")
    assert not f.contains_and_add(b"")
    assert f.contains_and_add(b"")
    assert not f.contains_and_add("")  # text and bytes forms: at worst a false negative


def test_mutating_the_callers_buffer_does_not_change_the_stored_key():
    # Go stored the caller's slice; mutating it afterwards made a false "seen".
    f = OppositeBloomFilter(1)
    buf = bytearray(b"first")
    assert not f.contains_and_add(buf)
    buf[:] = b"other"
    assert not f.contains_and_add(b"other"), "stored key must still be b'first'"
    view_source = bytearray(b"abc")
    f.add(memoryview(view_source))
    view_source[0] = ord("z")
    assert f.contains(b"abc") and not f.contains(b"zbc")


def test_contains_does_not_write_and_add_does():
    f = OppositeBloomFilter(8)
    assert not f.contains("k")
    assert not f.contains("k")
    f.add("k")
    assert f.contains("k") and "k" in f
    f.discard("k")
    assert not f.contains("k")
    f.add("k")
    f.clear()
    assert not f.contains("k")


def test_str_keys_ascii_or_not():
    f = OppositeBloomFilter(64)
    for key in ("café", "plain", "\ud800 lone surrogate"):
        if key.startswith("\ud800"):
            with pytest.raises(UnicodeEncodeError):  # not an interpreter crash in mmh3
                f.contains_and_add(key)
            continue
        assert not f.contains_and_add(key)
        assert f.contains_and_add(key) and f.contains(key)
    # Non-ASCII text is stored as its UTF-8 bytes, so the bytes form is the same key;
    # for ASCII text the two forms may be "not seen" (a false negative, allowed).
    assert f.contains("café".encode())


def test_bad_key_type_is_a_clear_error():
    f = OppositeBloomFilter(8)
    with pytest.raises(TypeError, match="str or bytes-like"):
        f.add(12)


def test_pluggable_hash():
    calls = []

    def everything_collides(data: str | bytes) -> int:
        calls.append(data)
        return 0

    f = OppositeBloomFilter(16, hash_func=everything_collides)
    f.add("a")
    assert not f.contains_and_add("b")  # evicted "a"
    assert not f.contains("a")
    assert calls == ["a", "b", "a"]


@settings(max_examples=150, deadline=None)
@given(
    size=st.integers(1, 16),
    ops=st.lists(st.tuples(st.sampled_from("cas"), st.binary(max_size=3)), max_size=200),
)
def test_never_a_false_positive(size, ops):
    # Model: the filter may answer "seen" only if the key was stored and nothing
    # stored since hashed to the same slot with a different key.
    f = OppositeBloomFilter(size)
    last_in_slot: dict[int, bytes] = {}
    mask = f.size - 1
    for op, key in ops:
        slot = mmh3.hash(key, 0) & mask
        truly_there = last_in_slot.get(slot) == key
        if op == "c":
            assert f.contains(key) == truly_there
        elif op == "a":
            assert f.contains_and_add(key) == truly_there
            last_in_slot[slot] = key
        else:
            f.add(key)
            last_in_slot[slot] = key


def test_threads_hammering_colliding_keys_never_see_a_false_positive():
    # Every key collides into the one slot of a 1-slot filter, and each thread
    # uses its own keys: any True means some thread saw another's key as its own.
    f = OppositeBloomFilter(1)
    threads, rounds = 6, 20_000
    false_positives = []
    barrier = threading.Barrier(threads)

    def hammer(tid: int) -> None:
        mine = [f"t{tid}-{i}".encode() for i in range(3)]
        theirs = [f"t{(tid + 1) % threads}-{i}".encode() for i in range(3)]
        barrier.wait()
        seen = 0
        for i in range(rounds):
            key = bytearray(mine[i % 3])  # a mutable buffer, reused, as a caller might
            if f.contains_and_add(key):
                # Only possible if no other thread wrote since our own write of this key.
                seen += 1
            # Turn our buffer into the neighbour's next key: a filter that kept the
            # caller's buffer would now answer "seen" to the neighbour wrongly.
            key[:] = theirs[(i + 1) % 3]
        false_positives.append(seen)

    # Distinct per-thread keys and rotating 3 keys: a thread never adds the same
    # key twice in a row, so any True is a false positive.
    workers = [threading.Thread(target=hammer, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert false_positives == [0] * threads
