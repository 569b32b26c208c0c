"""Reading what a source lists now (its RuleSource rows) as two numpy arrays, the
64-bit expression keys and the rule ids, sorted by key: the other side of a
refresh's diff."""

from __future__ import annotations

import numpy as np

from urlguard.models import RuleSource, Source
from urlguard.runtime import database

__all__ = ["listed_now"]

_FETCH_ROWS = 20_000


def listed_now(source: Source) -> tuple[np.ndarray, np.ndarray]:
    """(keys, rule ids) of what `source` lists now, sorted by key."""
    keys, ids = database.int64_columns(
        RuleSource, ("key", "rule_id"), fetch=_FETCH_ROWS, source_id=source.pk
    )
    order = np.argsort(keys)
    return keys[order], ids[order]
