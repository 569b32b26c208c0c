"""The client address as the rate limits count it: an IPv4 address as it is, an IPv6
address by its /64, the one network a subscriber gets and picks addresses in at will
(counting per /128 would let one host send from 2**64 "different" addresses)."""

from __future__ import annotations

import ipaddress

from django.http import HttpRequest

__all__ = ["client_lockout_address", "client_network"]


def _network(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Network | None:
    try:
        parsed = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return parsed.ipv4_mapped
        return ipaddress.IPv6Network((parsed, 64), strict=False)
    return parsed


def client_network(request: HttpRequest) -> str:
    """REMOTE_ADDR, or its /64 for IPv6 (behind a proxy, the visitor's once
    TrustedProxyMiddleware has run: urlguard.runtime.trustedproxy)."""
    address = str(request.META.get("REMOTE_ADDR") or "")
    network = _network(address)
    if network is None:
        return address or "unknown"
    return str(network)


def client_lockout_address(request: HttpRequest) -> str | None:
    """The same network as one IP address, for django-axes' AXES_CLIENT_IP_CALLABLE:
    an IPv4 address as it is, an IPv6 one as the first address of its /64 (its
    lock-out table stores addresses, not networks), None without a usable address."""
    network = _network(str(request.META.get("REMOTE_ADDR") or ""))
    if isinstance(network, ipaddress.IPv6Network):
        return str(network.network_address)
    return None if network is None else str(network)
