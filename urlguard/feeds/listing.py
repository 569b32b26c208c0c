"""Reading what a source lists now (its RuleSource rows): the 64-bit expression keys,
sorted, the other side of a refresh's diff. The rule ids of keys (what a plan's
withdrawals need) are the write path's: urlguard.writepath.listings."""

from __future__ import annotations

import numpy as np

from urlguard.models import RuleSource, Source, database
from urlguard.writepath.listings import listed_now, rule_ids

__all__ = ["listed_keys", "listed_now", "rule_ids"]


def listed_keys(source: Source) -> np.ndarray:
    """The keys of what `source` lists now, sorted (half the rows' bytes of
    listed_now, and a sort where listed_now needs an argsort and two gathers), read a
    part at a time."""
    return database.sorted_int64_column(RuleSource, "key", source_id=source.pk)
