"""Several processes on one filter file: readers follow a live writer and a
rebuild without reopening, and a second writer is refused. (A writer killed at
each store of its state, deterministically: test_faults.py.)"""

import multiprocessing

import pytest

from filterengine import FilterLockedError, ScalingCountingBloomFilter

S = ScalingCountingBloomFilter
# spawn, not fork: a forked child would inherit the parent's lock descriptor.
ctx = multiprocessing.get_context("spawn")


def keys(batch, n=500):
    return [f"https://b{batch}.example.com/{i}" for i in range(n)]


def _writer_in_steps(path, go, done, batches):
    with S.open(path) as f:
        for batch in range(batches):
            go.wait(10)
            go.clear()
            with f.change():
                f.add_many(keys(batch), [batch * 1000 + i for i in range(500)])
                f.applied_seq = batch + 1
            f.flush()
            done.set()


def test_reader_follows_a_writer_in_another_process(tmp_path):
    path = str(tmp_path / "f.bin")
    S.create(path, capacity=200, error_rate=0.01).close()
    reader = S.open(path, readonly=True)  # opened before the writer's changes
    go, done = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_writer_in_steps, args=(path, go, done, 4))
    child.start()
    try:
        for batch in range(4):
            assert not reader.contains_many(keys(batch)).all()
            go.set()
            assert done.wait(20), "writer did not report"
            done.clear()
            # Same object, no reopen: the shared mapping shows the additions,
            # and the new stages the writer appended are picked up.
            assert reader.contains_many(keys(batch)).all()
            assert all(k in reader for k in keys(batch)[:50])
            assert reader.applied_seq == batch + 1
        assert len(reader.info()["stages"]) >= 4
        assert reader.is_clean
    finally:
        child.join(20)
        reader.close()
    assert child.exitcode == 0


def _hold_writer(path, ready, release):
    with S.open(path) as f:
        f.add("held", 1)
        ready.set()
        release.wait(20)


def test_second_writer_in_another_process_is_refused(tmp_path):
    path = str(tmp_path / "f.bin")
    S.create(path, capacity=100, error_rate=0.01).close()
    ready, release = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_hold_writer, args=(path, ready, release))
    child.start()
    try:
        assert ready.wait(20)
        with pytest.raises(FilterLockedError, match=r"f\.bin\.lock"):
            S.open(path)
        with pytest.raises(FilterLockedError):
            S.build(path, [], capacity=100, error_rate=0.01, lock_timeout=0.1)
        with S.open(path, readonly=True) as r:
            assert "held" in r
    finally:
        release.set()
        child.join(20)
    assert child.exitcode == 0
    S.open(path, lock_timeout=5).close()  # released when the holder exited


def _rebuild(path, tag, n):
    S.build(
        path, [(f"{tag}-{i}", i) for i in range(n)], capacity=100, error_rate=0.01, applied_seq=n
    )


def test_reader_survives_rebuilds_by_another_process(tmp_path):
    path = str(tmp_path / "f.bin")
    S.build(path, [(f"old-{i}", i) for i in range(300)], capacity=100, error_rate=0.01)
    reader = S.open(path, readonly=True)
    assert "old-5" in reader
    for round_, n in enumerate((50, 700, 20)):
        child = ctx.Process(target=_rebuild, args=(path, f"new{round_}", n))
        child.start()
        child.join(30)
        assert child.exitcode == 0
        assert reader.contains_many([f"new{round_}-{i}" for i in range(n)]).all()
        assert reader.applied_seq == n
        assert f"new{round_}-0" in reader
    assert reader.contains_many([f"old-{i}" for i in range(300)]).mean() < 0.05
    reader.close()
