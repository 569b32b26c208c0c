"""rpz.zone: a DNS Response Policy Zone (BIND, Unbound, PowerDNS Recursor, Knot): a
whole-host rule is two records, `host CNAME .` and `*.host CNAME .` (NXDOMAIN for it
and its subdomains); an allowlisted host is `host CNAME rpz-passthru.`. The serial is
the change-log position. serve_dns transfers the same records (AXFR/IXFR)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from urlguard.conf import conf
from urlguard.exports.base import ADDRESSES, PATHS, Export
from urlguard.exports.projection import Position, Snapshot, host_rule, is_address

__all__ = ["SERIAL_HALF", "RpzExport", "rpz_records", "serial", "serial_behind", "soa_rdata"]

NONAME = "noname"
_LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")
TTL = 300
PASSTHRU = "rpz-passthru."
BLOCK = "."


def serial(seq: int) -> int:
    """The zone serial of a change-log position (RFC 1982 arithmetic wraps at 2**32)."""
    return seq % (1 << 32)


#: Serials this far apart have no order (RFC 1982 section 3.2); further is ahead.
SERIAL_HALF = 1 << 31


def serial_behind(serial_number: int, seq: int) -> int:
    """How far a secondary's `serial_number` is behind the zone's serial at position
    `seq` in serial arithmetic (RFC 1982): 0 the same; below SERIAL_HALF behind by
    that many positions; above it, ahead; exactly SERIAL_HALF, undefined."""
    return (serial(seq) - serial_number) % (1 << 32)


def soa_rdata(zone: str, seq: int) -> str:
    return f"ns.{zone} hostmaster.{zone} {serial(seq)} 60 30 86400 {TTL}"


def rpz_records(expression: str, zone: str) -> list[tuple[str, str]] | str:
    """[(owner, CNAME target)] of one rule, or why RPZ cannot carry it."""
    host = host_rule(expression)
    if host is None:
        return PATHS
    if is_address(host):
        return ADDRESSES
    if len(host) + 2 + len(zone) > 253 or not all(_LABEL.fullmatch(x) for x in host.split(".")):
        return NONAME
    owner = f"{host}.{zone}"
    return [(owner, BLOCK), (f"*.{owner}", BLOCK)]


def passthru_records(host: str, zone: str) -> list[tuple[str, str]]:
    if len(host) + 1 + len(zone) > 253 or not all(_LABEL.fullmatch(x) for x in host.split(".")):
        return []
    return [(f"{host}.{zone}", PASSTHRU)]


class RpzExport(Export):
    name = "rpz.zone"
    title = "urlguard response policy zone"
    content_type = "text/dns; charset=utf-8"
    comment = ";"
    omissions = {
        PATHS: "path and page rules: DNS sees host names only",
        ADDRESSES: "rules on IP addresses: a link to an address makes no DNS query",
        NONAME: "hosts that are not valid DNS names",
    }

    def __init__(self) -> None:
        self.zone = ""

    def prepare(self, snapshot: Snapshot) -> None:
        self.zone = conf.DNS_RPZ_ZONE.lower()

    def preamble(self, position: Position) -> list[str]:
        zone = conf.DNS_RPZ_ZONE.lower()
        return [
            f"$ORIGIN {zone}",
            f"$TTL {TTL}",
            f"@ SOA {soa_rdata(zone, position.seq)}",
            f"@ NS ns.{zone}",
        ]

    def exception_lines(self, snapshot: Snapshot) -> Iterable[str]:
        for host in snapshot.exceptions:
            for owner, target in passthru_records(host, self.zone):
                yield f"{owner} CNAME {target}"

    def rule_lines(self, expression: str, category: str) -> list[str] | str:
        records = rpz_records(expression, self.zone)
        if isinstance(records, str):
            return records
        return [f"{owner} CNAME {target}" for owner, target in records]
