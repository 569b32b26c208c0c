"""Which IP addresses are on the public internet: for a feed fetch (connect only to
public addresses) and for a rule (a rule on an address outside it only ever blocks
this service's own network). An IPv6 address that carries an IPv4 one (mapped,
6to4, Teredo, NAT64) is judged by the address it carries. A fetch follows the IANA
special-purpose registries (urlguard.runtime.specialpurpose). Framework-free."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from urlguard.runtime.specialpurpose import special_purpose

__all__ = ["IPAddress", "IPNetwork", "embedded", "non_public_kind", "refused_for_fetching"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Private networks (RFC 1918, shared address space RFC 6598, unique local IPv6).
# Not ipaddress's is_private, which also counts documentation ranges (rules on those
# are harmless and tests use them).
_PRIVATE = tuple(
    ipaddress.ip_network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
)
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")
_BENCHMARK = ipaddress.ip_network("198.18.0.0/15")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def embedded(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, Teredo client, NAT64), or
    the address itself."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.sixtofour is not None:
            return address.sixtofour
        if address.teredo is not None:
            return address.teredo[1]
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def non_public_kind(address: IPAddress) -> str | None:
    """What kind of non-public address `address` is ("a loopback", "a private", ...),
    None for an address on the public internet (documentation ranges included)."""
    inner = embedded(address)
    if inner.is_loopback:
        return "a loopback"
    if inner.is_link_local:
        return "a link-local"
    if inner.is_unspecified:
        return "the unspecified"
    if inner in _THIS_NETWORK:
        return "a this-network (0.0.0.0/8)"
    if inner.is_multicast:
        return "a multicast"
    if isinstance(inner, ipaddress.IPv4Address) and int(inner) == 0xFFFFFFFF:
        return "the broadcast"
    if inner.is_reserved:
        return "a reserved"
    if inner in _BENCHMARK:
        return "a benchmark-testing"
    if any(inner in network for network in _PRIVATE):
        return "a private"
    return None


def refused_for_fetching(address: IPAddress, allowed: Iterable[IPNetwork] = ()) -> str | None:
    """Why a feed fetch may not connect to `address` (None: it may): anything in a
    block of the IANA special-purpose registries that is not globally reachable,
    multicast or site-local, unless a network of `allowed` (FEED_ALLOWED_NETWORKS) names it."""
    if any(address.version == net.version and address in net for net in allowed):
        return None
    kind = non_public_kind(address)
    inner = embedded(address)
    entry = special_purpose(inner)
    if kind is None and entry is not None and entry.reachable is False:
        kind = f"a special-purpose ({entry.name}, {entry.rfc})"
    # Not in the special-purpose registry but withdrawn (RFC 3879), never routed.
    if kind is None and isinstance(inner, ipaddress.IPv6Address) and inner.is_site_local:
        kind = "a deprecated site-local"
    if kind is None:
        return None
    return f"{address} is {kind} address, not one on the public internet"
