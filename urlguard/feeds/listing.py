"""Reading what a source lists now (its RuleSource rows): the 64-bit expression keys,
sorted, the other side of a refresh's diff, and the rule id of each, which the
refresh withdraws by."""

from __future__ import annotations

import numpy as np

from urlguard.models import RuleSource, Source
from urlguard.runtime import database

__all__ = ["listed_now"]

_FETCH_ROWS = 20_000


def listed_now(source: Source) -> tuple[np.ndarray, np.ndarray]:
    """(keys, rule ids) of what `source` lists now, sorted by key: one read of its
    listings (no index finds a listing by its key, so a later lookup of the keys
    that left would read them all again)."""
    keys, ids = database.int64_columns(
        RuleSource, ("key", "rule_id"), fetch=_FETCH_ROWS, source_id=source.pk
    )
    order = np.argsort(keys)
    return keys[order], ids[order]
