"""The SQL that differs between the backends the app runs on: PostgreSQL (deployments,
`make test-services`) and SQLite (the embedded demo, the default test pass). Every
other module says what it wants done and never asks which backend it has, so a fast
path written for one backend has its portable twin next to it, and the limit on
bound parameters is stated once.

Models and tables are passed in: this module imports none of the app's models (the
models import it, for the change log's lock). It sits beside the models, beneath every
other package, because they all use it."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
from django.db import connections, models, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

__all__ = [
    "IN_BATCH",
    "MAX_PARAMETERS",
    "STATEMENT_ROWS",
    "add_counts",
    "analyze",
    "array_parameter",
    "delete_by_pk",
    "delete_in",
    "in_batches",
    "in_memory_sqlite",
    "insert_rows",
    "int64_columns",
    "sorted_int64_column",
    "lock_transaction",
    "map_in",
    "postgresql",
    "read_snapshot",
    "repeatable_read",
    "rows_per_statement",
    "sqlite",
    "unreferenced",
    "upsert_adding",
]

#: Bound parameters one statement may carry on every backend the app supports: SQLite
#: before 3.32 allowed 999 (Django supports 3.31, and its SQLite backend sizes
#: bulk_create's batches by 999 whatever the library allows); PostgreSQL 65,535.
MAX_PARAMETERS = 999
#: Values per IN (...) list: the limit, less room for the statement's other parameters.
IN_BATCH = 900
#: Rows per multi-row statement (and bulk_create batch): statements stay small on a
#: backend without the limit too. rows_per_statement lowers it for wide rows.
STATEMENT_ROWS = 500


def postgresql(connection: BaseDatabaseWrapper) -> bool:
    return connection.vendor == "postgresql"


def sqlite(connection: BaseDatabaseWrapper) -> bool:
    return connection.vendor == "sqlite"


def in_memory_sqlite(connection: BaseDatabaseWrapper) -> bool:
    """An in-memory SQLite database (tests): no other process can see it."""
    return sqlite(connection) and bool(getattr(connection, "is_in_memory_db", bool)())


def in_batches(values: list, size: int = IN_BATCH) -> Iterator[list]:
    """`values` in slices of `size`; by default short enough for one IN (...) on
    every backend."""
    for i in range(0, len(values), size):
        yield values[i : i + size]


def rows_per_statement(width: int) -> int:
    """Rows of `width` bound values each that one statement may carry."""
    return max(1, min(STATEMENT_ROWS, MAX_PARAMETERS // max(width, 1)))


# -- transactions ---------------------------------------------------------------------


def lock_transaction(connection: BaseDatabaseWrapper, key: int) -> None:
    """Serialize the transactions that take lock `key` until the current one ends.
    PostgreSQL: an advisory transaction lock. SQLite: nothing to do, the settings make
    every transaction BEGIN IMMEDIATE, i.e. one writer at a time."""
    if postgresql(connection):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])


def repeatable_read(connection: BaseDatabaseWrapper, *, read_only: bool = False) -> bool:
    """As the first statement of a transaction: read every later statement from one
    snapshot. True if that was asked for (PostgreSQL); SQLite reads one snapshot in
    any transaction already, and nothing is done (False)."""
    if not postgresql(connection):
        return False
    level = "REPEATABLE READ, READ ONLY" if read_only else "REPEATABLE READ"
    with connection.cursor() as cursor:
        cursor.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
    return True


@contextmanager
def read_snapshot(using: str) -> Iterator[bool]:
    """A read-only REPEATABLE READ transaction around the block on PostgreSQL (unless
    one is open already), yielding True: its reads agree with each other. Elsewhere no
    transaction (on SQLite it would be a writer's, BEGIN IMMEDIATE) and False: the
    caller checks afterwards that nothing moved."""
    connection = connections[using]
    if postgresql(connection) and not connection.in_atomic_block:
        with transaction.atomic(using=using):
            repeatable_read(connection, read_only=True)
            yield True
        return
    yield False


def analyze(using: str, tables: Iterable[type[models.Model]]) -> None:
    """Refresh the planner's statistics of these tables (PostgreSQL; SQLite plans
    without them)."""
    connection = connections[using]
    if not postgresql(connection):
        return
    names = ", ".join(connection.ops.quote_name(model._meta.db_table) for model in tables)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {names}")


# -- writing many rows ----------------------------------------------------------------


def insert_rows(
    using: str, model: type[models.Model], names: Sequence[str], rows: list[tuple]
) -> None:
    """INSERT rows of database-ready values (str, int, None, prepared datetimes) into
    these fields: bulk imports spend their time here, and Model.bulk_create's
    per-object, per-value work was most of it (100,000 rules: 27 s -> 8 s on SQLite).
    PostgreSQL: COPY, ~5x the rows per second of a pipelined executemany (a
    1,000,000-entry feed writes 3,000,000 rows on its first load)."""
    connection = connections[using]
    columns = ", ".join(connection.ops.quote_name(_column(model, name)) for name in names)
    table = connection.ops.quote_name(model._meta.db_table)
    with connection.cursor() as cursor:
        if postgresql(connection):
            with cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            return
        marks = ", ".join(["%s"] * len(names))
        cursor.executemany(f"INSERT INTO {table} ({columns}) VALUES ({marks})", rows)


def add_counts(
    using: str,
    model: type[models.Model],
    key_fields: Sequence[Any],
    count_fields: Sequence[Any],
    rows: Sequence[Sequence[Any]],
    *,
    upsert: bool,
) -> None:
    """Add each row's counts (the values after its keys) to the count columns of the
    row with its keys, in the order given; upsert inserts the missing rows, otherwise
    a missing row is left out. One statement per rows_per_statement rows (SQLite), per
    STATEMENT_ROWS rows (PostgreSQL: one array per column)."""
    connection = connections[using]
    if postgresql(connection):
        for start in range(0, len(rows), STATEMENT_ROWS):
            _add_counts_of_arrays(
                connection,
                model,
                key_fields,
                count_fields,
                rows[start : start + STATEMENT_ROWS],
                upsert,
            )
        return
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    keys = [qn(f.column) for f in key_fields]
    counts = [qn(f.column) for f in count_fields]
    per = rows_per_statement(len(keys) + len(counts))
    for start in range(0, len(rows), per):
        part = rows[start : start + per]
        params = [value for row in part for value in row]
        row = "(" + ", ".join(["%s"] * (len(keys) + len(counts))) + ")"
        if upsert:
            sql = (
                f"INSERT INTO {table} ({', '.join(keys + counts)}) "
                f"VALUES {', '.join([row] * len(part))} "
                f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET "
                + ", ".join(f"{c} = {table}.{c} + excluded.{c}" for c in counts)
            )
        else:
            names = [f"k{i}" for i in range(len(keys))] + [f"n{i}" for i in range(len(counts))]
            sql = (
                f"WITH v ({', '.join(names)}) AS (VALUES {', '.join([row] * len(part))}) "
                f"UPDATE {table} SET "
                + ", ".join(f"{c} = {table}.{c} + v.n{i}" for i, c in enumerate(counts))
                + " FROM v WHERE "
                + " AND ".join(f"{table}.{k} = v.k{i}" for i, k in enumerate(keys))
            )
        with connection.cursor() as cursor:
            cursor.execute(sql, params)


def _add_counts_of_arrays(
    connection: BaseDatabaseWrapper,
    model: type[models.Model],
    key_fields: Sequence[Any],
    count_fields: Sequence[Any],
    rows: Sequence[Sequence[Any]],
    upsert: bool,
) -> None:
    """PostgreSQL: one array parameter per column, unnested in the rows' order. A
    VALUES list of 1,000 links was 2,000 parameters for the client to split and quote
    while holding the GIL, once a second in every serving process: 7.4 ms of CPU a
    flush, 2.6 ms this way (18.6 -> 11.1 ms end to end)."""
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    keys = [qn(f.column) for f in key_fields]
    counts = [qn(f.column) for f in count_fields]
    arrays = [array_parameter(column) for column in zip(*rows, strict=True)]
    types = [f.cast_db_type(connection) for f in (*key_fields, *count_fields)]
    names = [f"k{i}" for i in range(len(keys))] + [f"n{i}" for i in range(len(counts))]
    source = (
        "unnest(" + ", ".join(f"%s::{kind}[]" for kind in types) + f") AS v ({', '.join(names)})"
    )
    if upsert:
        sql = (
            f"INSERT INTO {table} ({', '.join(keys + counts)}) SELECT * FROM {source} "
            f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET "
            + ", ".join(f"{c} = {table}.{c} + excluded.{c}" for c in counts)
        )
    else:
        sql = (
            f"UPDATE {table} SET "
            + ", ".join(f"{c} = {table}.{c} + v.n{i}" for i, c in enumerate(counts))
            + f" FROM {source} WHERE "
            + " AND ".join(f"{table}.{k} = v.k{i}" for i, k in enumerate(keys))
        )
    with connection.cursor() as cursor:
        cursor.execute(sql, arrays)


def array_parameter(column: tuple[Any, ...]) -> Any:
    """One column of rows as a PostgreSQL array parameter."""
    # Integers go as one array literal: psycopg's list dumper looks at every element
    # (1 ms of the flush's 2.5 ms of CPU for 1,000 links).
    if all(type(value) is int for value in column):
        return "{" + ",".join(map(str, column)) + "}"
    return list(column)


def upsert_adding(
    model: type[models.Model],
    keys: Sequence[str],
    adds: Sequence[str],
    latest: str | None,
    rows: list[tuple],
) -> None:
    """INSERT rows (keys, adds..., latest) ON CONFLICT (keys) add the counts and keep
    the later timestamp: one statement per rows_per_statement rows."""
    if not rows:
        return
    connection = connections[router.db_for_write(model)]
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    columns = [*keys, *adds, *([latest] if latest else [])]
    field = {f.attname: f for f in model._meta.fields}
    later = "GREATEST" if postgresql(connection) else "MAX"
    sets = [f"{qn(c)} = {table}.{qn(c)} + excluded.{qn(c)}" for c in adds]
    if latest:
        sets.append(
            f"{qn(latest)} = {later}(COALESCE({table}.{qn(latest)}, excluded.{qn(latest)}), "
            f"excluded.{qn(latest)})"
        )
    row = "(" + ", ".join(["%s"] * len(columns)) + ")"
    per = rows_per_statement(len(columns))
    with connection.cursor() as cursor:
        for start in range(0, len(rows), per):
            part = rows[start : start + per]
            params: list[Any] = []
            for values in part:
                params.extend(
                    field[name].get_db_prep_save(value, connection)
                    for name, value in zip(columns, values, strict=True)
                )
            cursor.execute(
                f"INSERT INTO {table} ({', '.join(qn(c) for c in columns)}) "
                f"VALUES {', '.join([row] * len(part))} "
                f"ON CONFLICT ({', '.join(qn(k) for k in keys)}) DO UPDATE SET {', '.join(sets)}",
                params,
            )


# -- reading and deleting by many values ----------------------------------------------


def _column(model: type[models.Model], name: str) -> str:
    field = model._meta.pk if name == "pk" else model._meta.get_field(name)
    return str(field.column)  # type: ignore[union-attr]


def map_in(model: type[models.Model], field: str, values: list[Any], other: str) -> dict[Any, Any]:
    """field -> other, for the rows whose `field` is one of `values`. PostgreSQL: one
    statement with one array parameter (the ORM's IN lists of IN_BATCH cost more in
    building and binding the query than PostgreSQL spends answering it)."""
    connection = connections[router.db_for_read(model)]
    if postgresql(connection):
        qn = connection.ops.quote_name
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT {qn(_column(model, field))}, {qn(_column(model, other))} "
                f"FROM {qn(model._meta.db_table)} WHERE {qn(_column(model, field))} = ANY(%s)",
                [values],
            )
            return dict(cursor.fetchall())
    found: dict[Any, Any] = {}
    for batch in in_batches(values):
        found.update(
            model._default_manager.filter(**{f"{field}__in": batch}).values_list(field, other)
        )
    return found


def delete_by_pk(using: str, model: type[models.Model], pks: list[int]) -> None:
    """DELETE these rows, with what refers to them: on PostgreSQL one statement per
    table (`= ANY(array)`), doing what each relation's on_delete says; elsewhere
    through the ORM's collector, which costs a few queries per IN_BATCH rows (10,000
    withdrawn rules took a second that way)."""
    connection = connections[using]
    if not postgresql(connection):
        for batch in in_batches(pks):
            model._default_manager.filter(pk__in=batch).delete()
        return
    qn = connection.ops.quote_name
    with connection.cursor() as cursor:
        for relation in model._meta.related_objects:
            table = qn(relation.related_model._meta.db_table)
            column = qn(str(relation.field.column))
            if relation.on_delete is models.CASCADE:
                cursor.execute(f"DELETE FROM {table} WHERE {column} = ANY(%s)", [pks])
            elif relation.on_delete is models.SET_NULL:
                cursor.execute(
                    f"UPDATE {table} SET {column} = NULL WHERE {column} = ANY(%s)", [pks]
                )
            elif relation.on_delete is not models.DO_NOTHING:
                raise NotImplementedError(f"on_delete of {relation!r} is not handled here")
        table = qn(model._meta.db_table)
        key = qn(_column(model, "pk"))
        cursor.execute(f"DELETE FROM {table} WHERE {key} = ANY(%s)", [pks])


def delete_in(
    using: str, model: type[models.Model], field: str, values: list[Any], **equal: Any
) -> list[Any]:
    """DELETE the rows whose `field` is one of `values` (and whose columns `equal`
    name have those values); returns their `field` values. PostgreSQL: one statement,
    DELETE ... RETURNING (no cascade: for rows nothing refers to)."""
    connection = connections[using]
    if not postgresql(connection):
        deleted: list[Any] = []
        for batch in in_batches(values):
            rows = model._default_manager.filter(**equal, **{f"{field}__in": batch})
            found = list(rows.values_list(field, flat=True))
            if found:
                rows.delete()
                deleted.extend(found)
        return deleted
    qn = connection.ops.quote_name
    column = qn(_column(model, field))
    where = "".join(f"{qn(_column(model, name))} = %s AND " for name in equal)
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {qn(model._meta.db_table)} WHERE {where}{column} = ANY(%s) "
            f"RETURNING {column}",
            [*equal.values(), values],
        )
        return [row[0] for row in cursor.fetchall()]


def unreferenced(
    using: str,
    model: type[models.Model],
    pks: list[int],
    fields: Sequence[str],
    referrer: type[models.Model],
    via: str,
) -> list[tuple]:
    """`fields` of the rows of `model` among `pks` that no row of `referrer` refers to
    (by its foreign key `via`)."""
    connection = connections[using]
    if not postgresql(connection):
        foreign_key: Any = referrer._meta.get_field(via)
        related = foreign_key.related_query_name()
        found: list[tuple] = []
        for batch in in_batches(pks):
            found.extend(
                model._default_manager.filter(
                    pk__in=batch, **{f"{related}__isnull": True}
                ).values_list(*fields)
            )
        return found
    qn = connection.ops.quote_name
    key = qn(_column(model, "pk"))
    columns = ", ".join(f"r.{qn(_column(model, name))}" for name in fields)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {columns} FROM {qn(model._meta.db_table)} r "
            f"WHERE r.{key} = ANY(%s) AND NOT EXISTS "
            f"(SELECT 1 FROM {qn(referrer._meta.db_table)} l "
            f"WHERE l.{qn(_column(referrer, via))} = r.{key})",
            [pks],
        )
        return cursor.fetchall()


def int64_columns(
    model: type[models.Model], columns: Sequence[str], fetch: int = 20_000, **equal: Any
) -> list[np.ndarray]:
    """These integer columns of the rows whose columns `equal` names have those values,
    as one int64 array each, in one row order. PostgreSQL: each column aggregated into
    one byte string of big-endian int64s in one pass (so in the same row order), read
    straight into numpy: a million rows in a fraction of a second, where the ORM spends
    seconds building a million tuples. Elsewhere the ORM, `fetch` rows a round trip."""
    connection = connections[router.db_for_read(model)]
    if not postgresql(connection):
        arrays = [array("q") for _ in columns]
        rows = model._default_manager.filter(**equal).values_list(*columns)
        for row in rows.iterator(chunk_size=fetch):
            for values, value in zip(arrays, row, strict=True):
                values.append(value)
        return [np.frombuffer(values, dtype=np.int64) for values in arrays]
    qn = connection.ops.quote_name
    aggregates = ", ".join(f"string_agg(int8send({qn(_column(model, c))}), '')" for c in columns)
    where = _equal_to(connection, model, equal)
    connection.ensure_connection()
    # A server-side-binding cursor of its own: Django's client-side cursors cannot
    # ask for binary results, and in text the 16 MB of a million rows arrive as 32 MB
    # of hex. The aggregates take the rows in the one order of the scan (asking for
    # key order made PostgreSQL walk the index: twice the time of a sort here).
    import psycopg  # only on PostgreSQL (the `postgres` extra)

    with psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(
            f"SELECT {aggregates} FROM {qn(model._meta.db_table)} WHERE {where}",
            list(equal.values()),
            binary=True,
        )
        found = list(cursor.fetchone() or [None])
    if found[0] is None:
        return [np.zeros(0, dtype=np.int64) for _ in columns]
    result = []
    for i in range(len(found)):
        result.append(np.frombuffer(found[i], dtype=">i8").astype(np.int64))
        found[i] = None  # a million rows' bytes each: not all held at once
    return result


# The parts sorted_int64_column reads a column in: the top bits of the value.
_PART_SHIFT = 60


def sorted_int64_column(model: type[models.Model], column: str, **equal: Any) -> np.ndarray:
    """One integer column of the rows whose columns `equal` names have those values,
    sorted. PostgreSQL: one scan, the values grouped into 16 parts by their top bits
    and fetched a part at a time into an array of the rows' count (the first part
    says it), so the transfer holds a sixteenth of the bytes, not all of them twice
    over (10 million keys read whole peaked 300 MB above the keys themselves)."""
    connection = connections[router.db_for_read(model)]
    if not postgresql(connection):
        (values,) = int64_columns(model, (column,), **equal)
        values.sort()
        return values
    qn = connection.ops.quote_name
    name = qn(_column(model, column))
    where = _equal_to(connection, model, equal)
    connection.ensure_connection()
    import psycopg  # only on PostgreSQL (the `postgres` extra)

    result = np.zeros(0, dtype=np.int64)
    at = 0
    # A named (server-side) cursor, in a transaction: one part a round trip.
    with (
        transaction.atomic(using=connection.alias),
        psycopg.ServerCursor(connection.connection, "urlguard_sorted_column") as cursor,
    ):
        cursor.execute(
            f"SELECT sum(count(*)) OVER (), string_agg(int8send({name}), '') "
            f"FROM {qn(model._meta.db_table)} WHERE {where} "
            f"GROUP BY {name} >> {_PART_SHIFT} ORDER BY {name} >> {_PART_SHIFT}",
            list(equal.values()),
            binary=True,
        )
        while (row := cursor.fetchone()) is not None:
            if at == 0:
                result = np.empty(int(row[0]), dtype=np.int64)
            part = np.frombuffer(row[1], dtype=">i8")
            into = result[at : at + len(part)]
            into[:] = part
            into.sort()
            at += len(part)
            del row, part, into  # this part's bytes go before the next arrive
    return result


def _equal_to(connection: BaseDatabaseWrapper, model: type[models.Model], equal: dict) -> str:
    """The WHERE condition that each column `equal` names has its value (%s each, in
    `equal`'s order); TRUE for none."""
    qn = connection.ops.quote_name
    return " AND ".join(f"{qn(_column(model, name))} = %s" for name in equal) or "TRUE"
