"""Response-rate limiting of the DNS server's UDP answers (urlguard.exports.dnsserver):
a token bucket per client network, so the server cannot be used for amplification."""

from __future__ import annotations

import ipaddress
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["RATE_LIMIT_NETWORKS", "RateLimiter"]

#: Client networks the UDP rate limiter keeps buckets for (~260 bytes each: 4 MB).
RATE_LIMIT_NETWORKS = 16_384


@dataclass
class RateLimiter:
    """Token buckets per client network (/24, /56): `rate` answers a second, as many
    in a burst. Beyond it, every second answer is sent truncated (a real client
    retries over TCP, which cannot be spoofed) and the others dropped. At most
    `capacity` networks are kept, the one seen least recently making room: O(1) a
    packet, bounded memory whatever addresses a flood claims."""

    rate: int
    clock: Callable[[], float] = time.monotonic
    capacity: int = RATE_LIMIT_NETWORKS
    _buckets: OrderedDict[int, tuple[float, float]] = field(default_factory=OrderedDict)
    _slip: int = 0

    def allow(self, address: str) -> str:
        """'answer', 'slip' (send truncated) or 'drop'."""
        key = network_key(address)
        now = self.clock()
        buckets = self._buckets
        entry = buckets.get(key)
        if entry is None:
            tokens = float(self.rate)
            if len(buckets) >= self.capacity:
                # Seen least recently: its bucket is the likeliest to be full anyway.
                buckets.popitem(last=False)
        else:
            tokens = min(float(self.rate), entry[0] + (now - entry[1]) * self.rate)
            buckets.move_to_end(key)
        if tokens >= 1:
            buckets[key] = (tokens - 1, now)
            return "answer"
        buckets[key] = (tokens, now)
        self._slip += 1
        return "slip" if self._slip % 2 else "drop"


def network_key(address: str) -> int:
    """The client's network as one int: an IPv4 /24 (an IPv4-mapped address too), or
    an IPv6 /56 marked above any /24."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is None:
            return (1 << 60) | (int(ip) >> 72)
        ip = ip.ipv4_mapped
    return int(ip) >> 8
