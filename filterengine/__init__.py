"""filterengine: Bloom-filter structures for spam-URL lookup (numpy + mmh3, no Django).

The heart is ScalingCountingBloomFilter, a dablooms-style scaling counting Bloom
filter in a memory-mapped file; beside it the plain, counting, scalable,
opposite, time-to-live and persistent filters."""

from .bloom import BloomFilter
from .errors import FilterFileError, FilterLockedError
from .hashing import hash_pair, hash_pairs

__all__ = [
    "BloomFilter",
    "FilterFileError",
    "FilterLockedError",
    "hash_pair",
    "hash_pairs",
]
