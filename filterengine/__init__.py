"""filterengine: Bloom-filter structures for spam-URL lookup (numpy + mmh3, no Django).

The heart is ScalingCountingBloomFilter, a dablooms-style scaling counting Bloom
filter in a memory-mapped file; beside it the plain, counting, scalable,
opposite, time-to-live and persistent filters."""

from .bloom import BloomFilter
from .counting import CountingBloomFilter
from .errors import FilterFileError, FilterLockedError
from .hashing import hash_pair, hash_pairs
from .scaling import ScalingCountingBloomFilter

__all__ = [
    "BloomFilter",
    "CountingBloomFilter",
    "FilterFileError",
    "FilterLockedError",
    "ScalingCountingBloomFilter",
    "hash_pair",
    "hash_pairs",
]

# VARIANTS (issue 5): appended, keep these lines when editing above.
from .continuous import ContinuousBloomFilter, RotatingBloomFilter  # noqa: E402
from .opposite import OppositeBloomFilter  # noqa: E402
from .persistent import PersistentBloomFilter  # noqa: E402

__all__ += [
    "ContinuousBloomFilter",
    "OppositeBloomFilter",
    "PersistentBloomFilter",
    "RotatingBloomFilter",
]
from .scalable import ScalableBloomFilter  # noqa: E402

__all__ += ["ScalableBloomFilter"]
