"""The DNS server of `manage.py serve_dns`: authoritative for two zones only (REFUSED
for any other name, never recursion). The RPZ zone is transferred (AXFR, and IXFR from
the change log) to DNS_TRANSFER_NETWORKS, with NOTIFY to DNS_NOTIFY after every
change; the URIBL zone is answered live from the guard. UDP answers are rate-limited
per client network (urlguard.exports.dnsratelimit), TCP connections hold slots
(urlguard.exports.dnstcpslots), and malformed packets are dropped and counted."""

from __future__ import annotations

import contextlib
import io
import ipaddress
import logging
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.query
import dns.rcode
import dns.rdata
import dns.rdataclass
import dns.rdatatype
import dns.rrset
from django.db import DEFAULT_DB_ALIAS, DatabaseError, close_old_connections, connections

from urlguard.conf import conf
from urlguard.exports import uribl
from urlguard.exports.dnsratelimit import RateLimiter
from urlguard.exports.dnstcpslots import (
    MAX_TCP_CLIENTS,
    TCP_PER_CLIENT,
    TCP_RECLAIM_AFTER,
    TCP_TRANSFER_SLOTS,
    TcpSlots,
)
from urlguard.exports.projection import snapshot
from urlguard.exports.rpz import SERIAL_HALF, TTL, serial_behind, soa_rdata
from urlguard.exports.rpzjournal import Record, delta, zone_records
from urlguard.models import ChangeEvent
from urlguard.runtime import metrics
from urlguard.runtime.outage import OutageLog

__all__ = ["DnsConfig", "DnsServer"]

logger = logging.getLogger(__name__)

#: Answers from the URIBL zone are cached this long by resolvers (a new rule reaches
#: mail within it); also the zones' negative-caching TTL.
URIBL_TTL = 60
#: Records per message of a zone transfer (each under 64 KiB).
TRANSFER_CHUNK = 500
#: How often the change log's head is read for NOTIFY, seconds.
NOTIFY_POLL = 1.0
NOTIFY_TRIES = 5
#: Each TCP message, its length included, must arrive within this many seconds of the
#: server starting to wait for it (a client dripping a byte at a time is cut off).
TCP_DEADLINE = 10.0
#: How often the UDP thread looks whether it should stop, seconds (stop() wakes it at once).
UDP_POLL = 0.5
#: How often the TCP listener looks whether it should stop, seconds: socketserver has
#: no way to wake it, and stop() waits for it.
TCP_STOP_POLL = 0.05
#: A database failure that took this long, seconds, is a host that drops packets (a
#: refused connection fails in milliseconds): lookups stop waiting on it.
DATABASE_HANG = 1.0
_HEADER = struct.Struct("!HHHHHH")


@dataclass(frozen=True)
class DnsConfig:
    rpz_zone: str
    uribl_zone: str
    notify: tuple[tuple[str, int], ...] = ()
    transfer_networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    rate_limit: int = 100
    ns_address: str = "127.0.0.1"
    tcp_clients: int = MAX_TCP_CLIENTS
    tcp_per_client: int = TCP_PER_CLIENT
    tcp_transfer_slots: int = TCP_TRANSFER_SLOTS
    tcp_deadline: float = TCP_DEADLINE
    tcp_reclaim_after: float = TCP_RECLAIM_AFTER

    @classmethod
    def from_settings(cls, address: str) -> DnsConfig:

        return cls(
            rpz_zone=conf.DNS_RPZ_ZONE.lower(),
            uribl_zone=conf.DNS_URIBL_ZONE.lower(),
            notify=conf.DNS_NOTIFY,
            transfer_networks=conf.DNS_TRANSFER_NETWORKS,
            rate_limit=conf.DNS_RATE_LIMIT,
            ns_address=address if address not in ("0.0.0.0", "::", "") else "127.0.0.1",
        )


class DnsServer:
    def __init__(self, config: DnsConfig) -> None:
        self.config = config
        self.rpz = dns.name.from_text(config.rpz_zone)
        self.uribl = dns.name.from_text(config.uribl_zone)
        self.limiter = RateLimiter(config.rate_limit)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._udp: socket.socket | None = None
        self._tcp: socketserver.ThreadingTCPServer | None = None
        # The change-log position the server holds (-1: none read yet): the RPZ SOA is
        # answered from it, so a lookup never waits on the database, nor fails with it.
        self.seq = -1
        self.notified_seq = -1
        self.database = OutageLog(logger, "serve_dns: reading the database")
        # The failure of a database that hung (DATABASE_HANG), until the NOTIFY loop's
        # thread reads from it again: meanwhile no lookup waits on it.
        self._database_hung: DatabaseError | None = None
        self._soas: dict[tuple[dns.name.Name, int], dns.rrset.RRset] = {}
        self._addresses: dict[str, dns.rdata.Rdata] = {}
        self._soa_wires: dict[int, bytes] = {}
        self._uribl_labels = tuple(x.lower() for x in self.uribl.labels[:-1])
        self.tcp_slots = TcpSlots(
            may_transfer=self._may_transfer,
            clients=config.tcp_clients,
            per_client=config.tcp_per_client,
            transfer_slots=config.tcp_transfer_slots,
            reclaim_after=config.tcp_reclaim_after,
        )
        # A zone has NS at its apex: BIND refuses a transfer without ("bad zone").
        self._rpz_ns = dns.rrset.from_text(
            self.rpz, TTL, "IN", "NS", dns.name.from_text("ns", self.rpz).to_text()
        )

    # -- answering ---------------------------------------------------------------

    def answer(self, wire: bytes, client: str, *, tcp: bool) -> Iterator[bytes]:
        """The messages to send back for one packet (none: dropped)."""
        fast = self._fast_uribl(wire)
        if fast is not None:
            yield fast
            return
        try:
            query = dns.message.from_wire(wire)
        except Exception:  # any parse failure: bounded work, no answer, counted
            metrics.dns_dropped("malformed")
            return
        if query.flags & dns.flags.QR:
            metrics.dns_dropped("response")
            return
        response = dns.message.make_response(query)
        response.flags &= ~dns.flags.RA
        if query.opcode() != dns.opcode.QUERY:
            yield self._finish(response, dns.rcode.NOTIMP, "other", tcp)
            return
        if len(query.question) != 1:
            yield self._finish(response, dns.rcode.FORMERR, "other", tcp)
            return
        question = query.question[0]
        qname, qtype = question.name.canonicalize(), question.rdtype
        if question.rdclass != dns.rdataclass.IN:
            yield self._finish(response, dns.rcode.REFUSED, "other", tcp)
        elif qname.is_subdomain(self.rpz):
            yield from self._rpz(query, response, qname, qtype, client, tcp)
        elif qname.is_subdomain(self.uribl):
            yield self._uribl(response, qname, qtype, tcp)
        else:
            yield self._finish(response, dns.rcode.REFUSED, "other", tcp)

    def _finish(
        self, response: dns.message.Message, rcode: dns.rcode.Rcode, zone: str, tcp: bool
    ) -> bytes:
        response.set_rcode(rcode)
        metrics.dns_answered(zone, dns.rcode.to_text(rcode))
        limit = 65535 if tcp else max(512, response.request_payload or 512)
        try:
            return response.to_wire(max_size=limit)
        except dns.exception.TooBig:
            response.answer, response.authority, response.additional = [], [], []
            response.flags |= dns.flags.TC
            return response.to_wire()

    def _soa(self, zone: dns.name.Name, seq: int) -> dns.rrset.RRset:
        # Parsing an SOA from text costs ~1 ms: one per zone and serial, kept.
        key = (zone, seq)
        rrset = self._soas.get(key)
        if rrset is None:
            text = soa_rdata(zone.to_text(), seq)
            ttl = TTL if zone == self.rpz else URIBL_TTL
            rrset = dns.rrset.from_text(zone, ttl, "IN", "SOA", text)
            if len(self._soas) > 16:
                self._soas.clear()
            self._soas[key] = rrset
        return rrset

    def _address(self, qname: dns.name.Name, address: str) -> dns.rrset.RRset:
        rdata = self._addresses.get(address)
        if rdata is None:
            rdata = self._addresses[address] = dns.rdata.from_text("IN", "A", address)
        return dns.rrset.from_rdata(qname, URIBL_TTL, rdata)

    def _apex(
        self, response: dns.message.Message, zone: dns.name.Name, qtype: int, seq: int
    ) -> bool:
        """Answer SOA/NS at the apex and the name server's address; True if answered."""
        ns = dns.name.from_text("ns", zone)
        if qtype in (dns.rdatatype.SOA, dns.rdatatype.ANY):
            response.answer.append(self._soa(zone, seq))
        elif qtype == dns.rdatatype.NS:
            response.answer.append(dns.rrset.from_text(zone, TTL, "IN", "NS", ns.to_text()))
        else:
            response.authority.append(self._soa(zone, seq))
        return True

    def _rpz(
        self,
        query: dns.message.Message,
        response: dns.message.Message,
        qname: dns.name.Name,
        qtype: int,
        client: str,
        tcp: bool,
    ) -> Iterator[bytes]:
        response.flags |= dns.flags.AA
        if qtype in (dns.rdatatype.AXFR, dns.rdatatype.IXFR):
            if qname != self.rpz or not self._may_transfer(client):
                metrics.dns_transfer("refused")
                response.flags &= ~dns.flags.AA
                yield self._finish(response, dns.rcode.REFUSED, "rpz", tcp)
                return
            yield from self._transfer(query, response, qtype, tcp)
            return
        seq = self.seq
        if seq < 0:  # no position read yet: the database was down since the start
            response.flags &= ~dns.flags.AA
            yield self._finish(response, dns.rcode.SERVFAIL, "rpz", tcp)
            return
        ns = dns.name.from_text("ns", self.rpz)
        if qname == self.rpz:
            self._apex(response, self.rpz, qtype, seq)
        elif qname == ns and qtype == dns.rdatatype.A:
            response.answer.append(dns.rrset.from_text(ns, TTL, "IN", "A", self.config.ns_address))
        else:
            # The policy records are for transfers, not lookups: NODATA.
            response.authority.append(self._soa(self.rpz, seq))
        yield self._finish(response, dns.rcode.NOERROR, "rpz", tcp)

    def _may_transfer(self, client: str) -> bool:
        try:
            ip = ipaddress.ip_address(client.split("%", 1)[0])
        except ValueError:
            return False
        if ip.version == 6 and ip.ipv4_mapped:
            ip = ip.ipv4_mapped
        return any(ip in network for network in self.config.transfer_networks)

    def _uribl(
        self, response: dns.message.Message, qname: dns.name.Name, qtype: int, tcp: bool
    ) -> bytes:
        response.flags |= dns.flags.AA
        seq = max(self.seq, 0)
        if qname == self.uribl:
            self._apex(response, self.uribl, qtype, seq)
            return self._finish(response, dns.rcode.NOERROR, "uribl", tcp)
        ns = dns.name.from_text("ns", self.uribl)
        if qname == ns:
            if qtype == dns.rdatatype.A:
                response.answer.append(
                    dns.rrset.from_text(ns, URIBL_TTL, "IN", "A", self.config.ns_address)
                )
            return self._finish(response, dns.rcode.NOERROR, "uribl", tcp)
        relative = qname.relativize(self.uribl).to_text()
        try:
            listing = self._lookup(relative)
        except LookupFailed:
            response.flags &= ~dns.flags.AA
            return self._finish(response, dns.rcode.SERVFAIL, "uribl", tcp)
        if listing is None:
            response.authority.append(self._soa(self.uribl, seq))
            return self._finish(response, dns.rcode.NXDOMAIN, "uribl", tcp)
        if qtype in (dns.rdatatype.A, dns.rdatatype.ANY):
            response.answer.append(self._address(qname, listing.address))
        elif qtype == dns.rdatatype.TXT:
            raw = listing.text.encode("utf-8")
            strings = " ".join(
                '"' + raw[i : i + 250].decode("utf-8", "ignore").replace('"', "'") + '"'
                for i in range(0, len(raw), 250)
            )
            response.answer.append(dns.rrset.from_text(qname, URIBL_TTL, "IN", "TXT", strings))
        else:
            response.authority.append(self._soa(self.uribl, seq))
        return self._finish(response, dns.rcode.NOERROR, "uribl", tcp)

    def _fast_uribl(self, wire: bytes) -> bytes | None:
        """The common question, one A record of a name under the URIBL zone (with an
        EDNS OPT record or without), answered without dnspython's parser and renderer,
        which cost most of an answer's time. None: anything else, for the general path."""
        if len(wire) < 17:
            return None
        qid, flags, qdcount, ancount, nscount, arcount = _HEADER.unpack_from(wire)
        if flags & 0xF800 or qdcount != 1 or ancount or nscount or arcount > 1:
            return None  # a response, another opcode, or more than a question
        labels: list[bytes] = []
        at = 12
        while True:
            if at >= len(wire) or wire[at] > 63:
                return None  # truncated, or a compression pointer in a question
            length = wire[at]
            if not length:
                at += 1
                break
            labels.append(wire[at + 1 : at + 1 + length].lower())
            at += 1 + length
        if at + 4 > len(wire) or wire[at : at + 4] != b"\x00\x01\x00\x01":
            return None  # not type A, class IN
        question_end = at + 4
        opt = b""
        if arcount:
            # One OPT record (EDNS version 0): answered with our own.
            rest = wire[question_end:]
            if len(rest) < 11 or rest[:3] != b"\x00\x00\x29" or rest[6] != 0:
                return None
            if 11 + struct.unpack_from("!H", rest, 9)[0] != len(rest):
                return None
            opt = b"\x00\x00\x29" + struct.pack("!HIH", 1232, 0, 0)
        elif question_end != len(wire):
            return None
        zone = self._uribl_labels
        if len(labels) <= len(zone) or tuple(labels[-len(zone) :]) != zone:
            return None  # the apex, or not this zone
        try:
            relative = b".".join(labels[: -len(zone)]).decode("ascii")
        except UnicodeDecodeError:
            return None
        if relative == "ns":
            return None
        extra = 1 if opt else 0
        try:
            listing = self._lookup(relative)
        except LookupFailed:
            metrics.dns_answered("uribl", "SERVFAIL")
            header = _HEADER.pack(
                qid, 0x8000 | (flags & 0x0100) | dns.rcode.SERVFAIL, 1, 0, 0, extra
            )
            return header + wire[12:question_end] + opt
        head = 0x8000 | 0x0400 | (flags & 0x0100)  # QR, AA, RD as asked
        if listing is None:
            metrics.dns_answered("uribl", "NXDOMAIN")
            soa = self._soa_wire(max(self.seq, 0))
            header = _HEADER.pack(qid, head | dns.rcode.NXDOMAIN, 1, 0, 1, extra)
            return header + wire[12:question_end] + soa + opt
        metrics.dns_answered("uribl", "NOERROR")
        address = socket.inet_aton(listing.address)
        # The owner is a pointer to the question's name (offset 12): its case kept.
        record = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, URIBL_TTL, 4) + address
        header = _HEADER.pack(qid, head, 1, 1, 0, extra)
        return header + wire[12:question_end] + record + opt

    def _lookup(self, relative: str) -> uribl.Listing | None:
        """uribl.lookup, once more on a new connection when the database dropped this
        thread's (a restart of PostgreSQL: the first query after it is answered too)."""
        for attempt in (1, 2):
            hung = self._database_hung
            if hung is not None:
                # Else every listed name's lookup waits out the database, and the SOA
                # (the health check) queues behind them on the UDP thread.
                self.database.failed(hung)
                raise LookupFailed from hung
            started = time.monotonic()
            try:
                listing = uribl.lookup(relative)
            except uribl.Unchecked as exc:
                raise LookupFailed from exc  # the guard logs it, rate-limited
            except DatabaseError as exc:
                if attempt == 1 and _drop_dead_connection():
                    continue
                if time.monotonic() - started >= DATABASE_HANG:
                    self._database_hung = exc
                self.database.failed(exc)
                raise LookupFailed from exc
            except Exception as exc:
                logger.exception("serve_dns: looking up %s failed", relative)
                raise LookupFailed from exc
            if listing is not None and listing.rule is not None:
                self.database.recovered()  # the table confirmed it: the database answers
            return listing
        raise AssertionError("unreachable")

    def _soa_wire(self, seq: int) -> bytes:
        cached = self._soa_wires.get(seq)
        if cached is None:
            out = io.BytesIO()
            self._soa(self.uribl, seq).to_wire(out)
            cached = out.getvalue()
            if len(self._soa_wires) > 16:
                self._soa_wires.clear()
            self._soa_wires[seq] = cached
        return cached

    # -- zone transfers ----------------------------------------------------------

    def _transfer(
        self, query: dns.message.Message, response: dns.message.Message, qtype: int, tcp: bool
    ) -> Iterator[bytes]:
        client_serial = None
        if qtype == dns.rdatatype.IXFR:
            for rrset in query.authority:
                if rrset.rdtype == dns.rdatatype.SOA and len(rrset):
                    client_serial = rrset[0].serial
        with snapshot() as snap:
            seq = snap.position.seq
            self.seq = max(self.seq, seq)
            soa = self._soa(self.rpz, seq)
            zone = self.config.rpz_zone
            old_seq = None
            if client_serial is not None:
                behind = serial_behind(client_serial, seq)
                if behind == 0 or behind > SERIAL_HALF:
                    # Up to date, or newer than this zone: one SOA (RFC 1995 section 2).
                    metrics.dns_transfer("ixfr")
                    response.answer.append(soa)
                    yield self._finish(response, dns.rcode.NOERROR, "rpz", tcp)
                    return
                if behind < SERIAL_HALF and seq - behind >= 0:
                    old_seq = seq - behind
            if not tcp:
                # IXFR over UDP: the SOA alone tells the client to come over TCP.
                response.answer.append(soa)
                yield self._finish(response, dns.rcode.NOERROR, "rpz", tcp)
                return
            changes = delta(snap, old_seq, zone) if old_seq is not None else None
            if changes is not None and old_seq is not None:
                metrics.dns_transfer("ixfr")
                old_soa = self._soa(self.rpz, old_seq)
                parts: list[dns.rrset.RRset | Record] = [soa, old_soa]
                parts += changes.deleted
                parts.append(soa)
                parts += changes.added
                parts.append(soa)
                yield from self._messages(query, iter(parts))
                return
            metrics.dns_transfer("ixfr_full" if qtype == dns.rdatatype.IXFR else "axfr")

            def everything() -> Iterator[dns.rrset.RRset | Record]:
                yield soa
                yield self._rpz_ns
                yield from zone_records(snap, zone)
                yield soa

            yield from self._messages(query, everything())

    def _messages(
        self, query: dns.message.Message, parts: Iterator[dns.rrset.RRset | Record]
    ) -> Iterator[bytes]:
        """The transfer's messages, written straight to wire format: a million-rule
        zone is two million records, and dnspython's renderer costs ~100 us each."""
        question = query.question[0]
        head = struct.pack(
            "!HH",
            query.id,
            0x8000 | 0x0400 | (query.flags & 0x7800) | (query.flags & dns.flags.RD),
        )
        qwire = bytes(question.name.to_wire() or b"") + struct.pack(
            "!HH", question.rdtype, question.rdclass
        )
        fixed = struct.pack("!HHI", dns.rdatatype.CNAME, dns.rdataclass.IN, TTL)
        targets: dict[str, bytes] = {}
        chunk: list[bytes] = []
        size = 0
        for part in parts:
            if isinstance(part, tuple):
                owner, target = part
                rdata = targets.get(target)
                if rdata is None:
                    rdata = targets[target] = _name_wire(target)
                wire = _name_wire(owner) + fixed + struct.pack("!H", len(rdata)) + rdata
            else:
                out = io.BytesIO()
                part.to_wire(out)
                wire = out.getvalue()
            chunk.append(wire)
            size += len(wire)
            if len(chunk) >= TRANSFER_CHUNK or size > 48_000:
                yield head + struct.pack("!HHHH", 1, len(chunk), 0, 0) + qwire + b"".join(chunk)
                chunk, size = [], 0
        if chunk:
            yield head + struct.pack("!HHHH", 1, len(chunk), 0, 0) + qwire + b"".join(chunk)

    # -- NOTIFY ------------------------------------------------------------------

    def notify_once(self) -> None:
        """Read the log's head into the position the server holds; send NOTIFY to every
        secondary if it moved since the last time."""
        seq = ChangeEvent.objects.head()
        self.seq = seq
        if seq == self.notified_seq:
            return
        self.notified_seq = seq
        for host, port in self.config.notify:
            threading.Thread(target=self._notify, args=(host, port, seq), daemon=True).start()

    def _notify(self, host: str, port: int, seq: int) -> None:
        message = dns.message.make_query(self.rpz, dns.rdatatype.SOA)
        message.flags = dns.flags.AA  # the opcode lives in the flags: set it after
        message.set_opcode(dns.opcode.NOTIFY)
        message.answer.append(self._soa(self.rpz, seq))
        for attempt in range(NOTIFY_TRIES):
            if self._stop.is_set() or self.notified_seq != seq:
                return
            try:
                dns.query.udp(message, host, port=port, timeout=1.0 + attempt)
                metrics.dns_notified("acknowledged")
                return
            except (dns.exception.DNSException, OSError):
                continue
        metrics.dns_notified("unanswered")
        logger.warning("serve_dns: %s:%d did not acknowledge NOTIFY of serial %d", host, port, seq)

    def _notify_loop(self) -> None:
        try:
            while not self._stop.wait(NOTIFY_POLL):
                self.poll()
        finally:
            connections.close_all()

    def poll(self) -> None:
        """One round of the NOTIFY loop: a failure of the database is one outage."""
        try:
            close_old_connections()
            self.notify_once()
        except DatabaseError as exc:
            _drop_dead_connection()
            self.database.failed(exc)
        except Exception:
            logger.exception("serve_dns: reading the change log for NOTIFY failed")
        else:
            self._database_hung = None
            self.database.recovered()

    # -- sockets -----------------------------------------------------------------

    def start(self, address: str, port: int) -> tuple[str, int]:
        """Bind UDP and TCP on (address, port) and serve in daemon threads; returns
        the bound address (port 0 picks a free one, the same for both)."""
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        server = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                server._serve_tcp(self.request, self.client_address[0])

        class TCPServer(socketserver.ThreadingTCPServer):
            address_family = family
            allow_reuse_address = True
            daemon_threads = True

        # Port 0: the free UDP port may be taken for TCP; try another.
        for attempt in range(1 if port else 10):
            udp = socket.socket(family, socket.SOCK_DGRAM)
            try:
                udp.bind((address, port))
                tcp = TCPServer((address, udp.getsockname()[1]), Handler)
            except OSError:
                udp.close()
                if port or attempt == 9:
                    raise
                continue
            break
        port = udp.getsockname()[1]
        self._udp, self._tcp = udp, tcp
        # The position before the first answer (a database down now: SERVFAIL for the
        # RPZ zone until the loop reads one). NOTIFY still goes out at the loop's start.
        try:
            self.seq = ChangeEvent.objects.head()
        except DatabaseError as exc:
            _drop_dead_connection()
            self.database.failed(exc)
        for target in (self._serve_udp, self._serve_tcp_listener, self._notify_loop):
            thread = threading.Thread(target=target, daemon=True, name=f"dns-{target.__name__}")
            thread.start()
            self._threads.append(thread)
        return address, port

    def stop(self) -> None:
        self._stop.set()
        self._wake_udp()
        if self._tcp is not None:
            self._tcp.shutdown()
            self._tcp.server_close()
        # The UDP thread closes its socket itself: closed under a blocked recvfrom,
        # its descriptor could be reused by another socket the thread then reads.
        for thread in self._threads:
            thread.join(timeout=2 * UDP_POLL)

    def _wake_udp(self) -> None:
        """An empty datagram to the UDP socket, so its thread sees the stop now rather
        than at its next poll."""
        udp = self._udp
        if udp is None:
            return
        try:
            host, *rest = udp.getsockname()
        except OSError:  # closed already: its thread has ended
            return
        if ipaddress.ip_address(host.split("%", 1)[0]).is_unspecified:
            host = "::1" if udp.family == socket.AF_INET6 else "127.0.0.1"
        with socket.socket(udp.family, socket.SOCK_DGRAM) as poke, contextlib.suppress(OSError):
            poke.sendto(b"", (host, *rest))

    def _serve_tcp_listener(self) -> None:
        assert self._tcp is not None
        self._tcp.serve_forever(poll_interval=TCP_STOP_POLL)

    def _serve_udp(self) -> None:
        assert self._udp is not None
        udp = self._udp
        udp.settimeout(UDP_POLL)
        try:
            self._udp_loop(udp)
        finally:
            udp.close()
            connections.close_all()  # this thread's: a stopped server holds none

    def _udp_loop(self, udp: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                wire, peer = udp.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            if self._stop.is_set():  # stop()'s wake-up, or a query that came too late
                return
            try:
                verdict = self.limiter.allow(peer[0])
                if verdict == "drop":
                    metrics.dns_dropped("rate_limited")
                    continue
                if verdict == "slip":
                    metrics.dns_dropped("rate_limited")
                    self._send_truncated(udp, wire, peer)
                    continue
                for out in self.answer(wire, peer[0], tcp=False):
                    udp.sendto(out, peer)
            except DatabaseError as exc:
                _drop_dead_connection()
                self.database.failed(exc)
            except Exception:
                logger.exception("serve_dns: answering %s failed", peer[0])
                close_old_connections()

    def _send_truncated(self, udp: socket.socket, wire: bytes, peer: tuple) -> None:
        try:
            query = dns.message.from_wire(wire)
        except Exception:
            return
        response = dns.message.make_response(query)
        response.flags |= dns.flags.TC
        response.question = []
        udp.sendto(response.to_wire(), peer)

    def _serve_tcp(self, sock: socket.socket, client: str) -> None:
        slot = self.tcp_slots.admit(sock, client)
        if slot is None:
            metrics.dns_dropped("tcp_busy")
            return
        try:
            while not self._stop.is_set():
                slot.waiting_since = time.monotonic()
                deadline = slot.waiting_since + self.config.tcp_deadline
                head = _read_exactly(sock, 2, deadline)
                if head is None:
                    return
                wire = _read_exactly(sock, struct.unpack("!H", head)[0], deadline)
                if wire is None:
                    return
                slot.waiting_since = None  # answering: its slot is not taken meanwhile
                for out in self.answer(wire, client, tcp=True):
                    # A client that stops reading is cut off as one that stops writing.
                    sock.settimeout(self.config.tcp_deadline)
                    sock.sendall(struct.pack("!H", len(out)) + out)
        except OSError:
            return
        except DatabaseError as exc:  # a transfer's snapshot: the secondary retries
            self.database.failed(exc)
        except Exception:
            logger.exception("serve_dns: answering %s over TCP failed", client)
        finally:
            self.tcp_slots.release(slot)
            connections.close_all()


class LookupFailed(Exception):
    """A URIBL lookup that could not tell (logged where it failed): SERVFAIL."""


def _drop_dead_connection() -> bool:
    """Close this thread's database connection if the database dropped it, so the next
    query opens a new one; True if one was dropped."""
    connection = connections[DEFAULT_DB_ALIAS]
    if connection.connection is None or connection.in_atomic_block or connection.is_usable():
        return False
    connection.close()
    return True


def _name_wire(name: str) -> bytes:
    """An absolute name's uncompressed wire form (labels checked by rpz_records)."""
    if name == ".":
        return b"\0"
    return b"".join(bytes([len(x)]) + x for x in name.rstrip(".").encode().split(b".")) + b"\0"


def _read_exactly(sock: socket.socket, n: int, deadline: float) -> bytes | None:
    """`n` bytes, or None if the peer closed or they did not all come by `deadline`
    (time.monotonic): a timeout per read would let a byte every few seconds hold the
    connection for ever."""
    data = b""
    while len(data) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        sock.settimeout(left)
        try:
            chunk = sock.recv(n - len(data))
        except TimeoutError:
            return None
        if not chunk:
            return None
        data += chunk
    return data
