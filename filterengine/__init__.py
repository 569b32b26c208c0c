"""filterengine: Bloom-filter structures for spam-URL lookup (numpy + mmh3, no Django).

The heart is ScalingCountingBloomFilter, a dablooms-style scaling counting Bloom
filter in a memory-mapped file; beside it the plain, counting, scalable,
opposite, time-to-live and persistent filters."""

from .bloom import BloomFilter
from .continuous import ContinuousBloomFilter, RotatingBloomFilter
from .counting import CountingBloomFilter
from .errors import FilterFileError, FilterLockedError, FilterSpaceError
from .hashing import hash_pair, hash_pairs
from .locking import acquire_lock, release_lock
from .mapping import FileIdentity
from .opposite import OppositeBloomFilter
from .persistent import PersistentBloomFilter
from .scalable import ScalableBloomFilter
from .scaling import ScalingCountingBloomFilter
from .status import FileStatus, file_status, writer_active, writer_lock_path

__all__ = [
    "BloomFilter",
    "ContinuousBloomFilter",
    "CountingBloomFilter",
    "FileIdentity",
    "FileStatus",
    "FilterFileError",
    "FilterLockedError",
    "FilterSpaceError",
    "OppositeBloomFilter",
    "PersistentBloomFilter",
    "RotatingBloomFilter",
    "ScalableBloomFilter",
    "ScalingCountingBloomFilter",
    "acquire_lock",
    "file_status",
    "hash_pair",
    "hash_pairs",
    "release_lock",
    "writer_active",
    "writer_lock_path",
]
