"""A small DNS client for the serve_dns tests: one UDP question, or a whole zone
transfer over TCP (as a list of RRsets, in order)."""

from __future__ import annotations

import socket
import struct

import dns.exception
import dns.message
import dns.name
import dns.query
import dns.rdatatype
import dns.rrset


def ask(port: int, name: str, rdtype: str = "A", *, timeout: float = 2.0) -> dns.message.Message:
    """Retried like a resolver does: the embedded test database (SQLite, shared
    between threads) can be locked for a moment by the test's own writes."""
    query = dns.message.make_query(name, rdtype)
    for _attempt in range(2):
        try:
            return dns.query.udp(query, "127.0.0.1", port=port, timeout=timeout)
        except dns.exception.Timeout:
            continue
    return dns.query.udp(query, "127.0.0.1", port=port, timeout=timeout)


def transfer(
    port: int, zone: str, rdtype: str = "AXFR", serial: int | None = None
) -> list[dns.rrset.RRset]:
    query = dns.message.make_query(zone, rdtype)
    if serial is not None:
        query.authority.append(dns.rrset.from_text(zone, 0, "IN", "SOA", f". . {serial} 0 0 0 0"))
    wire = query.to_wire()
    rrsets: list[dns.rrset.RRset] = []
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(struct.pack("!H", len(wire)) + wire)
        reader = sock.makefile("rb")
        while True:
            size = struct.unpack("!H", reader.read(2))[0]
            message = dns.message.from_wire(reader.read(size), one_rr_per_rrset=True)
            if message.rcode() != 0:
                return [message]  # type: ignore[list-item]
            rrsets.extend(message.answer)
            if _complete(rrsets):
                return rrsets


def _complete(rrsets: list[dns.rrset.RRset]) -> bool:
    soa = dns.rdatatype.SOA
    new = rrsets[0][0].serial
    seen = sum(1 for r in rrsets if r.rdtype == soa and r[0].serial == new)
    if len(rrsets) == 1:
        return True  # up to date (or the first message of many: then more follow)
    incremental = rrsets[1].rdtype == soa and rrsets[1][0].serial != new
    return seen >= (3 if incremental else 2)
