"""The client address as the rate limits count it: an IPv4 address as it is, an IPv6
address by its /64, the one network a subscriber gets and picks addresses in at will
(counting per /128 would let one host send from 2**64 "different" addresses)."""

from __future__ import annotations

import ipaddress

from django.http import HttpRequest

__all__ = ["client_network"]


def client_network(request: HttpRequest) -> str:
    """REMOTE_ADDR, or its /64 for IPv6 (behind a proxy, the visitor's once
    TrustedProxyMiddleware has run: urlguard.runtime.trustedproxy)."""
    address = str(request.META.get("REMOTE_ADDR") or "")
    try:
        parsed = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address or "unknown"
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.IPv6Network((parsed, 64), strict=False))
    return str(parsed)
