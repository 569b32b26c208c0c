"""filterengine: Bloom-filter structures for spam-URL lookup (numpy + mmh3, no Django).

The heart is ScalingCountingBloomFilter, a dablooms-style scaling counting Bloom
filter in a memory-mapped file; beside it the plain, counting, scalable,
opposite, time-to-live and persistent filters."""

from filterengine.opposite import OppositeBloomFilter  # noqa: E402  (VARIANTS)
from filterengine.continuous import ContinuousBloomFilter, RotatingBloomFilter  # noqa: E402  (VARIANTS)
