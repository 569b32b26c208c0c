"""The IANA special-purpose address registries, whole, as one table: which blocks are
set aside for a purpose and whether an address in them is globally reachable. A feed
fetch connects only to addresses that are (urlguard.runtime.addresses). Framework-free.

Source: IANA, "IPv4 Special-Purpose Address Registry"
(https://www.iana.org/assignments/iana-ipv4-special-registry/) and "IPv6
Special-Purpose Address Registry"
(https://www.iana.org/assignments/iana-ipv6-special-registry/), RFC 6890 as updated
by RFC 8190; every entry as of 2025 (the last ones added: 3fff::/20, RFC 9637;
5f00::/16, RFC 9602; 100:0:0:1::/64, RFC 9780). The "Globally Reachable" column is
`reachable`; None where the registry says N/A because the block carries another
address (Teredo, 6to4), which is then judged instead. A block the registry marks
deprecated counts as not reachable: nothing legitimate is served from it.
Python's ipaddress follows an older copy of the registries, so it is not used here."""

from __future__ import annotations

import ipaddress
from typing import NamedTuple

__all__ = ["SPECIAL_PURPOSE", "SpecialPurpose", "special_purpose"]


class SpecialPurpose(NamedTuple):
    network: ipaddress.IPv4Network | ipaddress.IPv6Network
    name: str
    rfc: str
    reachable: bool | None


def _entry(block: str, name: str, rfc: str, reachable: bool | None) -> SpecialPurpose:
    return SpecialPurpose(ipaddress.ip_network(block), name, rfc, reachable)


SPECIAL_PURPOSE: tuple[SpecialPurpose, ...] = (
    # IPv4
    _entry("0.0.0.0/8", "this network", "RFC 791", False),
    _entry("0.0.0.0/32", "this host on this network", "RFC 1122", False),
    _entry("10.0.0.0/8", "private-use", "RFC 1918", False),
    _entry("100.64.0.0/10", "shared address space", "RFC 6598", False),
    _entry("127.0.0.0/8", "loopback", "RFC 1122", False),
    _entry("169.254.0.0/16", "link-local", "RFC 3927", False),
    _entry("172.16.0.0/12", "private-use", "RFC 1918", False),
    _entry("192.0.0.0/24", "IETF protocol assignments", "RFC 6890", False),
    _entry("192.0.0.0/29", "IPv4 service continuity prefix", "RFC 7335", False),
    _entry("192.0.0.8/32", "IPv4 dummy address", "RFC 7600", False),
    _entry("192.0.0.9/32", "Port Control Protocol anycast", "RFC 7723", True),
    _entry("192.0.0.10/32", "TURN anycast", "RFC 8155", True),
    _entry("192.0.0.170/32", "NAT64/DNS64 discovery", "RFC 8880", False),
    _entry("192.0.0.171/32", "NAT64/DNS64 discovery", "RFC 8880", False),
    _entry("192.0.2.0/24", "documentation (TEST-NET-1)", "RFC 5737", False),
    _entry("192.31.196.0/24", "AS112-v4", "RFC 7535", True),
    _entry("192.52.193.0/24", "AMT", "RFC 7450", True),
    _entry("192.88.99.0/24", "deprecated 6to4 relay anycast", "RFC 7526", False),
    _entry("192.88.99.2/32", "6a44 relay anycast", "RFC 6751", True),
    _entry("192.168.0.0/16", "private-use", "RFC 1918", False),
    _entry("192.175.48.0/24", "direct delegation AS112 service", "RFC 7534", True),
    _entry("198.18.0.0/15", "benchmarking", "RFC 2544", False),
    _entry("198.51.100.0/24", "documentation (TEST-NET-2)", "RFC 5737", False),
    _entry("203.0.113.0/24", "documentation (TEST-NET-3)", "RFC 5737", False),
    _entry("240.0.0.0/4", "reserved", "RFC 1112", False),
    _entry("255.255.255.255/32", "limited broadcast", "RFC 8190", False),
    # IPv6
    _entry("::1/128", "loopback", "RFC 4291", False),
    _entry("::/128", "unspecified", "RFC 4291", False),
    _entry("::ffff:0:0/96", "IPv4-mapped", "RFC 4291", None),
    _entry("64:ff9b::/96", "IPv4-IPv6 translation", "RFC 6052", None),
    _entry("64:ff9b:1::/48", "local-use IPv4-IPv6 translation", "RFC 8215", False),
    _entry("100::/64", "discard-only", "RFC 6666", False),
    _entry("100:0:0:1::/64", "dummy IPv6 prefix", "RFC 9780", False),
    _entry("2001::/23", "IETF protocol assignments", "RFC 2928", False),
    _entry("2001::/32", "Teredo", "RFC 4380", None),
    _entry("2001:1::1/128", "Port Control Protocol anycast", "RFC 7723", True),
    _entry("2001:1::2/128", "TURN anycast", "RFC 8155", True),
    _entry("2001:1::3/128", "DNS-SD service registration protocol anycast", "RFC 9665", True),
    _entry("2001:2::/48", "benchmarking", "RFC 5180", False),
    _entry("2001:3::/32", "AMT", "RFC 7450", True),
    _entry("2001:4:112::/48", "AS112-v6", "RFC 7535", True),
    _entry("2001:10::/28", "deprecated ORCHID", "RFC 4843", False),
    _entry("2001:20::/28", "ORCHIDv2", "RFC 7343", True),
    _entry("2001:30::/28", "drone remote ID entity tags", "RFC 9374", True),
    _entry("2001:db8::/32", "documentation", "RFC 3849", False),
    _entry("2002::/16", "6to4", "RFC 3056", None),
    _entry("2620:4f:8000::/48", "direct delegation AS112 service", "RFC 7534", True),
    _entry("3fff::/20", "documentation", "RFC 9637", False),
    _entry("5f00::/16", "segment routing (SRv6) SIDs", "RFC 9602", False),
    _entry("fc00::/7", "unique-local", "RFC 4193", False),
    _entry("fe80::/10", "link-local unicast", "RFC 4291", False),
)

# Most specific first, so the first block that holds an address is its entry (the
# registry's /32 anycast addresses inside a /24 or /23 that is not reachable).
_BY_SPECIFICITY = sorted(SPECIAL_PURPOSE, key=lambda e: -e.network.prefixlen)


def special_purpose(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> SpecialPurpose | None:
    """The most specific registry entry that holds `address`, or None."""
    for entry in _BY_SPECIFICITY:
        if entry.network.version == address.version and address in entry.network:
            return entry
    return None
