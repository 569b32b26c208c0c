"""The threat lists at one change-log position, as files under
<DATA_DIR>/safebrowsing/: for each list its 4-byte prefixes (the first bytes of the
SHA-256 of each rule's expression) sorted and without repeats, as big-endian
integers so that their order is the bytes' order the protocol sorts by; and, for the
newest positions, every rule's prefix beside its rule id and full hash, which
fullHashes:find searches memory-mapped (one copy in the page cache for every worker).
Written aside and renamed into place."""

from __future__ import annotations

import contextlib
import hashlib
import io
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from django.db import router

from filterengine.atomicfile import remove_stale_temps_in, write_aside
from urlguard.conf import conf
from urlguard.exports.projection import snapshot
from urlguard.exports.render import RenderBusy, render_lock
from urlguard.models import ChangeEvent, SpamRule
from urlguard.safebrowsing.recent import Recent
from urlguard.safebrowsing.threatlists import LISTS, list_of_category

__all__ = [
    "ListsAt",
    "LookupMissing",
    "PrepareBusy",
    "checksum",
    "kept_positions",
    "load",
    "lookup",
    "newest_lookup",
    "prefix_of",
    "prepare",
    "store_dir",
]

_NAME = re.compile(r"(\d+)\.prefixes\.npz")
#: Positions whose rule-id lookup is kept (only the newest is searched).
LOOKUPS_KEPT = 2
#: Attempts at a consistent read where the database gives no snapshot.
ATTEMPTS = 5
STALE_TEMP_AGE = 600.0


class PrepareBusy(RenderBusy):
    """The list kept changing under every read."""


class LookupMissing(FileNotFoundError):
    """No kept position has its full-hash lookup (removed, or never written)."""


def prefix_of(expression: str) -> int:
    """The rule's 4-byte prefix as a big-endian integer."""
    return int.from_bytes(hashlib.sha256(expression.encode()).digest()[:4], "big")


def checksum(prefixes: np.ndarray) -> bytes:
    """SHA-256 of the sorted prefixes' bytes: what a client computes of its copy."""
    return hashlib.sha256(prefixes.astype(">u4").tobytes()).digest()


def store_dir() -> Path:
    return Path(conf.DATA_DIR) / "safebrowsing"


#: What names one written file: its path, inode and modification time. A position's
#: files are written once, but a database restored or replaced numbers positions
#: anew: what is cached of a file is cached under its stamp, never its position.
Stamp = tuple[str, int, int]


def _stamp(path: Path) -> Stamp:
    status = path.stat()
    return str(path), status.st_ino, status.st_mtime_ns


@dataclass(frozen=True)
class ListsAt:
    """The lists at change-log position `seq`, read from the file `stamp` names."""

    seq: int
    prefixes: dict[str, np.ndarray]
    stamp: Stamp

    def checksum(self, name: str) -> bytes:
        return _checksum_cached(self.stamp, name, self.prefixes[name])


_checksums: Recent[tuple[Stamp, str], bytes] = Recent(32)
#: Guards the newest lookup's cache: a threaded worker's requests share it.
_cache_lock = threading.Lock()


def _checksum_cached(stamp: Stamp, name: str, prefixes: np.ndarray) -> bytes:
    found = _checksums.get((stamp, name))
    return found if found is not None else _checksums.put((stamp, name), checksum(prefixes))


def _prefixes_path(seq: int) -> Path:
    return store_dir() / f"{seq}.prefixes.npz"


#: The arrays of a lookup, per list: prefixes sorted, and aligned with them each
#: rule's id and full hash (32 bytes).
LOOKUP_PARTS = ("prefixes", "ids", "hashes")


def _lookup_path(seq: int, name: str, part: str) -> Path:
    return store_dir() / f"{seq}.lookup.{name}.{part}.npy"


def kept_positions() -> list[int]:
    """Positions kept, the one written first first: after a database restored to an
    earlier position, the lists of its positions are the newest however they are
    numbered."""
    directory = store_dir()
    if not directory.exists():
        return []
    found = []
    for entry in directory.glob("*.prefixes.npz"):
        match = _NAME.fullmatch(entry.name)
        if match:
            with contextlib.suppress(FileNotFoundError):
                found.append((entry.stat().st_mtime_ns, int(match.group(1))))
    return [seq for _, seq in sorted(found)]


_loaded: Recent[Stamp, dict[str, np.ndarray]] = Recent(4)


def load(seq: int) -> ListsAt | None:
    """The lists kept at `seq`, or None (never prepared, or pruned); kept in this
    process while the file is the same."""
    path = _prefixes_path(seq)
    try:
        stamp = _stamp(path)
        arrays = _loaded.get(stamp)
        if arrays is None:
            with np.load(path) as data:
                arrays = _loaded.put(stamp, {name: data[name] for name in LISTS})
    except (FileNotFoundError, ValueError, OSError, KeyError):
        return None
    return ListsAt(seq, arrays, stamp)


_newest: dict[str, tuple[int, dict[str, np.ndarray] | None]] = {}


def newest_lookup() -> dict[str, np.ndarray] | None:
    """The newest kept position's lookup: what fullHashes:find searches (a client
    holds prefixes of a kept position), found without asking the database, and
    without listing the folder while nothing in it changed (its time moves with every
    file written, renamed or removed, and it has not for a second)."""
    directory = store_dir()
    try:
        changed = directory.stat().st_mtime_ns
    except OSError:
        return None
    with _cache_lock:
        cached = _newest.get(str(directory))
    # A folder changed within the last second may change again within its time's tick.
    settled = time.time_ns() - changed > 1_000_000_000
    if cached is not None and cached[0] == changed and cached[1] is not None and settled:
        return cached[1]
    found = None
    for seq in reversed(kept_positions()):
        found = lookup(seq)
        if found is not None:
            break
    with _cache_lock:
        _newest.clear()
        _newest[str(directory)] = (changed, found)
    return found


_lookups: Recent[Stamp, dict[str, np.ndarray]] = Recent(LOOKUPS_KEPT)


def lookup(seq: int) -> dict[str, np.ndarray] | None:
    """`seq`'s lookup arrays ("<list>.prefixes", "<list>.ids", "<list>.hashes"),
    memory-mapped, or None. They are written before the position's prefixes file,
    whose stamp names them in this process's cache."""
    try:
        stamp = _stamp(_prefixes_path(seq))
    except OSError:
        return None
    found = _lookups.get(stamp)
    if found is not None:
        return found
    try:
        found = {
            f"{name}.{part}": np.load(_lookup_path(seq, name, part), mmap_mode="r")
            for name in LISTS
            for part in LOOKUP_PARTS
        }
    except (FileNotFoundError, ValueError, OSError):
        return None
    return _lookups.put(stamp, found)


def _read_rules() -> tuple[int, dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """(position, {list: (prefixes, rule ids, full hashes)}) read consistently."""
    using = router.db_for_read(SpamRule)
    for _attempt in range(ATTEMPTS):
        with snapshot() as snap:
            digests: dict[str, list[bytes]] = {name: [] for name in LISTS}
            ids: dict[str, list[int]] = {name: [] for name in LISTS}
            rows = (
                SpamRule.objects.using(using).order_by().values_list("pk", "expression", "category")
            )
            for pk, expression, category in rows.iterator(chunk_size=20_000):
                name = list_of_category(category)
                digests[name].append(hashlib.sha256(expression.encode()).digest())
                ids[name].append(pk)
            if not snap.consistent():
                continue
            found = {}
            for name in LISTS:
                hashes = np.frombuffer(b"".join(digests[name]), dtype=np.uint8).reshape(-1, 32)
                prefixes = hashes[:, :4].copy().view(">u4").ravel().astype(np.uint32)
                found[name] = (prefixes, np.array(ids[name], dtype=np.int64), hashes)
            return snap.position.seq, found
    raise PrepareBusy(f"the list changed under {ATTEMPTS} reads in a row")


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def prepare() -> ListsAt:
    """The lists at the current position, read and written unless kept already."""
    head = ChangeEvent.objects.head()
    kept = _complete(head)
    if kept is not None:
        return kept
    directory = store_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    with render_lock(directory, wait=True):
        kept = _complete(head)
        if kept is not None:
            return kept
        seq, rules = _read_rules()
        kept = _complete(seq)
        if kept is not None:
            return kept
        # Room first: pruned only after a write, a full disk would never free any.
        prune(keep=max(1, conf.EXPORT_KEEP_VERSIONS - 1))
        unique: dict[str, np.ndarray] = {}
        for name, (prefixes, ids, hashes) in rules.items():
            order = np.argsort(prefixes, kind="stable")
            parts = {"prefixes": prefixes[order], "ids": ids[order], "hashes": hashes[order]}
            for part, array in parts.items():
                write_aside(_lookup_path(seq, name, part), [_npy(array)])
            unique[name] = np.unique(prefixes)
        # Last: the position counts as kept once this file is in place.
        write_aside(_prefixes_path(seq), [_npz(unique)])
        prune()
        result = load(seq)
        assert result is not None
        return result


def _complete(seq: int) -> ListsAt | None:
    """The lists kept at `seq` if its lookup is kept too: fullHashes:find answers from
    the newest position's, so one whose lookup was lost is written again."""
    kept = load(seq)
    return kept if kept is not None and lookup(seq) is not None else None


def prune(keep: int | None = None) -> None:
    """Keep the newest `keep` (EXPORT_KEEP_VERSIONS) positions, lookups of the newest
    LOOKUPS_KEPT, and remove temp files of writers that died."""
    directory = store_dir()
    remove_stale_temps_in(directory, older_than=STALE_TEMP_AGE)
    positions = kept_positions()
    keep = conf.EXPORT_KEEP_VERSIONS if keep is None else keep
    for seq in positions[: max(0, len(positions) - keep)]:
        for entry in directory.glob(f"{seq}.*"):
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
    for seq in positions[: max(0, len(positions) - LOOKUPS_KEPT)]:
        for entry in directory.glob(f"{seq}.lookup.*"):
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
