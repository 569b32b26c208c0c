"""The filter file under faults: a full file system (injected, and a real tiny
tmpfs where the machine allows it), a file truncated under a reader process, a
writer stopped at every store of its state, a rebuild over a file that no longer
parses, and the identity a process needs to notice that its path moved on."""

import errno
import multiprocessing
import os
import subprocess
import zlib

import pytest

from filterengine import (
    FileIdentity,
    FilterFileError,
    FilterSpaceError,
    ScalingCountingBloomFilter,
    mapping,
)
from filterengine import fileformat as ff

S = ScalingCountingBloomFilter
# fork: each child is a few milliseconds, and the parent holds no lock it could
# inherit (these tests open writers only in the children or after they exit).
fork = multiprocessing.get_context("fork")


def keys(n, tag="k"):
    return [f"https://{tag}{i}.example.com/{i}" for i in range(n)]


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "f.bin")


def temps(path):
    return [n for n in os.listdir(os.path.dirname(path)) if n.endswith(".tmp")]


def no_room(fd, offset, length):
    raise OSError(errno.ENOSPC, "No space left on device")


# -- a full file system, injected ---------------------------------------------------
def test_a_stage_that_does_not_fit_is_refused_and_nothing_changes(path, monkeypatch):
    with S.create(path, capacity=100, error_rate=0.01) as f:
        f.add_many(keys(100), range(100))  # the first stage is full
        reader = S.open(path, readonly=True)
        size = os.path.getsize(path)
        with monkeypatch.context() as m:
            m.setattr(os, "posix_fallocate", no_room)
            with pytest.raises(FilterSpaceError) as err:
                f.add("one-more", 1000)
            with pytest.raises(FilterSpaceError):
                f.add_many(keys(50, "m"), range(50))
            with pytest.raises(FilterSpaceError), f.change():
                f.add_many(keys(50, "m"), range(50))
        message = str(err.value)
        assert path in message and "new stage 1" in message and "bytes free" in message
        assert err.value.path == path and err.value.needed > 0
        assert isinstance(err.value, FilterFileError)  # the service's one except clause
        # Refused before anything moved: same size, same stages, same keys, clean.
        assert os.path.getsize(path) == size
        f.flush()
        assert f.stage_count == 1 and f.count == 100 and f.is_clean
        assert reader.stage_count == 1 and reader.contains_many(keys(100)).all()
        assert not reader.contains_many(keys(50, "m")).any()
        # Room again: the same additions go through.
        f.add_many(keys(50, "m"), range(50))
        assert f.stage_count == 2 and reader.contains_many(keys(50, "m")).all()
        reader.close()
    with S.open(path, readonly=True) as r:
        assert r.is_clean and r.count == 150


def test_a_batch_reserves_every_stage_it_opens_before_it_writes(path, monkeypatch):
    calls = []
    real = os.posix_fallocate

    def spy(fd, offset, length):
        calls.append((offset, length))
        real(fd, offset, length)

    with S.create(path, capacity=100, error_rate=0.01) as f:
        monkeypatch.setattr(os, "posix_fallocate", spy)
        f.add_many(keys(1000), range(1000))  # opens several stages at once
        assert f.stage_count > 3
        # One reservation up front, up to the end of the last stage opened.
        assert len(calls) == 1
        offset, length = calls[0]
        assert offset + length == f._view.stages[-1].end


def test_a_rebuild_that_does_not_fit_leaves_the_old_file_and_no_temp(path, monkeypatch):
    S.build(path, [("old", 1)], capacity=100, error_rate=0.01)
    reader = S.open(path, readonly=True)
    monkeypatch.setattr(os, "posix_fallocate", no_room)
    with pytest.raises(FilterSpaceError, match="new filter file"):
        S.build(path, [("new", 2)], capacity=100, error_rate=0.01)
    assert temps(path) == []
    assert "old" in reader and "new" not in reader and reader.is_clean
    reader.close()


def test_a_rebuild_that_runs_out_while_it_grows_leaves_no_temp(path, monkeypatch):
    S.build(path, [("old", 1)], capacity=100, error_rate=0.01)
    real = os.posix_fallocate

    def first_stage_only(fd, offset, length):
        if offset:
            no_room(fd, offset, length)
        real(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", first_stage_only)
    pairs = [(k, i) for i, k in enumerate(keys(500))]  # more than the first stage
    with pytest.raises(FilterSpaceError, match="new stage"):
        S.build(path, iter(pairs), capacity=100, error_rate=0.01)
    assert temps(path) == []
    with S.open(path, readonly=True) as r:
        assert "old" in r


def test_a_file_system_that_cannot_reserve_still_works(path, monkeypatch):
    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    with S.create(path, capacity=100, error_rate=0.01) as f:
        f.add_many(keys(500), range(500))
        assert f.stage_count > 1
    S.build(path, [("k", 1)], capacity=100, error_rate=0.01)
    with S.open(path, readonly=True) as r:
        assert "k" in r
    monkeypatch.delattr(os, "posix_fallocate")  # a platform without it
    S.build(path, [("k2", 1)], capacity=100, error_rate=0.01)


class _TinyFs:
    f_bavail, f_frsize = 10, 4096


def test_a_rebuild_checks_free_space_before_it_writes(path, monkeypatch):
    S.build(path, [("old", 1)], capacity=100, error_rate=0.01)
    monkeypatch.setattr(os, "statvfs", lambda p: _TinyFs)
    written = []
    monkeypatch.setattr(os, "posix_fallocate", lambda *a: written.append(a))
    pairs = [(k, i) for i, k in enumerate(keys(20_000))]
    with pytest.raises(FilterSpaceError) as err:
        S.build(path, pairs, capacity=20_000, error_rate=0.01)
    assert err.value.free == 40_960 and err.value.needed > 100_000
    assert "rebuild" in str(err.value) and "40,960 bytes free" in str(err.value)
    assert written == []  # refused before a byte was reserved
    assert temps(path) == []


def test_the_next_build_removes_temp_files_of_killed_builds(path, tmp_path):
    S.build(path, [("old", 1)], capacity=100, error_rate=0.01)
    stale = [tmp_path / ".f.bin.abcd1234.tmp", tmp_path / ".f.bin.x_9y8z7w.tmp"]
    kept = [tmp_path / ".f.bin.not-ours.tmp", tmp_path / ".g.bin.abcd1234.tmp", tmp_path / "x.tmp"]
    for p in stale + kept:
        p.write_bytes(b"\0" * 4096)
    S.build(path, [("new", 1)], capacity=100, error_rate=0.01)
    assert not any(p.exists() for p in stale)
    assert all(p.exists() for p in kept)


# -- a full file system, for real ----------------------------------------------------
@pytest.fixture
def tiny_fs(tmp_path):
    """A 3 MB tmpfs, or a skip saying why there cannot be one here."""
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount_point)],
            capture_output=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a 3 MB tmpfs: {exc}")
    if done.returncode:
        pytest.skip(f"cannot mount a 3 MB tmpfs: {done.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=20)


def _fill_the_disk(path):
    """Child: grow a filter until the file system is full, then read it back and
    try a rebuild. A SIGBUS anywhere ends the child with -7."""
    added = 0
    with S.create(path, capacity=20_000, error_rate=0.01) as f:
        try:
            while True:
                f.add_many(keys(5000, f"b{added}-"), range(5000))
                added += 5000
        except FilterSpaceError as exc:
            assert path in str(exc), exc
        f.flush()
        assert f.is_clean and f.count == added and added > 0
    with S.open(path, readonly=True) as r:
        for start in range(0, added, 5000):
            assert r.contains_many(keys(5000, f"b{start}-")).all()
        assert r.contains("https://b0-0.example.com/0")
        assert r.is_clean
    pairs = [(k, i) for i, k in enumerate(keys(200_000))]
    try:
        S.build(path, pairs, capacity=200_000, error_rate=0.01)
    except FilterSpaceError:
        pass
    else:
        raise AssertionError("a rebuild larger than the free space went through")
    leftovers = [n for n in os.listdir(os.path.dirname(path)) if n.endswith(".tmp")]
    assert not leftovers, leftovers
    with S.open(path, readonly=True) as r:
        assert r.contains_many(keys(5000, "b0-")).all()


def test_a_real_full_disk_degrades_instead_of_crashing(tiny_fs):
    child = fork.Process(target=_fill_the_disk, args=(str(tiny_fs / "f.bin"),))
    child.start()
    child.join(60)
    assert child.exitcode == 0, f"exit code {child.exitcode} (-7 is SIGBUS)"


# -- a file truncated under a reader ---------------------------------------------------
def _read_through_truncation(path, ready, truncated, answers):
    with S.open(path, readonly=True) as r:
        answers.put(("before", r.contains("k1") and "k1" in r))
        ready.set()
        truncated.wait(20)
        for attempt in ("contains", "contains_many", "applied_seq"):
            try:
                if attempt == "contains":
                    r.contains("k1")
                elif attempt == "contains_many":
                    r.contains_many(["k1", "k2"])
                else:
                    r.applied_seq  # noqa: B018
            except FilterFileError as exc:
                answers.put((attempt, str(exc)))
            else:
                answers.put((attempt, "answered"))


@pytest.mark.parametrize("keep", [0, ff.DATA_OFFSET // 2, ff.DATA_OFFSET + 4096])
def test_a_reader_survives_a_file_truncated_under_it(path, keep):
    with S.create(path, capacity=5000, error_rate=0.01) as f:
        f.add_many(["k1", "k2"], [1, 2])
    ready, truncated, answers = fork.Event(), fork.Event(), fork.Queue()
    child = fork.Process(target=_read_through_truncation, args=(path, ready, truncated, answers))
    child.start()
    try:
        assert ready.wait(20)
        os.truncate(path, keep)  # what `truncate`, `: >` and a shorter `cp` do
        truncated.set()
        child.join(20)
    finally:
        truncated.set()
    assert child.exitcode == 0, f"exit code {child.exitcode} (-7 is SIGBUS)"
    got = dict(answers.get(timeout=5) for _ in range(4))
    assert got["before"] is True
    for attempt in ("contains", "contains_many", "applied_seq"):
        assert "truncated or overwritten while mapped" in got[attempt], got[attempt]
        assert path in got[attempt] and f"found {keep} bytes" in got[attempt]


def test_every_lookup_checks_the_file_size_with_one_lseek(path, monkeypatch):
    S.create(path, capacity=100, error_rate=0.01).close()
    with S.open(path, readonly=True) as r:
        r.contains("warm")
        calls = []
        real = os.lseek
        monkeypatch.setattr(
            mapping, "_lseek", lambda fd, at, how: calls.append((fd, at, how)) or real(fd, at, how)
        )
        r.contains("x")
        r.contains_many(["x", "y", "z"])
        r.maybe_present(["x", "y", "z"])
        # One look at the size per call (not per key), and no page read for it.
        assert calls == [(r._view.fd, 0, os.SEEK_END)] * 3


def test_maybe_present_is_contains_for_each_key(path):
    with S.create(path, capacity=1000, error_rate=0.01) as f:
        f.add_many(keys(300), range(300))
    with S.open(path, readonly=True) as r:
        probe = keys(300) + keys(300, "absent")
        assert r.maybe_present(probe) == [k for k in probe if r.contains(k)]
        assert r.maybe_present(iter(keys(3))) == keys(3)


_OVERWRITES = (
    lambda path, backup: ["cp", backup, path],  # what restoring a backup looks like
    lambda path, backup: ["truncate", "-s", "0", path],
    lambda path, backup: ["sh", "-c", ': > "$0"', path],
    lambda path, backup: ["truncate", "-s", "-4096", path],
)


def _look_after_each_overwrite(path, commands, answers):
    """A reader process: after each overwrite (done and finished by another process),
    look keys up at once. A lookup that cannot answer raises FilterFileError, and the
    reader opens the path again, as the service's registry does."""
    r = S.open(path, readonly=True)
    answers.put("ready")
    while commands.get(timeout=30) != "stop":
        outcome = []
        for _ in range(2):
            try:
                outcome.append(
                    (
                        bool(r.contains("k1")),
                        len(r.maybe_present(["k1", "k2"])),
                        int(r.contains_many(["k1", "k2"]).sum()),
                    )
                )
            except FilterFileError as exc:
                outcome.append(str(exc).split(": ")[1])
                try:
                    r = S.open(path, readonly=True)
                except FilterFileError as again:
                    outcome.append(f"reopen: {str(again).split(': ')[1]}")
                    break
        answers.put(outcome)


def test_a_reader_survives_twenty_copies_and_truncations_by_another_process(path, tmp_path):
    with S.create(path, capacity=100, error_rate=0.01) as f:
        f.add_many(["k1", "k2"], [1, 2])
    backup = str(tmp_path / "backup.bin")
    subprocess.run(["cp", path, backup], check=True)
    with S.open(path) as f:
        f.add_many(keys(300), range(10, 310))  # new stages: the backup is shorter
    commands, answers = fork.Queue(), fork.Queue()
    child = fork.Process(target=_look_after_each_overwrite, args=(path, commands, answers))
    child.start()
    seen = []
    try:
        assert answers.get(timeout=30) == "ready"
        for event in range(20):
            # The other process has finished before the reader looks: no race.
            subprocess.run(_OVERWRITES[event % 4](path, backup), check=True)
            commands.put(event)
            seen.append(answers.get(timeout=30))
            assert child.is_alive(), f"exit code {child.exitcode} after event {event} (-7: SIGBUS)"
            if event % 4 != 0:
                subprocess.run(["cp", backup, path], check=True)
    finally:
        commands.put("stop")
        child.join(30)
    assert child.exitcode == 0, f"exit code {child.exitcode} (-7 is SIGBUS)"
    # A copy or truncation is noticed before a page is touched; once the file is
    # whole again the reader answers from it (the backup holds k1 and k2).
    for outcome in seen:
        assert outcome[0] == "file size" or outcome[0] == (True, 2, 2), seen
        assert outcome[-1] == (True, 2, 2) or outcome[-1].startswith("reopen: file size"), seen


def test_a_file_copied_over_in_place_is_not_answered_from_as_the_old_one(path, tmp_path):
    with S.create(path, capacity=100, error_rate=0.01) as f:
        f.add("k1", 1)
    other = str(tmp_path / "other.bin")
    S.build(other, [(k, i) for i, k in enumerate(keys(250))], capacity=100, error_rate=0.01)
    with S.open(path, readonly=True) as r:
        assert "k1" in r
        subprocess.run(
            ["dd", f"if={other}", f"of={path}", "conv=notrunc", "status=none"], check=True
        )
        with pytest.raises(FilterFileError, match="copied over this one in place"):
            r.contains("k1")
        with pytest.raises(FilterFileError, match="copied over"):
            r.contains_many(["k1"])


# -- a writer stopped at any store of its state ------------------------------------------
def _operations(f):
    """What the service does to a file: one change that opens new stages, a flush."""
    with f.change():
        f.add_many(keys(250, "c"), range(250))  # capacity 100: two new stages
        f.applied_seq = 7
    f.flush()


def test_a_state_write_cut_at_any_byte_leaves_a_valid_state(path, tmp_path, monkeypatch):
    S.create(path, capacity=100, error_rate=0.01).close()
    writer = S.open(path)
    stores = []
    real = ff._put

    def record(buf, offset, data):
        stores.append((bytes(buf[: ff.DATA_OFFSET]), offset, bytes(data)))
        real(buf, offset, data)

    monkeypatch.setattr(ff, "_put", record)
    _operations(writer)
    monkeypatch.undo()
    writer.close()
    with open(path, "rb") as fh:
        counters = fh.read()[ff.DATA_OFFSET :]
    assert len(stores) >= 8  # begin, two stages (slot + word each), end, flush
    cut_path = str(tmp_path / "cut.bin")
    for number, (head, offset, data) in enumerate(stores):
        before = ff.read_state(head, "before")
        after_head = bytearray(head)
        after_head[offset : offset + len(data)] = data
        after = ff.read_state(after_head, "after")
        for cut in range(len(data) + 1):
            torn = bytearray(head)
            torn[offset : offset + cut] = data[:cut]
            with open(cut_path, "wb") as fh:
                fh.write(bytes(torn) + counters)
            try:
                r = S.open(cut_path, readonly=True)
            except FilterFileError as exc:
                pytest.fail(f"store {number} cut after {cut} of {len(data)} bytes: {exc}")
            with r:
                state = ff.read_state(r._view.buf, cut_path)
                assert state in (before, after), (number, cut)
                if r.is_clean:
                    # Clean only before the change began or after its flush.
                    allowed = {(0, 0), (0, 1), (7, len(stores) - 1)}  # the begin, the flush
                    assert (state.applied_seq, number) in allowed, (
                        number,
                        cut,
                        state,
                    )


def _stop_at_store(path, limit, done):
    count = [0]
    real = ff._put

    def stop(buf, offset, data):
        if count[0] == limit:
            os._exit(3)  # as abrupt as kill -9: no cleanup, no flush
        count[0] += 1
        real(buf, offset, data)

    f = S.open(path)
    ff._put = stop
    _operations(f)
    done.set()
    os._exit(0)


def test_a_writer_killed_at_each_store_leaves_a_readable_file(path):
    S.create(path, capacity=100, error_rate=0.01).close()
    with open(path, "rb") as fh:
        pristine = fh.read()
    stops = 0
    while True:
        with open(path, "wb") as fh:
            fh.write(pristine)
        done = fork.Event()
        child = fork.Process(target=_stop_at_store, args=(path, stops, done))
        child.start()
        child.join(20)
        finished = done.is_set()
        assert child.exitcode == (0 if finished else 3)
        with S.open(path, readonly=True) as r:  # never a FilterFileError
            assert r.applied_seq in (0, 7)
            if r.is_clean:
                # Clean only if stopped before the change began, or not stopped.
                assert (r.applied_seq, r.count) == ((7, 250) if finished else (0, 0))
            if r.applied_seq == 7:
                assert r.contains_many(keys(250, "c")).all()
        with S.open(path, lock_timeout=5) as w:  # the dead writer's lock is gone
            if finished:
                assert w.is_clean and w.count == 250
            elif stops == 0:
                assert w.is_clean and w.count == 0  # stopped before its first store
            else:
                # Stopped mid-change, mid state write or before the flush was
                # recorded: dirty, and it stays dirty (rebuild).
                assert not w.is_clean
                w.add("x", 1)
                w.flush()
                assert not w.is_clean
        if finished:
            break
        stops += 1
    assert stops >= 8


# -- a rebuild over a file that no longer parses ---------------------------------------------
def _corrupt_magic(path):
    with open(path, "r+b") as fh:
        fh.write(b"XX")


def _corrupt_both_slots(path):
    with open(path, "r+b") as fh:
        for at in ff.SLOT_OFFSETS:
            fh.seek(at + 8)
            fh.write(b"\xff")


def _other_version(path):
    with open(path, "r+b") as fh:
        head = bytearray(fh.read(ff.FIXED_SIZE))
        head[8:10] = (ff.VERSION - 1).to_bytes(2, "little")
        head[120:124] = zlib.crc32(head[:120]).to_bytes(4, "little")
        fh.seek(0)
        fh.write(head)


@pytest.mark.parametrize("damage", [_corrupt_magic, _corrupt_both_slots, _other_version])
def test_build_supersedes_a_file_it_cannot_parse(path, damage):
    S.build(path, [("old", 1)], capacity=100, error_rate=0.01)
    reader = S.open(path, readonly=True)
    assert "old" in reader
    damage(path)  # in place, under the reader (an operator's or a disk's doing)
    with pytest.raises(FilterFileError):
        S.open(path, readonly=True)
    S.build(path, [("fresh", 2)], capacity=100, error_rate=0.01)
    assert "fresh" in reader and "old" not in reader  # followed at its next answer
    reader.close()


def test_build_does_not_write_into_a_symlinked_path(path, tmp_path):
    target = tmp_path / "elsewhere.bin"
    S.build(str(target), [("old", 1)], capacity=100, error_rate=0.01)
    before = target.read_bytes()
    os.symlink(target, path)
    S.build(path, [("fresh", 2)], capacity=100, error_rate=0.01)
    assert target.read_bytes() == before  # replaced the link, not its target
    assert not os.path.islink(path)


# -- identity --------------------------------------------------------------------------------
def test_file_identity_names_the_mapped_file(path):
    S.create(path, capacity=100, error_rate=0.01).close()
    r = S.open(path, readonly=True)
    st = os.stat(path)
    identity = r.file_identity
    assert isinstance(identity, FileIdentity)
    assert identity == (st.st_dev, st.st_ino, r.generation)
    assert r.is_file_at_path()
    S.build(path, [("k", 1)], capacity=100, error_rate=0.01)
    # A build is followed by the reader itself: the identity is the new file's.
    assert r.file_identity.ino == os.stat(path).st_ino and r.is_file_at_path()
    assert r.file_identity.generation > identity.generation
    os.unlink(path)
    assert not r.is_file_at_path()
    S.create(path, capacity=100, error_rate=0.01).close()
    # A removed file is not followed: the registry compares and reopens.
    assert not r.is_file_at_path()
    assert r.file_identity.ino != os.stat(path).st_ino
    r.close()
    with pytest.raises(ValueError, match="closed"):
        r.file_identity  # noqa: B018


def _write_after_truncation(path, answers):
    w = S.open(path)
    w.add("k1", 1)
    w.flush()
    subprocess.run(["truncate", "-s", "0", path], check=True)
    for name, write in (
        ("add", lambda: w.add("k2", 2)),
        ("remove", lambda: w.remove("k1", 1)),
        ("flush", w.flush),
        ("close", w.close),
    ):
        try:
            write()
        except FilterFileError as exc:
            answers.put((name, str(exc)))
        else:
            answers.put((name, "written"))
    answers.put(("closed", repr(w)))


def test_a_writer_refuses_to_write_into_a_file_truncated_by_another_process(path):
    S.create(path, capacity=100, error_rate=0.01).close()
    answers = fork.Queue()
    child = fork.Process(target=_write_after_truncation, args=(path, answers))
    child.start()
    child.join(30)
    assert child.exitcode == 0, f"exit code {child.exitcode} (-7 is SIGBUS)"
    got = dict(answers.get(timeout=5) for _ in range(5))
    for name in ("add", "remove", "flush", "close"):
        assert "truncated or overwritten while mapped" in got[name], got
    assert got["closed"].endswith("closed>")  # and its lock released


def test_an_older_copy_of_the_same_file_copied_over_it_is_refused(path, tmp_path):
    """A backup of this very file (same generation, same stages) put back with `cp`
    by another process: its state slots are older than the reader has seen."""
    backup = str(tmp_path / "backup.bin")
    with S.create(path, capacity=1000, error_rate=0.01) as w:
        w.add("k1", 1)
    with S.open(path, readonly=True) as r:
        assert "k1" in r and "k2" not in r
        subprocess.run(["cp", path, backup], check=True)
        with S.open(path) as w:
            w.add("k2", 2)
        assert r.maybe_present(["k1", "k2"]) == ["k1", "k2"]  # a writer's moves are fine
        subprocess.run(["cp", backup, path], check=True)
        for lookup in (lambda: r.contains("k2"), lambda: r.maybe_present(["k2"])):
            with pytest.raises(FilterFileError, match="copied over this one in place"):
                lookup()
