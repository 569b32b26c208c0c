"""RCS-format differences (urlguard.exports.rcs): the patch between two renders of a
list turns the old one into the new one exactly, and `apply` reads patches as GNU
`diff -n` writes them (what filter-list clients apply)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from urlguard.exports import rcs

# A render: a few header lines, then rule lines in one fixed order.
headers = st.lists(st.sampled_from(["! v1", "! v2", "! Title", "! n=3", "! n=4"]), max_size=3)
rules = st.sets(st.integers(0, 60)).map(lambda s: [f"||r{n:02d}.example^" for n in sorted(s)])


def write(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return path


@given(old_head=headers, old=rules, new_head=headers, new=rules)
@example(old_head=[], old=[], new_head=[], new=[])
@example(old_head=["! v1"], old=["||a^"], new_head=["! v2"], new=[])
@example(old_head=["! v1", "! v2"], old=[], new_head=["! v2", "! v1"], new=[])
def test_patch_turns_old_into_new(tmp_path_factory, old_head, old, new_head, new):
    tmp_path = tmp_path_factory.mktemp("rcs")
    before = old_head + old
    after = new_head + new
    patch = b"".join(rcs.diff(write(tmp_path, "a", before), write(tmp_path, "b", after)))
    assert rcs.apply(before, patch.decode()) == after


@given(old=st.lists(st.sampled_from("abcdef")), new=st.lists(st.sampled_from("abcdef")))
@example(old=["x", "y"], new=["y", "x"])
@example(old=["x", "x", "y"], new=["y", "x", "x"])
def test_any_two_files_even_reordered_or_repeating(tmp_path_factory, old, new):
    tmp_path = tmp_path_factory.mktemp("any")
    patch = b"".join(rcs.diff(write(tmp_path, "a", old), write(tmp_path, "b", new)))
    assert rcs.apply(old, patch.decode()) == new


@pytest.mark.skipif(shutil.which("diff") is None, reason="GNU diff is not installed")
@given(
    old=st.lists(st.sampled_from("abcdef"), max_size=12),
    new=st.lists(st.sampled_from("abcdef"), max_size=12),
)
def test_apply_reads_gnu_diff_n(tmp_path_factory, old, new):
    tmp_path = tmp_path_factory.mktemp("gnu")
    run = subprocess.run(
        ["diff", "-n", write(tmp_path, "a", old), write(tmp_path, "b", new)],
        capture_output=True,
        text=True,
    )
    assert rcs.apply(old, run.stdout) == new
