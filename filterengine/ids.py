"""The ids that route a ScalingCountingBloomFilter's additions and removals to its
stages: signed 64-bit ints (e.g. microsecond timestamps), checked at the door so a
float, a bool or an overflowing int never reaches the file."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

__all__ = ["INT64_MAX", "INT64_MIN", "checked_id", "id_array"]

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def checked_id(value: object) -> int:
    """``value`` as a Python int; TypeError for a non-int, ValueError past 64 bits."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(
            f"ids must be int (e.g. microsecond timestamps), not {type(value).__name__}"
        )
    number = int(value)
    if not INT64_MIN <= number <= INT64_MAX:
        raise ValueError(f"id {number} does not fit in a signed 64-bit integer")
    return number


def id_array(ids: Iterable[int] | npt.NDArray[np.integer], n: int) -> npt.NDArray[np.int64]:
    """``ids`` as an int64 array of length ``n`` (one per key), or TypeError/ValueError."""
    if not isinstance(ids, np.ndarray):
        values = list(ids)
        for value in values:
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise TypeError(f"ids must be int, not {type(value).__name__}")
        try:
            array = np.array(values, dtype=np.int64)
        except OverflowError:
            raise ValueError("an id does not fit in a signed 64-bit integer") from None
    elif ids.dtype.kind not in "iu":
        raise TypeError(f"ids must be integers, not an array of {ids.dtype}")
    else:
        array = ids.astype(np.int64)
    if array.shape != (n,):
        raise ValueError(f"got {n} keys but {len(array)} ids: pass one id per key")
    return array
