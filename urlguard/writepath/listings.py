"""Reading a source's listings (RuleSource rows) by their 64-bit expression keys:
all of them with their rule ids, or the rule ids of some keys, which a plan's
withdrawals name."""

from __future__ import annotations

import numpy as np
from django.db import connections, router

from urlguard.models import RuleSource, Source
from urlguard.runtime import database

__all__ = ["listed_now", "rule_ids"]

_FETCH_ROWS = 20_000
# Keys per query elsewhere than on PostgreSQL (an IN list each).
_BATCH = 10_000
# Above this share of the listing, rule_ids reads every listing instead.
_WHOLE = 1 / 8


def listed_now(source: Source) -> tuple[np.ndarray, np.ndarray]:
    """(keys, rule ids) of what `source` lists now, sorted by key."""
    keys, ids = database.int64_columns(
        RuleSource, ("key", "rule_id"), fetch=_FETCH_ROWS, source_id=source.pk
    )
    order = np.argsort(keys)
    return keys[order], ids[order]


def rule_ids(source: Source, keys: np.ndarray, listed: int) -> list[int]:
    """The ids of the rules `source` lists under `keys` now (a key it no longer lists
    has none), `listed`: about how many it lists (a large share is read whole)."""
    if not len(keys):
        return []
    if len(keys) > _WHOLE * listed:
        all_keys, ids = listed_now(source)
        at = np.searchsorted(all_keys, keys)
        at[at == len(all_keys)] = 0
        found = (all_keys[at] == keys) if len(all_keys) else np.zeros(len(keys), dtype=bool)
        return ids[at[found]].tolist()
    connection = connections[router.db_for_read(RuleSource)]
    if database.postgresql(connection):
        # One statement with one array parameter: no index finds a listing by its key
        # (migration 0019 dropped it, a cost per row of a feed's first load), so each
        # statement reads the listings once, the keys hashed; batches would each
        # read them again.
        qn = connection.ops.quote_name
        table, key = qn(RuleSource._meta.db_table), qn("key")
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT rule_id FROM {table} WHERE source_id = %s AND {key} = ANY(%s::bigint[])",
                [source.pk, keys.tolist()],
            )
            return [row[0] for row in cursor.fetchall()]
    found_ids: list[int] = []
    for start in range(0, len(keys), _BATCH):
        part = keys[start : start + _BATCH].tolist()
        found_ids.extend(
            RuleSource.objects.filter(source=source, key__in=part).values_list("rule_id", flat=True)
        )
    return found_ids
