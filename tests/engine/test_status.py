"""What a caller learns of a filter file without mapping it (filterengine.status):
the header fields, the clean/torn state and whether a writer holds the lock."""

import os
import zlib

import pytest

from filterengine import (
    FilterFileError,
    ScalingCountingBloomFilter,
    file_status,
    writer_active,
    writer_lock_path,
)
from filterengine import fileformat as ff

S = ScalingCountingBloomFilter


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "filter.bin")


def test_status_reads_what_the_open_filter_says(path):
    generation = S.build(path, [("a", 1), ("b", 2)], capacity=100, error_rate=0.01, applied_seq=7)
    status = file_status(path)
    with S.open(path, readonly=True) as f:
        assert status.generation == f.generation == generation
        assert status.applied_seq == f.applied_seq == 7
        assert status.stage_count == f.stage_count == 1
        assert (status.capacity, status.error_rate) == (f.capacity, f.error_rate)
        assert status.is_clean and f.is_clean
    assert status.version == ff.VERSION and not status.torn
    assert status.path == path


def test_status_follows_growth_and_changes(path):
    with S.create(path, capacity=10, error_rate=0.01) as f:
        f.add_many([f"k{i}" for i in range(25)], list(range(25)))
        f.applied_seq = 3
        f.flush()
        status = file_status(path)
        assert status.stage_count == f.stage_count > 1
        assert status.applied_seq == 3 and status.is_clean
        with f.change():
            f.add("mid", 1)
            mid = file_status(path)
            assert mid.mem_seqnum == 0 and not mid.is_clean and not mid.torn


def test_a_file_a_writer_died_in_is_torn(path):
    S.build(path, [("a", 1)], capacity=100, error_rate=0.01)
    with S.open(path) as f:
        f._st.mem_seqnum = 0  # as a writer killed mid-change leaves it
        ff.write_state(f._view.buf, f._st)
        f._depth = 1  # keeps close() from flushing the change "done"
    with S.open(path) as f:  # the next writer finds it interrupted
        f.flush()
    status = file_status(path)
    assert status.torn and not status.is_clean


def test_status_of_another_version_says_rebuild(path):
    S.build(path, [("a", 1)], capacity=100, error_rate=0.01)
    with open(path, "r+b") as fh:
        head = bytearray(fh.read(ff.FIXED_SIZE))
        head[8:10] = (ff.VERSION - 1).to_bytes(2, "little")
        head[120:124] = zlib.crc32(head[:120]).to_bytes(4, "little")
        fh.seek(0)
        fh.write(head)
    with pytest.raises(FilterFileError, match="format version.*rebuild"):
        file_status(path)


def test_status_of_a_missing_or_short_file(path):
    with pytest.raises(FileNotFoundError):
        file_status(path)
    with open(path, "wb") as fh:
        fh.write(b"x" * 100)
    with pytest.raises(FilterFileError, match="file size"):
        file_status(path)


def test_writer_active_while_a_writer_has_the_file(path):
    assert not writer_active(path)  # no lock file yet
    assert not os.path.exists(writer_lock_path(path))  # and asking made none
    f = S.create(path, capacity=100, error_rate=0.01)
    assert writer_lock_path(path) == path + ".lock"
    assert writer_active(path)
    reader = S.open(path, readonly=True)
    assert writer_active(path)
    f.close()
    assert not writer_active(path)
    reader.close()


def test_writer_active_does_not_follow_a_planted_link(path, tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"")
    os.symlink(target, writer_lock_path(path))
    assert not writer_active(path)
