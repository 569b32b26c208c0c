"""The writer lock and file modes: one writer per file, a lock file that is never
followed through a symbolic link, and files only their owner can read."""

import os
import stat

import pytest

from filterengine import FilterFileError, ScalingCountingBloomFilter, acquire_lock, release_lock
from filterengine.locking import acquire_writer_lock, release_writer_lock

S = ScalingCountingBloomFilter


def mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_planted_symlink_at_the_lock_path_is_refused(tmp_path):
    path = str(tmp_path / "filter.bin")
    S.create(path, capacity=100, error_rate=0.01).close()
    os.unlink(path + ".lock")
    target = tmp_path / "victim"
    os.symlink(target, path + ".lock")
    for attempt in (
        lambda: S.open(path),
        lambda: S.build(path, [("k", 1)], capacity=100, error_rate=0.01),
    ):
        with pytest.raises(FilterFileError, match="symbolic link") as err:
            attempt()
        assert path + ".lock" in str(err.value)
        assert not target.exists()  # the link's target was not created
    # Readers take no lock: they still work.
    with S.open(path, readonly=True) as r:
        assert r.count == 0


def test_a_symlink_to_an_existing_file_is_not_opened(tmp_path):
    path = str(tmp_path / "filter.bin")
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    os.symlink(victim, path + ".lock")
    with pytest.raises(FilterFileError, match="symbolic link"):
        S.create(path, capacity=100, error_rate=0.01)
    assert victim.read_text() == "keep me"
    assert not os.path.exists(path)


def test_lock_and_filter_files_are_owner_only(tmp_path):
    old = os.umask(0)  # the modes come from the code, not from a lucky umask
    try:
        created = str(tmp_path / "created.bin")
        S.create(created, capacity=100, error_rate=0.01).close()
        built = str(tmp_path / "built.bin")
        S.build(built, [("k", 1)], capacity=100, error_rate=0.01)
    finally:
        os.umask(old)
    for path in (created, created + ".lock", built, built + ".lock"):
        assert mode(path) == 0o600, (path, oct(mode(path)))


def test_the_lock_is_reentrant_only_after_release(tmp_path):
    path = str(tmp_path / "f.bin")
    fd = acquire_writer_lock(path, 0.0)
    try:
        with pytest.raises(FilterFileError, match="another process is writing"):
            acquire_writer_lock(path, 0.05)
    finally:
        release_writer_lock(fd)
    release_writer_lock(acquire_writer_lock(path, 0.0))


def test_any_lock_file_takes_the_same_bounded_wait(tmp_path):
    """acquire_lock is the writer lock's wait for any lock file (the service's sync lock):
    None once the wait runs out, owner-only, never through a symbolic link."""
    old = os.umask(0)
    try:
        fd = acquire_lock(str(tmp_path / "x.lock"), 0.0)
    finally:
        os.umask(old)
    assert fd is not None and mode(tmp_path / "x.lock") == 0o600
    try:
        assert acquire_lock(str(tmp_path / "x.lock"), 0.05) is None
    finally:
        release_lock(fd)
    release_lock(acquire_lock(str(tmp_path / "x.lock"), 0.0))
    os.symlink(tmp_path / "victim", tmp_path / "link.lock")
    with pytest.raises(OSError):
        acquire_lock(str(tmp_path / "link.lock"), 0.0)
    assert not (tmp_path / "victim").exists()
