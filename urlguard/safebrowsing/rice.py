"""Rice-Golomb coding of a sorted list of integers, as Safe Browsing v4 sends 4-byte
prefixes and removal indices: the first value on its own, then each difference to the
one before as a quotient in unary (that many 1 bits, then a 0) and a remainder in
`k` bits, every bit written from the least significant bit of each byte up. Both
directions work on numpy arrays: a million values is a few vector passes."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["MAX_PARAMETER", "Encoded", "RiceError", "decode", "encode", "parameter"]

#: The protocol's range for the parameter.
MIN_PARAMETER, MAX_PARAMETER = 2, 28


class RiceError(ValueError):
    """Encoded data that does not hold the values it claims."""


class Encoded(NamedTuple):
    first_value: int
    parameter: int
    num_entries: int
    data: bytes


def parameter(deltas: np.ndarray) -> int:
    """The k that codes these differences in about the fewest bits: the remainder takes
    k bits, so k near log2 of the mean difference leaves about one bit of quotient."""
    if not len(deltas):
        return MIN_PARAMETER
    mean = float(deltas.mean())
    k = int(np.floor(np.log2(max(mean * 0.69, 1.0))))
    return min(max(k, MIN_PARAMETER), MAX_PARAMETER)


def encode(values: np.ndarray) -> Encoded:
    """`values` (sorted ascending, non-negative, below 2**32) Rice-coded."""
    values = np.asarray(values, dtype=np.int64)
    if not len(values):
        raise ValueError("nothing to encode: the protocol has no empty encoding")
    deltas = np.diff(values)
    if len(deltas) and int(deltas.min()) < 0:
        raise ValueError("values must be sorted")
    k = parameter(deltas)
    quotients = deltas >> k
    remainders = deltas & ((1 << k) - 1)
    widths = quotients + 1 + k
    starts = np.zeros(len(deltas), dtype=np.int64)
    if len(deltas) > 1:
        np.cumsum(widths[:-1], out=starts[1:])
    total = int(widths.sum())
    bits = np.zeros(total, dtype=np.uint8)
    ones = int(quotients.sum())
    if ones:
        # The unary run of each value: positions start .. start + q - 1.
        run_starts = np.repeat(starts - (np.cumsum(quotients) - quotients), quotients)
        bits[run_starts + np.arange(ones, dtype=np.int64)] = 1
    offsets = starts + quotients + 1
    for bit in range(k):
        bits[offsets + bit] = (remainders >> bit) & 1
    data = np.packbits(bits, bitorder="little").tobytes()
    return Encoded(int(values[0]), k, len(deltas), data)


def decode(first_value: int, k: int, num_entries: int, data: bytes) -> np.ndarray:
    """The values (first_value included) coded by `encode`."""
    if num_entries < 0 or first_value < 0:
        raise RiceError("a negative count or first value")
    if num_entries == 0:
        return np.array([first_value], dtype=np.int64)
    if not MIN_PARAMETER <= k <= 32:
        raise RiceError(f"Rice parameter {k} is out of range")
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")
    zeros = np.flatnonzero(bits == 0)
    out = np.empty(num_entries + 1, dtype=np.int64)
    out[0] = first_value
    position = 0
    # Each value: its unary run ends at the next 0 bit; the remainder follows it.
    for i in range(num_entries):
        at = np.searchsorted(zeros, position)
        if at >= len(zeros):
            raise RiceError("the data ends inside a value")
        end = int(zeros[at])
        q = end - position
        tail = end + 1 + k
        if tail > len(bits):
            raise RiceError("the data ends inside a value")
        r = int(np.dot(bits[end + 1 : tail].astype(np.int64), 1 << np.arange(k, dtype=np.int64)))
        out[i + 1] = out[i] + (q << k) + r
        position = tail
    return out
