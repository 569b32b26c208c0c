"""What the exports' renders take on disk: at most EXPORT_KEEP_VERSIONS renders of an
export within EXPORT_KEEP_BYTES (the newest kept whatever its size), old ones pruned
before a render as well as after, a render on a full file system (a real tmpfs)
making its own room, and no sidecar left by a render that failed."""

from __future__ import annotations

import errno
import os

import pytest
from django.test import Client

from tests.support.faults import fail_on_call
from tests.support.fullfs import fill, small_filesystem  # noqa: F401  (a fixture)
from urlguard.exports import prerender, render
from urlguard.exports.projection import current_position
from urlguard.nodesync import sync
from urlguard.writepath.changes import add_rule, add_rules

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def exports_only(monkeypatch):
    """The round's other projections (the Safe Browsing lists) keep files of their own
    in DATA_DIR, which these bounds are not about."""
    monkeypatch.setattr(prerender, "AFTER_RENDERS", [])


def keep(settings, **values) -> None:
    settings.URLGUARD = {**settings.URLGUARD, "EXPORTS_PRERENDER": ["hosts.txt"], **values}


def renders(name: str = "hosts.txt") -> list[str]:
    return render.kept_keys(render.export_dir(name))


def render_position(n: int) -> render.Rendered:
    add_rule(f"n{n}.example/", category="spam", source="test")
    (done,) = prerender.render_all()
    return done


def test_renders_kept_are_bounded_by_bytes_as_well_as_by_count(settings):
    add_rules([f"host{i}.example/" for i in range(200)], source="test")
    keep(settings, EXPORT_KEEP_VERSIONS=20)
    size = render_position(0).path.stat().st_size
    # Three renders (and their small sidecars) fit, a fourth does not.
    keep(settings, EXPORT_KEEP_VERSIONS=20, EXPORT_KEEP_BYTES=3 * size + 1000)
    for n in range(1, 7):
        newest = render_position(n)
    directory = render.export_dir("hosts.txt")
    kept = renders()
    assert len(kept) == 3 and kept[-1] == newest.position.key
    used = sum(f.stat().st_size for f in directory.iterdir() if not f.name.startswith("."))
    assert used <= 3 * size + 1000


def test_the_newest_render_is_kept_whatever_its_size(settings):
    keep(settings, EXPORT_KEEP_BYTES=0)
    for n in range(3):
        newest = render_position(n)
    assert renders() == [newest.position.key]
    assert render.newest(render.export_dir("hosts.txt")) == newest


def test_old_renders_are_pruned_before_a_render_not_only_after_a_successful_one(
    settings, monkeypatch
):
    """A render that fails (the disk, the database) still leaves the bound held."""
    keep(settings, EXPORT_KEEP_VERSIONS=3)
    for n in range(3):
        render_position(n)
    add_rule("failing.example/", category="spam", source="test")
    monkeypatch.setattr(render, "render", lambda *a: (_ for _ in ()).throw(OSError("broken")))
    with pytest.raises(prerender.PrerenderFailed, match="hosts.txt: OSError: broken"):
        prerender.render_all()
    assert len(renders()) == 2  # room made for the one that failed


def test_a_render_on_a_full_file_system_makes_its_own_room(
    settings,
    small_filesystem,  # noqa: F811  (the imported fixture)
):
    """The data directory on a real tmpfs filled to the last byte: the render meets
    ENOSPC, keeps only the newest render and succeeds, instead of failing every round
    from then on while old renders hold the space."""
    data = small_filesystem(512 * 1024)
    keep(settings, DATA_DIR=str(data), EXPORT_KEEP_VERSIONS=20, EXPORT_KEEP_BYTES=10**12)
    add_rules([f"host{i}.example/" for i in range(2000)], source="test")
    for n in range(4):
        render_position(n)
    assert len(renders()) == 4
    fill(data)
    newest = render_position(4)
    assert newest.position == current_position()
    assert newest.path.read_text().count("0.0.0.0 ") == 2005
    # Only the render served until then was kept beside the new one.
    assert len(renders()) == 2
    # And the room it made is free for the node's other files.
    (data / "ballast").unlink()


def test_a_failed_render_leaves_no_sidecar_and_a_killed_one_is_pruned(settings, monkeypatch):
    keep(settings)
    render_position(0)
    directory = render.export_dir("hosts.txt")
    add_rule("one.example/", category="spam", source="test")
    # The sidecar is written, then the render itself fails (a disk error: no retry).
    fail_on_call(monkeypatch, render, "write_aside", 2, OSError(errno.EIO, "I/O error"))
    with pytest.raises(prerender.PrerenderFailed, match="I/O error"):
        prerender.render_all()
    assert sorted(p.name for p in directory.glob("*.json")) == [f"{renders()[0]}.json"]
    # A process killed between the two writes leaves one: the next render prunes it.
    (directory / "7-0123abcd.json").write_text("{}")
    monkeypatch.undo()
    keep(settings)
    render_position(1)
    assert sorted(p.stem for p in directory.glob("*.json")) == renders()


def test_a_list_rendered_on_demand_whose_render_fails_serves_the_newest_kept(
    settings, monkeypatch, prerender_requests
):
    keep(settings, EXPORTS_OPEN=True, EXPORTS_PRERENDER=[])
    client = Client()
    add_rule("old.example/", category="spam", source="test")
    first = client.get("/lists/domains.txt")
    assert first.status_code == 200
    b"".join(first.streaming_content)
    add_rule("new.example/", category="spam", source="test")
    monkeypatch.setattr(render, "render", lambda *a: (_ for _ in ()).throw(OSError("disk")))
    stale = client.get("/lists/domains.txt")
    assert stale.status_code == 200
    assert stale["X-URLGuard-Position"] == first["X-URLGuard-Position"]
    assert b"new.example" not in b"".join(stale.streaming_content)
    # With no render kept there is nothing to serve: 503, never a traceback.
    nothing = client.get("/lists/hosts.txt")
    assert nothing.status_code == 503 and nothing["Retry-After"] == "30"
    assert "rendering hosts.txt failed: disk" in nothing.content.decode()


def test_renders_leave_room_for_a_rebuild_of_the_filter_on_their_file_system(
    settings,
    small_filesystem,  # noqa: F811  (the imported fixture)
):
    """Renders kept by count and bytes alone would fill a small data directory to
    the brim, and a rebuild of the filter file there would then fail: before each
    render the list keeps only its newest when the render and a rebuild would not
    both fit."""
    data = small_filesystem(1024 * 1024)
    filter_file = data / "filter.bin"
    keep(
        settings,
        DATA_DIR=str(data),
        FILTER_PATH=str(filter_file),
        FILTER_CAPACITY=7500,
        EXPORT_KEEP_VERSIONS=20,
        EXPORT_KEEP_BYTES=10**12,
    )
    add_rules([f"host{i}.example/" for i in range(2000)], source="test")
    sync.rebuild(str(filter_file))
    for n in range(15):
        render_position(n)
        free = os.statvfs(data).f_bavail * os.statvfs(data).f_frsize
        assert free >= filter_file.stat().st_size, f"after render {n}"
    sync.rebuild(str(filter_file))  # no FilterSpaceError
    assert 1 < len(renders()) < 15


def test_the_biggest_list_is_not_starved_by_old_renders_of_the_smaller_ones(
    settings,
    small_filesystem,  # noqa: F811  (the imported fixture)
):
    """Each list pruning only its own renders let the smaller lists keep old ones
    until the biggest (RPZ) could never be rendered again: a list short of room
    prunes the others down to their newest too."""
    data = small_filesystem(1024 * 1024)
    keep(
        settings,
        DATA_DIR=str(data),
        EXPORTS_PRERENDER=["hosts.txt", "domains.txt", "rpz.zone"],
        EXPORT_KEEP_VERSIONS=20,
        EXPORT_KEEP_BYTES=10**12,
    )
    add_rules([f"host{i}.example/" for i in range(2000)], source="test")
    for n in range(15):
        add_rule(f"n{n}.example/", category="spam", source="test")
        done = prerender.render_all()  # no PrerenderFailed
        assert {r.position for r in done} == {current_position()}, f"round {n}"
