"""Rescan: stream every short link's destination through Guard.check_many and list
the links that now point to spam. The filter answers the clean majority in memory;
only its hits are confirmed in the spam table.

The cost is canonicalizing each destination (tens of µs of pure Python), so a large
table is split into primary-key ranges scanned by a pool of processes, one per CPU:
a million links then take well under a minute on two cores."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field

from django.conf import settings
from django.db import connections, router
from django.db.models import Max, Min

# Rows fetched and checked per round trip: large enough that the per-query cost
# vanishes, small enough that a million links never sit in memory at once.
CHUNK_SIZE = 20_000
# Below this many links one process is quicker than starting a pool (each worker
# process sets Django up, about a second).
PARALLEL_MIN = 100_000
# Primary keys per pool task: small enough that progress moves and the workers
# finish together, large enough that a task's start-up cost is noise.
RANGE_SIZE = 50_000


@dataclass(frozen=True)
class RescanHit:
    link_id: int
    slug: str
    destination: str
    expression: str
    category: str
    disabled: bool


@dataclass
class RescanResult:
    scanned: int = 0
    unchecked: int = 0
    invalid: int = 0
    hits: list[RescanHit] = field(default_factory=list)
    seconds: float = 0.0
    processes: int = 1

    def as_dict(self) -> dict:
        return {
            "scanned": self.scanned,
            "unchecked": self.unchecked,
            "invalid": self.invalid,
            "seconds": round(self.seconds, 3),
            "processes": self.processes,
            "hits": [asdict(h) for h in self.hits],
        }

    def merge(self, other: RescanResult) -> None:
        self.scanned += other.scanned
        self.unchecked += other.unchecked
        self.invalid += other.invalid
        self.hits.extend(other.hits)


def was_checked(verdict, guard) -> bool:
    """False when the filter could not be read and the "open" or "closed" policy
    answered without looking: such a verdict (allowed or blocked, never with a rule)
    says nothing about the URL. The "database" policy's answer is the table's own."""
    return not (verdict.degraded and guard.on_filter_error != "database")


# Model and guard imports live inside the functions: a pool process imports this
# module (to unpickle its initializer) before it has set Django up.


def _links(include_disabled: bool):
    # Here: a pool process imports this module before Django is set up.
    from urlguard.models import ShortLink

    links = ShortLink.objects.all()
    return links if include_disabled else links.filter(disabled=False)


def scan_range(
    include_disabled: bool,
    low: int,
    high: int | None,
    chunk_size: int,
    progress: Callable[[int], None] | None = None,
) -> RescanResult:
    """Check the links with low < pk <= high (high None: no upper bound)."""
    # Here: a pool process imports this module before Django is set up.
    from urlguard.hotpath.guard import get_guard

    guard = get_guard()
    links = _links(include_disabled).filter(pk__gt=low)
    if high is not None:
        links = links.filter(pk__lte=high)
    result = RescanResult()
    last_pk = low
    while True:
        # Only the key and the destination for every row (fewer columns, fewer
        # converters); slug and state are read for the few hits alone.
        rows = list(
            links.filter(pk__gt=last_pk)
            .order_by("pk")
            .values_list("pk", "destination")[:chunk_size]
        )
        if not rows:
            break
        last_pk = rows[-1][0]
        verdicts = guard.check_many([destination for _, destination in rows])
        found = []
        for (pk, destination), verdict in zip(rows, verdicts, strict=True):
            if verdict.error:
                # A destination that is not a usable URL (stored before validation,
                # or hand-edited): it cannot point to spam, but operators should know.
                result.invalid += 1
            elif not was_checked(verdict, guard):
                result.unchecked += 1
            elif verdict.blocked and verdict.rule is not None:
                found.append((pk, destination, verdict.rule))
        if found:
            details = {
                pk: (slug, disabled)
                for pk, slug, disabled in _links(include_disabled)
                .filter(pk__in=[pk for pk, _, _ in found])
                .values_list("pk", "slug", "disabled")
            }
            result.hits.extend(
                RescanHit(
                    link_id=pk,
                    slug=details[pk][0],
                    destination=destination,
                    expression=rule.expression,
                    category=rule.category,
                    disabled=details[pk][1],
                )
                for pk, destination, rule in found
                if pk in details  # deleted meanwhile: gone
            )
        result.scanned += len(rows)
        if progress is not None:
            progress(len(rows))
    return result


def _pool_size(total: int) -> int:
    if total < PARALLEL_MIN or (os.cpu_count() or 1) < 2:
        return 1
    # A Celery prefork child is a daemon process, which may not start children.
    if multiprocessing.current_process().daemon:
        return 1
    # Here: a pool process imports this module before Django is set up.
    from urlguard.models import ShortLink, database

    if database.in_memory_sqlite(connections[router.db_for_read(ShortLink)]):
        return 1  # other processes cannot see an in-memory database (tests)
    return os.cpu_count() or 1


def _init_worker(databases: dict, urlguard: dict) -> None:
    # A spawned process (never fork: a forked copy of a threaded web process can
    # inherit a lock some other thread held) sets Django up from the environment,
    # then takes the parent's database and URLGUARD settings, which may have been
    # changed at run time (override_settings, a management command's options).
    import django

    settings.DATABASES = databases
    settings.URLGUARD = urlguard
    django.setup()


def rescan_links(
    *,
    include_disabled: bool = False,
    chunk_size: int = CHUNK_SIZE,
    progress: Callable[[int, int], None] | None = None,
    processes: int | None = None,
) -> RescanResult:
    """Check every (enabled, unless include_disabled) short link; progress(done, total)
    is called as chunks finish. Keyset pagination on the primary key keeps each query
    an index range scan however far into the table it is. `processes`: None picks one
    per CPU for a large table, one for a small one."""
    started = time.perf_counter()
    links = _links(include_disabled)
    total = links.count()
    workers = _pool_size(total) if processes is None else processes
    result = RescanResult(processes=workers)
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done, total)

    if workers <= 1:
        result.merge(scan_range(include_disabled, 0, None, chunk_size, advance))
    else:
        bounds = links.aggregate(low=Min("pk"), high=Max("pk"))
        low, high = bounds["low"] - 1, bounds["high"]
        ranges = [(start, min(start + RANGE_SIZE, high)) for start in range(low, high, RANGE_SIZE)]
        with ProcessPoolExecutor(
            max_workers=workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(settings.DATABASES, settings.URLGUARD),
        ) as pool:
            futures = [
                pool.submit(scan_range, include_disabled, lo, hi, chunk_size) for lo, hi in ranges
            ]
            for future in as_completed(futures):
                part = future.result()
                result.merge(part)
                advance(part.scanned)
        result.hits.sort(key=lambda hit: hit.link_id)
    result.seconds = time.perf_counter() - started
    return result
