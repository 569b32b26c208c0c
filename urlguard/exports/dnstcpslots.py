"""The DNS server's TCP connection slots (urlguard.exports.dnsserver): a cap per client,
shared slots plus slots kept for DNS_TRANSFER_NETWORKS, and idle connections evicted
for newcomers, so no client, nor a few addresses of one, can hold the server's TCP."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "MAX_TCP_CLIENTS",
    "TCP_PER_CLIENT",
    "TCP_RECLAIM_AFTER",
    "TCP_TRANSFER_SLOTS",
    "TcpSlot",
    "TcpSlots",
]

MAX_TCP_CLIENTS = 32
#: Connections one client (an IPv4 address, an IPv6 /64) may hold at once.
TCP_PER_CLIENT = 4
#: Kept for DNS_TRANSFER_NETWORKS beyond MAX_TCP_CLIENTS: their AXFR/IXFR get through
#: whoever holds the others.
TCP_TRANSFER_SLOTS = 8
#: With every shared slot taken, a new client takes the slot of the connection that has
#: waited longest for its next message, once it waited this many seconds (RFC 7766
#: section 6.2.3: a busy server may close idle connections). Else a question every few
#: seconds, or one dripped within the server's deadline, would keep a slot for ever.
TCP_RECLAIM_AFTER = 1.0


@dataclass(eq=False)
class TcpSlot:
    """One TCP connection's slot: its pool ("shared" or "transfer"), its client's key
    (client_key), since when the server waits for its next message (time.monotonic;
    None while it answers), and whether a newcomer took it over."""

    sock: socket.socket
    pool: str
    key: int
    waiting_since: float | None = None
    reclaimed: bool = False


class TcpSlots:
    """The slots of one server's TCP connections, safe to use from every connection's
    thread. `may_transfer(client)` says whether a client is of the transfer networks."""

    def __init__(
        self,
        *,
        may_transfer: Callable[[str], bool],
        clients: int = MAX_TCP_CLIENTS,
        per_client: int = TCP_PER_CLIENT,
        transfer_slots: int = TCP_TRANSFER_SLOTS,
        reclaim_after: float = TCP_RECLAIM_AFTER,
    ) -> None:
        self.may_transfer = may_transfer
        self.clients = clients
        self.per_client = per_client
        self.transfer_slots = transfer_slots
        self.reclaim_after = reclaim_after
        self._lock = threading.Lock()
        self._slots: list[TcpSlot] = []

    def admit(self, sock: socket.socket, client: str) -> TcpSlot | None:
        """Take a slot for `client`, or None when it holds `per_client` already or no
        slot is free to it (the transfer networks have slots of their own once the
        shared ones are taken). With none free, the shared slot of the connection that
        has waited longest for its next message, past `reclaim_after`, is taken: its
        socket is shut down, so its thread, blocked reading, lets go."""
        key = client_key(client)
        now = time.monotonic()
        with self._lock:
            live = [s for s in self._slots if not s.reclaimed]
            if sum(s.key == key for s in live) >= self.per_client:
                return None
            shared = [s for s in live if s.pool == "shared"]
            if len(shared) < self.clients:
                pool = "shared"
            elif sum(s.pool == "transfer" for s in live) < self.transfer_slots and (
                self.may_transfer(client)
            ):
                pool = "transfer"
            else:
                waiting = [
                    s
                    for s in shared
                    if s.waiting_since is not None and now - s.waiting_since >= self.reclaim_after
                ]
                if not waiting:
                    return None
                oldest = min(waiting, key=lambda s: s.waiting_since or now)
                oldest.reclaimed = True
                with contextlib.suppress(OSError):
                    oldest.sock.shutdown(socket.SHUT_RDWR)
                pool = "shared"
            slot = TcpSlot(sock, pool, key)
            self._slots.append(slot)
        return slot

    def release(self, slot: TcpSlot) -> None:
        with self._lock:
            self._slots.remove(slot)


def client_key(address: str) -> int:
    """One TCP client as one int: an IPv4 address (an IPv4-mapped one too), or an
    IPv6 /64, the network a subscriber picks addresses in at will, marked above it."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return -1
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is None:
            return (1 << 64) | (int(ip) >> 64)
        ip = ip.ipv4_mapped
    return int(ip)
