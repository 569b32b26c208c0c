"""Files written whole (atomicfile.replacing, write_aside): a reader sees the old file
or the whole new one; a writer SIGKILLed mid-write leaves a temp file that
remove_stale_temps(_in) find and remove once it is old, while a live writer's is kept."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from filterengine.atomicfile import (
    remove_stale_temps,
    remove_stale_temps_in,
    replacing,
    write_aside,
)

WRITER = """
import sys, time
from filterengine.atomicfile import write_aside

def chunks():
    yield b"x" * 4096
    print("writing", flush=True)
    time.sleep(60)
    yield b"never"

write_aside(sys.argv[1], chunks())
"""


@pytest.fixture
def here(tmp_path):
    """A directory of this test's own (tmp_path holds the conftest's var/)."""
    directory = tmp_path / "here"
    directory.mkdir()
    return directory


def _age(path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_write_aside_replaces_whole_and_leaves_no_temp(here):
    target = here / "list.txt"
    target.write_bytes(b"old\n")
    write_aside(target, [b"new ", b"list\n"])
    assert target.read_bytes() == b"new list\n"
    assert os.listdir(here) == ["list.txt"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temp(here):
    target = here / "memo.npz"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), replacing(target) as out:
        out.write(b"half")
        raise RuntimeError("disk full")
    assert target.read_bytes() == b"old"
    assert os.listdir(here) == ["memo.npz"]


def test_a_killed_writers_temp_is_removed_once_stale_and_a_live_ones_kept(here):
    target = here / "12-0123abcd.txt"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(target)], stdout=subprocess.PIPE, cwd=os.getcwd()
    )
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline() == b"writing\n"
    finally:
        writer.kill()  # SIGKILL: no except or finally of the writer runs
        writer.wait()
        if writer.stdout is not None:
            writer.stdout.close()
    (killed,) = here.iterdir()
    assert killed.name.startswith(".12-0123abcd.txt.") and not target.exists()
    # Another file's write under way in another process (recently written to), and
    # files that are not temp files at all.
    live = here / ".13-4567cdef.txt.abcd_123.tmp"
    live.write_bytes(b"y")
    (here / ".lock").touch()
    (here / "11-89abcdef.txt").touch()

    assert remove_stale_temps_in(here, older_than=600) == []  # all recent yet
    _age(killed, 601)
    assert remove_stale_temps_in(here, older_than=600) == [str(killed)]
    assert sorted(p.name for p in here.iterdir()) == [
        ".13-4567cdef.txt.abcd_123.tmp",
        ".lock",
        "11-89abcdef.txt",
    ]


def test_remove_stale_temps_of_one_path_honours_the_age(here):
    target = here / "source-3.memo.npz"
    old = here / ".source-3.memo.npz.0ld_0ld0.tmp"
    new = here / ".source-3.memo.npz.n3wn3wn3.tmp"
    other = here / ".source-4.memo.npz.0ld_0ld0.tmp"
    for path in (old, new, other):
        path.write_bytes(b"z")
        _age(path, 3600 if path is not new else 0)
    assert remove_stale_temps(target, older_than=600) == [str(old)]
    assert new.exists() and other.exists()
    assert sorted(remove_stale_temps(target)) == [str(new)]  # no bound: under the lock
