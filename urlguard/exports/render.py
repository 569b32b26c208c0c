"""Renders an export to a file under <DATA_DIR>/exports/<name>/, named by the position
it projects, and keeps the last EXPORT_KEEP_VERSIONS of them within EXPORT_KEEP_BYTES:
a thousand consumers polling one position cost one render, each served by streaming
the file. A render is written aside and renamed into place (a reader never sees half
a file); one process renders a given export at a time (a lock file), the others wait
for it. Old renders are pruned before a render as well as after it; a render short of
room (for itself and a rebuild of the filter file on the same file system), or that
the disk has no room for, prunes every list down to its newest (and in the second case
tries once more), so a full data directory frees itself instead of failing every
render, and the filter's rebuild, from then on. The temp files of a render or patch
killed while writing (an RPZ render is tens of MB) and the sidecars of renders that
never completed are removed by the next render's prune."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from filterengine.atomicfile import remove_stale_temps_in, write_aside
from urlguard.conf import conf
from urlguard.exports.base import Export, RenderCounts
from urlguard.exports.projection import Position, snapshot
from urlguard.runtime.ratelimitedlog import RateLimitedLog

__all__ = [
    "RenderBusy",
    "Rendered",
    "export_dir",
    "newest",
    "prune",
    "render",
    "render_kept",
    "render_lock",
    "rendered",
    "write_aside",
]

#: A render waits this long for another process's render of the same export.
LOCK_TIMEOUT = 600.0
#: A request for a pre-rendered export of which the node keeps no render yet waits
#: this long for the first (a small list is done by then), then gets a 503.
COLD_WAIT = 5.0
#: Renders retried when changes keep committing under one (no snapshot isolation).
ATTEMPTS = 5
#: A temp file not written to for this long is of a writer that died: a live render
#: or patch keeps writing to its own (and renders are under the lock besides).
STALE_TEMP_AGE = 600.0
_NAME = re.compile(r"(\d+)-([0-9a-f]{8})\.txt")
_SIDECAR = re.compile(r"(\d+-[0-9a-f]{8})\.json")
#: A file system with no room (or a quota reached): pruning can help.
NO_ROOM = (errno.ENOSPC, errno.EDQUOT)

logger = logging.getLogger(__name__)
# A full disk is met by every round of every export: said once a minute.
_log = RateLimitedLog(logger, suppressed="more renders met it since the last such line")


class RenderBusy(RuntimeError):
    """The list kept changing under every attempt, or another render held the lock."""


@dataclass(frozen=True)
class Rendered:
    path: Path
    position: Position


def export_dir(name: str) -> Path:
    return Path(conf.DATA_DIR) / "exports" / name


def rendered_path(name: str, key: str) -> Path:
    return export_dir(name) / f"{key}.txt"


@contextlib.contextmanager
def render_lock(directory: Path, *, wait: bool) -> Iterator[bool]:
    """Hold the export's render lock; yields False at once if another process holds
    it and `wait` is False."""
    fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + LOCK_TIMEOUT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not wait:
                    yield False
                    return
                if time.monotonic() > deadline:
                    raise RenderBusy(f"another process is rendering {directory.name}") from None
                time.sleep(0.05)
        yield True
    finally:
        os.close(fd)


def rendered(
    export: Export, position: Position, *, ask_prerender: Callable[[], None] | None = None
) -> Rendered:
    """The file of `export` at `position`. The result may be of a later position (a
    change committed meanwhile) or, for a request (which passes `ask_prerender`), of
    an earlier one.

    An export the node pre-renders (EXPORTS_PRERENDER) is never rendered in a request:
    the pre-render (urlguard.exports.prerender) is asked for this position and the
    request is served the newest render kept (its own position, ETag and Last-Modified
    in its headers: right for its content); the poll after the pre-render gets the new
    one. A node that keeps no render of it yet (a fresh data directory) waits up to
    COLD_WAIT for the first, then RenderBusy (503, Retry-After). Any other export is
    rendered by the first request for the position; requests meanwhile get the
    newest render kept, or wait for that one when there is none."""
    path = rendered_path(export.name, position.key)
    if path.exists():
        return Rendered(path, position)
    directory = export_dir(export.name)
    # Owner only, like the rest of the data directory.
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    stale = newest(directory)
    if ask_prerender is not None and export.name in conf.EXPORTS_PRERENDER:
        ask_prerender()
        deadline = time.monotonic() + (0.0 if stale is not None else COLD_WAIT)
        while True:
            if path.exists():  # rendered meanwhile (or by an inline pre-render)
                return Rendered(path, position)
            kept = stale or newest(directory)
            if kept is not None:
                return kept
            if time.monotonic() >= deadline:
                raise RenderBusy(f"the first render of {export.name} on this node is under way")
            time.sleep(0.05)
    with render_lock(directory, wait=ask_prerender is None or stale is None) as mine:
        if not mine and stale is not None:
            return stale
        if path.exists():
            return Rendered(path, position)
        try:
            return render_kept(export, directory)
        except OSError as exc:
            if ask_prerender is None:
                raise  # the pre-render's round: it reports the failure
            # A request for a list rendered on demand: the render it would have
            # waited for failed; the newest one kept says its own position.
            if stale is None:
                raise RenderBusy(f"rendering {export.name} failed: {exc}") from exc
            _log(
                "stale",
                logging.WARNING,
                "rendering %s failed (%s): serving its render at position %d",
                export.name,
                exc,
                stale.position.seq,
            )
            return stale


def render_kept(export: Export, directory: Path) -> Rendered:
    """Render `export` within the bounds kept (the caller holds its lock): room made
    first, and once more, down to each list's newest render, when the disk has none."""
    keep, keep_bytes = conf.EXPORT_KEEP_VERSIONS, conf.EXPORT_KEEP_BYTES
    newest_kept = newest(directory)
    # The next render is about the size of the last one.
    expected = _size(newest_kept.path) if newest_kept is not None else 0
    prune(directory, keep=keep - 1, keep_bytes=keep_bytes - expected)
    free, needed = _free_bytes(directory), _room_needed(directory, expected)
    if free is not None and free < needed:
        _log(
            "room",
            logging.WARNING,
            "%d bytes free in %s, under the %d a render of %s and a rebuild of the filter "
            "file need: keeping only the newest render of each list",
            free,
            directory,
            needed,
            export.name,
        )
        _keep_newest_only(directory)
    try:
        result = render(export, directory)
    except OSError as exc:
        if exc.errno not in NO_ROOM:
            raise
        _log(
            "full",
            logging.WARNING,
            "no room to render %s in %s (%s): keeping only the newest render of each list "
            "and trying again",
            export.name,
            directory,
            exc.strerror,
        )
        _keep_newest_only(directory)
        result = render(export, directory)
    prune(directory, keep=keep, keep_bytes=keep_bytes)
    return result


def _keep_newest_only(directory: Path) -> None:
    """Prune `directory` (its lock held) and then every other list's renders beside it
    down to their newest: the biggest list must not starve while the smaller ones
    keep old renders. A list another process renders now is left alone (its lock)."""
    prune(directory, keep=1, keep_bytes=0)
    for other in sorted(directory.parent.iterdir()):
        if other == directory or not other.is_dir():
            continue
        with render_lock(other, wait=False) as mine:
            if mine:
                prune(other, keep=1, keep_bytes=0)


def newest(directory: Path) -> Rendered | None:
    """The newest render kept in `directory`, with the position its sidecar names."""
    for key in reversed(kept_keys(directory)):
        try:
            meta = json.loads((directory / f"{key}.json").read_text())
            position = Position(
                seq=int(meta["seq"]),
                time=datetime.fromisoformat(meta["time"]),
                allowlist=tuple(meta["allowlist"]),
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if position.key == key:
            return Rendered(directory / f"{key}.txt", position)
    return None


def render(export: Export, directory: Path) -> Rendered:
    """Project the current rules through `export` into `directory`."""
    for _attempt in range(ATTEMPTS):
        with snapshot() as snap:
            target = rendered_path(export.name, snap.position.key)
            if target.exists():
                return Rendered(target, snap.position)
            export.prepare(snap)
            counts = RenderCounts()
            with tempfile.TemporaryFile(dir=directory) as body:
                for line in export.exception_lines(snap):
                    body.write(line.encode() + b"\n")
                    counts.exceptions += 1
                for expression, category in snap.rules():
                    counts.rules += 1
                    lines = export.rule_lines(expression, category)
                    if isinstance(lines, str):
                        counts.omitted[lines] += 1
                        continue
                    counts.written += 1
                    body.write("".join(line + "\n" for line in lines).encode())
                if not snap.consistent():
                    continue
                _write(target, export, snap.position, counts, body)
                return Rendered(target, snap.position)
    raise RenderBusy(f"the list changed under {ATTEMPTS} renders of {export.name} in a row")


def _write(target: Path, export: Export, position: Position, counts: RenderCounts, body) -> None:
    head = [*export.preamble(position), *export.header(position, counts)]
    meta = {"seq": position.seq, "time": position.time.isoformat(), "allowlist": position.allowlist}
    sidecar = target.with_suffix(".json")
    write_aside(sidecar, [json.dumps(meta).encode()])

    def chunks() -> Iterator[bytes]:
        yield "".join(line + "\n" for line in head).encode()
        body.seek(0)
        yield from iter(lambda: body.read(1 << 20), b"")

    try:
        write_aside(target, chunks())
    except BaseException:
        # A sidecar names a render; without one it is litter (a kill here leaves it
        # to prune).
        with contextlib.suppress(FileNotFoundError):
            sidecar.unlink()
        raise


def kept_keys(directory: Path) -> list[str]:
    """Keys of the renders in `directory`, oldest first."""
    found = []
    for entry in directory.glob("*.txt"):
        match = _NAME.fullmatch(entry.name)
        if match:
            with contextlib.suppress(FileNotFoundError):
                found.append((int(match.group(1)), entry.stat().st_mtime, entry.name[:-4]))
    return [key for _, _, key in sorted(found)]


def _free_bytes(directory: Path) -> int | None:
    try:
        found = os.statvfs(directory)
    except OSError:
        return None
    return found.f_bavail * found.f_frsize


def _room_needed(directory: Path, expected: int) -> int:
    """Free bytes a render of about `expected` bytes should find: its body aside, then
    the file; and, where the filter file shares the file system, room for a rebuild to
    write its new one beside it (renders must not be what makes the filter fail)."""
    needed = 2 * expected
    try:
        filter_file = os.stat(conf.FILTER_PATH)
        if filter_file.st_dev == os.stat(directory).st_dev:
            needed += filter_file.st_size
    except OSError:
        pass
    return needed


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def prune(directory: Path, *, keep: int, keep_bytes: int) -> None:
    """Keep the newest renders, at most `keep` of them and, beyond the newest (kept
    whatever its size: it is what a poller is served), only as many as fit in
    `keep_bytes` with it. Remove the rest, patches from removed ones (a reader
    streaming one keeps its open file), sidecars whose render never completed, and
    temp files of writes that died. Called under the export's render lock."""
    remove_stale_temps_in(directory, older_than=STALE_TEMP_AGE)
    keys = kept_keys(directory)
    kept: list[str] = []
    used = 0
    for key in reversed(keys):
        size = _size(directory / f"{key}.txt") + _size(directory / f"{key}.json")
        if kept and (len(kept) >= keep or used + size > keep_bytes):
            break
        kept.append(key)
        used += size
    for key in keys[: len(keys) - len(kept)]:
        for suffix in (".txt", ".json"):
            with contextlib.suppress(FileNotFoundError):
                (directory / f"{key}{suffix}").unlink()
    for sidecar in directory.glob("*.json"):
        match = _SIDECAR.fullmatch(sidecar.name)
        if match and not (directory / f"{match.group(1)}.txt").exists():
            with contextlib.suppress(FileNotFoundError):
                sidecar.unlink()
    for patch in directory.glob("*.patch"):
        if patch.name.split("_", 1)[0] not in kept:
            with contextlib.suppress(FileNotFoundError):
                patch.unlink()
