"""The bulk loader: many new listings of one source written to PostgreSQL at the
speed of COPY. Each chunk's rows are COPied into a temporary table, then written
by one statement of set-based INSERTs (rules, listings, change log) joined against
the rules table, so no row becomes a Python object on the way. The rows are read
by a thread of this module's own, the next chunk's while PostgreSQL writes this one,
and each chunk is sorted by expression before its COPY (its rule ids, added_at and
change-log seq follow that order).

Only for PostgreSQL; urlguard.writepath.changes.add_listed chooses it (elsewhere
it writes through add_rules)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from itertools import islice
from operator import itemgetter
from typing import Any

from django.db import connections, router, transaction
from django.utils import timezone

from urlguard.models import (
    ChangeEvent,
    ChangeSet,
    RuleSource,
    Source,
    SpamRule,
    database,
    rule_writes_allowed,
)
from urlguard.writepath.changesets import (
    _ADD,
    _ANALYZE_EVERY,
    _check_lister,
    _count,
    _lock_change_log,
    _next_added_at,
    _nudge,
    _refresh_statistics,
)

__all__ = ["LISTED_CHUNK_SIZE", "Loaded", "copy_listed"]

# add_listed's rows per transaction on PostgreSQL: each is a few set-based statements,
# so larger than CHUNK_SIZE; still a second or so under the change-log lock.
LISTED_CHUNK_SIZE = 50_000
_STAGE_TABLE = "urlguard_listed_stage"


@dataclass
class Loaded:
    """What copy_listed wrote: rows handled, rules added, listings gained by rules
    another source listed already."""

    handled: int = 0
    added: int = 0
    gained: int = 0


def copy_listed(
    rows: Iterable[tuple[str, str, int, str]],
    *,
    source: Source,
    actor: Any,
    change_set: ChangeSet,
    label: str = "",
    chunk_size: int = LISTED_CHUNK_SIZE,
    progress: Callable[[int], None] | None = None,
) -> Loaded:
    """`source` lists these (expression, category, expression_key, note) rows, in
    `change_set`: distinct rule expressions already normalized. A new rule is
    written with its listing and its change-log row (both name `label`, by default
    the source's name), one already listed gains the listing (if `source` did not
    list it already); one transaction (and one nudge) per chunk. `rows` is read in a
    thread of its own: it must not query the database. PostgreSQL only."""
    using = router.db_for_write(SpamRule)
    connection = connections[using]
    loaded = Loaded()
    stage = connection.ops.quote_name(_STAGE_TABLE)
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {stage}")
        cursor.execute(
            f"CREATE TEMPORARY TABLE {stage} (n bigint NOT NULL, expression text NOT NULL, "
            "category text NOT NULL, key bigint NOT NULL, note text NOT NULL)"
        )
        analyze_at = _ANALYZE_EVERY
        chunks = _Reader(rows, chunk_size)
        try:
            for chunk in chunks:
                with transaction.atomic(using=using), rule_writes_allowed():
                    # The COPY before the lock: a writer waits only for the INSERTs.
                    cursor.execute(f"TRUNCATE {stage}")
                    _copy_chunk(cursor, stage, chunk)
                    chunks.copied()
                    _lock_change_log(using)
                    _check_lister(using, source)
                    gained, added, last_seq = _add_listed_chunk(
                        cursor, stage, source, actor, change_set, label or source.name
                    )
                    _count(change_set, added=added)
                    if last_seq is not None:
                        transaction.on_commit(partial(_nudge, last_seq), using=using)
                loaded.handled += chunk.count
                loaded.added += added
                loaded.gained += gained
                if loaded.added >= analyze_at:
                    # What each chunk's lookups read; the rest once, at the end.
                    database.analyze(using, (SpamRule,))
                    analyze_at *= 2
                if progress is not None:
                    progress(loaded.handled)
            if loaded.added >= _ANALYZE_EVERY:
                _refresh_statistics(using)
        finally:
            chunks.close()
            cursor.execute(f"DROP TABLE IF EXISTS {stage}")
    return loaded


# Rows per COPY text block: a chunk is read and encoded a block at a time.
_COPY_BLOCK = 10_000


@dataclass
class _Chunk:
    """One chunk of add_listed's rows, numbered from `first`, in blocks."""

    first: int
    count: int
    blocks: list[list[tuple[str, str, int, str]]]


def _encode(block: list[tuple[str, str, int, str]], first: int) -> str | list[tuple]:
    """The rows as COPY text built by one join; rows whose text would need COPY's
    escapes (a backslash, or a tab or line end inside a field: canonical expressions
    have none, a note may) stay rows, numbered, for psycopg, which escapes."""
    text = "".join(
        f"{n}\t{expression}\t{category}\t{key}\t{note}\n"
        for n, (expression, category, key, note) in enumerate(block, start=first)
    )
    if (
        "\\" in text
        or "\r" in text
        or text.count("\t") != 4 * len(block)
        or text.count("\n") != len(block)
    ):
        return [(n, *row) for n, row in enumerate(block, start=first)]
    return text


def _copy_chunk(cursor: Any, stage: str, chunk: _Chunk) -> None:
    # Encoded here, not by the reading thread: a text block is big enough for the C
    # allocator, which keeps what a thread freed in that thread's own arena (the
    # process's RSS grew by ~10 MB that way). Reading the rows is most of the work.
    first = chunk.first
    with cursor.cursor.copy(
        f"COPY {stage} (n, expression, category, key, note) FROM STDIN"
    ) as copy:
        for block in chunk.blocks:
            encoded = _encode(block, first)
            if isinstance(encoded, str):
                copy.write(encoded)
            else:
                for row in encoded:
                    copy.write_row(row)
            first += len(block)


class _Reader:
    """`rows` in chunks of `chunk_size`, each sorted by expression, numbered on from
    chunk to chunk, read by a thread of their own while the
    consumer has PostgreSQL write the chunk before. The thread reads one chunk per
    `copied()` call (the first one at once), so it never competes with the
    consumer's COPY for the interpreter: it works while the consumer waits on the
    database. An error in `rows` is raised to the consumer; `close()` (a consumer
    done, or stopping on an error of its own) stops the thread and waits for it."""

    def __init__(self, rows: Iterable[tuple[str, str, int, str]], chunk_size: int):
        self._rows = iter(rows)
        self._chunk_size = chunk_size
        self._handoff: queue.Queue[_Chunk | BaseException | None] = queue.Queue()
        self._go = threading.Semaphore(1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, name="urlguard-add-listed")
        self._thread.daemon = True
        self._thread.start()

    def _produce(self) -> None:
        try:
            first = 0
            while self._wait_for_turn():
                rows = list(islice(self._rows, self._chunk_size))
                if not rows:
                    break
                # In expression order a chunk reaches the unique index on the rules' text
                # page after page, not at random (a shuffled feed: docs/performance.md).
                rows.sort(key=itemgetter(0))
                blocks = [rows[at : at + _COPY_BLOCK] for at in range(0, len(rows), _COPY_BLOCK)]
                chunk = _Chunk(first, len(rows), blocks)
                self._handoff.put(chunk)
                first += chunk.count
            self._handoff.put(None)
        except BaseException as exc:  # handed to the consumer, raised there
            self._handoff.put(exc)

    def _wait_for_turn(self) -> bool:
        while not self._stop.is_set():
            if self._go.acquire(timeout=0.1):
                return not self._stop.is_set()
        return False

    def __iter__(self) -> Iterator[_Chunk]:
        while True:
            item = self._handoff.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def copied(self) -> None:
        """The chunk last handed out is in PostgreSQL: read the next one."""
        self._go.release()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _add_listed_chunk(
    cursor: Any, stage: str, source: Source, actor: Any, cs: ChangeSet, label: str
) -> tuple[int, int, int | None]:
    """The rows of `stage`, inside the caller's locked transaction: (listings gained
    by rules already listed, rules added, the last change-log seq written)."""
    qn = cursor.db.ops.quote_name
    rules, listings = qn(SpamRule._meta.db_table), qn(RuleSource._meta.db_table)
    events = qn(ChangeEvent._meta.db_table)
    now = timezone.now()
    # The new rules' ids, above every rule's (we hold the lock), in the rows' order;
    # the log takes them in that order, so seq follows added_at. Each row looks its
    # rule up by the unique index (a subquery per row): as a join, PostgreSQL chose
    # to hash the whole rules table for every chunk.
    base = _next_added_at() - 1
    cursor.execute(
        f"""
        WITH chunk AS (
            SELECT s.n, s.expression, s.category, s.key, s.note,
                   (SELECT r.id FROM {rules} r WHERE r.expression = s.expression) AS rule_id
            FROM {stage} s
        ), gained AS (
            INSERT INTO {listings} (rule_id, source_id, {qn("key")}, created)
            SELECT rule_id, %(source)s, key, %(now)s FROM chunk WHERE rule_id IS NOT NULL
            ON CONFLICT DO NOTHING RETURNING 1
        ), fresh AS (
            INSERT INTO {rules} (expression, category, note, added_at, source, added_by_id,
                                 created, updated)
            SELECT expression, category, note, %(base)s + row_number() OVER (ORDER BY n),
                   %(label)s, %(actor)s, %(now)s, %(now)s
            FROM chunk WHERE rule_id IS NULL ORDER BY n
            RETURNING id, expression, added_at, category, note
        ), listed AS (
            INSERT INTO {listings} (rule_id, source_id, {qn("key")}, created)
            SELECT f.id, %(source)s, c.key, %(now)s
            FROM fresh f JOIN chunk c ON c.expression = f.expression
            RETURNING 1
        ), logged AS (
            INSERT INTO {events} (action, expression, added_at, category, actor_id, source,
                                  created, change_set_id, note)
            SELECT %(add)s, expression, added_at, category, %(actor)s, %(label)s, %(now)s,
                   %(cs)s, note
            FROM fresh ORDER BY added_at
            RETURNING seq
        )
        SELECT (SELECT count(*) FROM gained), (SELECT count(*) FROM listed),
               (SELECT max(seq) FROM logged)
        """,
        {
            "source": source.pk,
            "now": now,
            "base": base,
            "label": label,
            "actor": actor.pk if actor is not None else None,
            "add": _ADD,
            "cs": cs.pk,
        },
    )
    gained, added, last_seq = cursor.fetchone()
    return int(gained), int(added), last_seq
