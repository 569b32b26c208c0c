"""What a change to the spam table would do to the short links, before it is made:
"would block N short links (M clicks in the last 30 days); K of them already blocked
by another rule", and for a removal, "unblocks N; R stay blocked by another rule".

It is the rescan's join (every link's roll-up expressions against the rules) turned
around: the links' expressions are hashed once into a sorted index on disk (built
by `build_link_index`, refreshed after each rescan), so the links a set of rules
touches are found by binary search, not by canonicalizing a million destinations.
Those few candidates are then read again and matched exactly with
`canonical.expressions`, so an index entry that is stale (a link deleted or edited
since) or a hash collision never reaches a figure. Links created after the index
was built are matched directly from the table.

Index layout (DATA_DIR/link-index/): `keys.npy`, one sorted uint64 per (link,
expression): the expression's 64-bit hash with its low `row_bits` replaced by the
link's row number; `links.npy`, the link primary key of each row; `meta.json`.

It lives in the write path, not in urlguard.shortlinks: the write path (a revert's
figures) and the feeds need it, and neither may import shortlinks."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path

import mmh3
import numpy as np
from django.db import connections
from django.db.models import Count
from django.utils import timezone

from urlguard.conf import conf
from urlguard.hotpath.canonical import expressions
from urlguard.models import Click, ShortLink, SpamRule, database
from urlguard.runtime.process import on_reset

logger = logging.getLogger(__name__)

__all__ = [
    "Impact",
    "LinkIndex",
    "build_link_index",
    "impact_of_adding",
    "impact_of_listing",
    "impact_of_removing",
    "link_index",
]

# Links fetched per query while building the index or confirming candidates.
FETCH = 20_000
# Without an index, a table this small is matched directly (about a second).
DIRECT_LIMIT = 20_000
# Links created since the index was built are matched directly up to this many;
# beyond it the index is rebuilt in the background.
TOP_UP_LIMIT = 20_000
# Sample links shown beside the figures.
SAMPLES = 10
CLICK_WINDOW = timedelta(days=30)


def expression_hash(expression: str) -> int:
    return mmh3.hash64(expression.encode("utf-8"), signed=False)[0]


def _hashes(expressions_: Iterable[str]) -> np.ndarray:
    return np.fromiter((expression_hash(e) for e in expressions_), dtype=np.uint64)


def _index_dir() -> Path:
    return Path(conf.DATA_DIR) / "link-index"


@dataclass
class LinkIndex:
    keys: np.ndarray  # sorted uint64: hash prefix | row
    links: np.ndarray  # int64 link pk per row
    row_bits: int
    max_pk: int
    built_at: float
    link_count: int

    def rows_for(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(query position, row) of every index entry whose hash prefix equals one of
        `hashes` (uint64)."""
        if not len(hashes) or not len(self.keys):
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        shift = np.uint64(self.row_bits)
        mask = (np.uint64(1) << shift) - np.uint64(1)
        low = (hashes >> shift) << shift
        starts = np.searchsorted(self.keys, low, side="left")
        ends = np.searchsorted(self.keys, low | mask, side="right")
        counts = ends - starts
        total = int(counts.sum())
        if total == 0:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        which = np.repeat(np.arange(len(hashes)), counts)
        offsets = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        positions = np.repeat(starts, counts) + offsets
        rows = (self.keys[positions] & mask).astype(np.int64)
        return which, rows

    def candidates(self, hashes: np.ndarray) -> np.ndarray:
        """Primary keys of the links that may have one of `hashes` among their
        expressions (exact matching comes after)."""
        _, rows = self.rows_for(hashes)
        return np.unique(self.links[rows]) if len(rows) else np.empty(0, dtype=np.int64)


_cache_lock = threading.Lock()
_cached: tuple[tuple, LinkIndex] | None = None
_building = threading.Event()


def link_index() -> LinkIndex | None:
    """This node's index, memory-mapped (shared by the processes that read it), or None
    if none has been built yet."""
    global _cached
    directory = _index_dir()
    meta_path = directory / "meta.json"
    try:
        stat = meta_path.stat()
    except OSError:
        return None
    token = (str(directory), stat.st_ino, stat.st_mtime_ns)
    with _cache_lock:
        if _cached is not None and _cached[0] == token:
            return _cached[1]
        try:
            meta = json.loads(meta_path.read_text())
            generation = meta["generation"]
            keys = np.load(directory / f"keys-{generation}.npy", mmap_mode="r")
            links = np.load(directory / f"links-{generation}.npy", mmap_mode="r")
        except (OSError, ValueError, KeyError) as exc:
            logger.warning(
                "link index in %s is unreadable (%s); it will be rebuilt", directory, exc
            )
            return None
        index = LinkIndex(
            keys=keys,
            links=links,
            row_bits=int(meta["row_bits"]),
            max_pk=int(meta["max_pk"]),
            built_at=float(meta["built_at"]),
            link_count=int(meta["links"]),
        )
        _cached = (token, index)
        return index


@on_reset
def reset() -> None:
    """Forget the cached index (tests)."""
    global _cached
    with _cache_lock:
        _cached = None


def build_link_index(
    progress: Callable[[int, int], None] | None = None, directory: Path | None = None
) -> LinkIndex | None:
    """Hash every short link's roll-up expressions into a new index and put it in place
    (written aside, then renamed: readers keep their old mapping until they look again)
    in `directory` (None: this node's)."""

    started = time.time()
    total = ShortLink.objects.count()
    hashes: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    link_pks: list[int] = []
    last_pk = 0
    while True:
        batch = list(
            ShortLink.objects.filter(pk__gt=last_pk)
            .order_by("pk")
            .values_list("pk", "destination")[:FETCH]
        )
        if not batch:
            break
        last_pk = batch[-1][0]
        chunk_hashes: list[int] = []
        chunk_rows: list[int] = []
        for pk, destination in batch:
            try:
                exprs = expressions(destination)
            except ValueError:
                continue
            row = len(link_pks)
            link_pks.append(pk)
            for expression in exprs:
                chunk_hashes.append(expression_hash(expression))
                chunk_rows.append(row)
        hashes.append(np.array(chunk_hashes, dtype=np.uint64))
        rows.append(np.array(chunk_rows, dtype=np.uint64))
        if progress is not None:
            progress(len(link_pks), total)
    row_bits = max(1, int(len(link_pks)).bit_length())
    shift = np.uint64(row_bits)
    keys = (
        ((np.concatenate(hashes) >> shift) << shift) | np.concatenate(rows)
        if hashes
        else np.empty(0, dtype=np.uint64)
    )
    del hashes, rows
    keys.sort()
    directory = directory or _index_dir()
    directory.mkdir(parents=True, exist_ok=True)
    generation = f"{time.time_ns()}-{os.getpid()}"
    np.save(directory / f"keys-{generation}.npy", keys)
    np.save(directory / f"links-{generation}.npy", np.array(link_pks, dtype=np.int64))
    meta = {
        "generation": generation,
        "row_bits": row_bits,
        "max_pk": last_pk,
        "links": len(link_pks),
        "entries": len(keys),
        "built_at": started,
        "seconds": round(time.time() - started, 3),
    }
    temporary = directory / f"meta-{generation}.json"
    temporary.write_text(json.dumps(meta))
    os.replace(temporary, directory / "meta.json")
    _remove_old_generations(directory, generation)
    logger.info(
        "link index: %d links, %d expressions, %.1f s", len(link_pks), len(keys), meta["seconds"]
    )
    return link_index()


def _remove_old_generations(directory: Path, keep: str) -> None:
    # A process still mapping an old file keeps its pages (unlinked, not truncated).
    for path in directory.glob("*.npy"):
        if keep not in path.name:
            with contextlib.suppress(OSError):
                path.unlink()


def build_in_background() -> bool:
    """Start one index build in a daemon thread of this process (if none is running);
    returns False if one already is."""
    if _building.is_set():
        return False
    _building.set()
    # Resolved now, by the caller: the thread may run after the settings changed (a
    # test that asked for it has ended and given back the checkout's var/).
    directory = _index_dir()

    def run() -> None:

        try:
            build_link_index(directory=directory)
        except Exception:
            logger.exception("link index build failed")
        finally:
            _building.clear()
            connections.close_all()

    threading.Thread(target=run, name="urlguard-link-index", daemon=True).start()
    return True


@dataclass
class Impact:
    """What adding (or removing) a set of rules does to the short links."""

    action: str  # "add" or "remove"
    rules: int = 0
    links: int = 0  # enabled links the rules match
    clicks: int = 0  # their clicks in the last 30 days
    covered: int = 0  # of `links`, covered by another rule (already / still blocked)
    disabled: int = 0  # disabled links the rules match (not counted in `links`)
    samples: list[dict] = field(default_factory=list)
    per_rule: dict[str, int] = field(default_factory=dict)
    exact: bool = True  # False: the index is being built, the figures are unknown
    changed_clicks: int = 0  # impact_of_listing: clicks of the links newly blocked
    seconds: float = 0.0
    note: str = ""

    @property
    def changed(self) -> int:
        """Links whose verdict changes: newly blocked, or really unblocked."""
        return self.links - self.covered

    def as_dict(self) -> dict:
        data = asdict(self)
        data["changed"] = self.changed
        data["text"] = self.text()
        return data

    def text(self) -> str:
        if not self.exact:
            return self.note or "The impact is not known yet: the short links are being indexed."
        links = f"{self.links:,} short link{'' if self.links == 1 else 's'}"
        clicks = f"{self.clicks:,} click{'' if self.clicks == 1 else 's'} in the last 30 days"
        if self.action == "add":
            text = f"Would block {links} ({clicks})"
            if self.covered:
                text += f"; {self.covered:,} of them already blocked by another rule"
        else:
            text = f"Would unblock {self.changed:,} of the {links} these rules block ({clicks})"
            if self.covered:
                text += f"; {self.covered:,} stay blocked by another rule"
        return text + "."


def _candidate_links(rule_expressions: list[str]) -> tuple[set[int], bool, str]:
    """(link pks that may match, exact?, note): from the index plus the links created
    after it; or the whole table when it is small and not indexed yet."""

    index = link_index()
    if index is None:
        count = ShortLink.objects.count()
        if count <= DIRECT_LIMIT:
            return set(ShortLink.objects.values_list("pk", flat=True)), True, ""
        build_in_background()
        return (
            set(),
            False,
            f"The impact is not known yet: the {count:,} short links are being indexed "
            "(a minute or two per million); look again shortly.",
        )
    found = {int(pk) for pk in index.candidates(_hashes(rule_expressions))}
    newer = ShortLink.objects.filter(pk__gt=index.max_pk)
    newer_count = newer.count()
    if newer_count > TOP_UP_LIMIT:
        build_in_background()
    found.update(newer.order_by("pk").values_list("pk", flat=True)[:TOP_UP_LIMIT])
    return found, True, ""


def _match(
    rule_set: set[str], pks: set[int], action: str
) -> tuple[Impact, list[tuple[int, str, str, bool, list[str]]]]:
    """Read the candidate links again and match them exactly."""

    impact = Impact(action=action, rules=len(rule_set))
    matched: list[tuple[int, str, str, bool, list[str]]] = []  # pk, slug, dest, disabled, exprs
    ordered = sorted(pks)
    for batch in database.in_batches(ordered):
        rows = ShortLink.objects.filter(pk__in=batch).values_list(
            "pk", "slug", "destination", "disabled"
        )
        for pk, slug, destination, disabled in rows:
            try:
                exprs = expressions(destination)
            except ValueError:
                continue
            hits = [e for e in exprs if e in rule_set]
            if hits:
                matched.append((pk, slug, destination, disabled, exprs))
                for expression in hits:
                    impact.per_rule[expression] = impact.per_rule.get(expression, 0) + 1
    return impact, matched


def _other_rules(matched: list, exclude: set[str]) -> dict[str, str]:
    """expression -> itself for every listed rule (not in `exclude`) that covers one of
    the matched links."""

    wanted = sorted({e for *_, exprs in matched for e in exprs} - exclude)
    listed: dict[str, str] = {}
    for batch in database.in_batches(wanted):
        listed.update(
            (e, e)
            for e in SpamRule.objects.filter(expression__in=batch)
            .values_list("expression", flat=True)
            .iterator()
        )
    return listed


def _clicks(pks: list[int]) -> int:

    since = timezone.now() - CLICK_WINDOW
    total = 0
    for batch in database.in_batches(pks):
        clicks = Click.objects.filter(link_id__in=batch, at__gte=since)
        total += clicks.aggregate(n=Count("pk"))["n"]
    return total


def _tally(
    impact: Impact,
    matched: list[tuple[int, str, str, bool, list[str]]],
    others: dict[str, str],
    rule_of: Callable[[int, list[str]], str],
    *,
    sample_covered: bool,
) -> list[tuple[int, str, str, bool, list[str]]]:
    """Count the matched links into `impact` (enabled, disabled, covered by one of
    `others`, their clicks) and take its samples; returns the enabled links."""
    enabled = [m for m in matched if not m[3]]
    impact.disabled = len(matched) - len(enabled)
    impact.links = len(enabled)
    for pk, slug, destination, _disabled, exprs in enabled:
        other = next((e for e in exprs if e in others), None)
        if other is not None:
            impact.covered += 1
        if len(impact.samples) < SAMPLES and (other is None or sample_covered):
            impact.samples.append(
                {
                    "id": pk,
                    "slug": slug,
                    "destination": destination,
                    "rule": rule_of(pk, exprs),
                    "other_rule": other,
                }
            )
    impact.clicks = _clicks([m[0] for m in enabled])
    return enabled


def _compute(rule_expressions: Iterable[str], action: str) -> Impact:
    started = time.perf_counter()
    rule_set = set(rule_expressions)
    if not rule_set:
        return Impact(action=action)
    pks, exact, note = _candidate_links(list(rule_set))
    if not exact:
        return Impact(action=action, rules=len(rule_set), exact=False, note=note)
    impact, matched = _match(rule_set, pks, action)
    others = _other_rules(matched, rule_set)
    _tally(
        impact,
        matched,
        others,
        lambda pk, exprs: next(e for e in exprs if e in rule_set),
        sample_covered=True,
    )
    impact.seconds = time.perf_counter() - started
    return impact


def impact_of_adding(rule_expressions: Iterable[str]) -> Impact:
    """What listing `rule_expressions` (normalized rule expressions) would block."""
    return _compute(rule_expressions, "add")


def impact_of_removing(rule_expressions: Iterable[str]) -> Impact:
    """What unlisting `rule_expressions` would unblock, and what stays blocked by
    other rules ("still blocked by R": each sample's other_rule)."""
    return _compute(rule_expressions, "remove")


def impact_of_listing(rule_expressions: Iterable[str], *, chunk: int = 100_000) -> Impact:
    """What listing `rule_expressions` would newly block, before they are written (a
    feed refresh's new entries, however many): read a chunk at a time, a link counted
    once, and `covered` are the links a rule already in the table blocks."""

    started = time.perf_counter()
    impact = Impact(action="add")
    if not ShortLink.objects.exists():  # nothing to block: the entries need no reading
        return impact
    matched: dict[int, tuple[int, str, str, bool, list[str]]] = {}
    first_hit: dict[int, str] = {}
    iterator = iter(rule_expressions)
    while True:
        rule_set = {e for _, e in zip(range(chunk), iterator, strict=False)}
        if not rule_set:
            break
        impact.rules += len(rule_set)
        pks, exact, note = _candidate_links(list(rule_set))
        if not exact:
            return Impact(action="add", rules=impact.rules, exact=False, note=note)
        part, rows = _match(rule_set, pks - matched.keys(), "add")
        for expression, n in part.per_rule.items():
            impact.per_rule[expression] = impact.per_rule.get(expression, 0) + n
        for row in rows:
            matched[row[0]] = row
            first_hit[row[0]] = next(e for e in row[4] if e in rule_set)
    # Nothing is excluded: the new entries are not in the table yet, and one that is
    # (another source lists it) does already block its links.
    others = _other_rules(list(matched.values()), set())
    rows = [matched[pk] for pk in sorted(matched)]
    enabled = _tally(impact, rows, others, lambda pk, exprs: first_hit[pk], sample_covered=False)
    impact.changed_clicks = _clicks([m[0] for m in enabled if not any(e in others for e in m[4])])
    impact.seconds = time.perf_counter() - started
    return impact
