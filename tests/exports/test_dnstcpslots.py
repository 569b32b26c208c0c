"""The DNS server's TCP slots: a cap per client (an address, an IPv6 /64), shared slots
and the ones kept for the transfer networks, a slot back on release, and the idle
connection that waited longest evicted for a newcomer (its socket shut down)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from urlguard.exports.dnstcpslots import TcpSlots, client_key


@pytest.fixture
def sockets() -> Iterator[list[tuple[socket.socket, socket.socket]]]:
    """Connected pairs (server side, client side), each closed at the end."""
    pairs: list[tuple[socket.socket, socket.socket]] = []
    yield pairs
    for pair in pairs:
        for sock in pair:
            sock.close()


def _sock(sockets: list) -> socket.socket:
    pair = socket.socketpair()
    sockets.append(pair)
    return pair[0]


def _slots(**overrides) -> TcpSlots:
    transfer = overrides.pop("transfer", ())
    options = {"clients": 4, "per_client": 2, "transfer_slots": 1, "reclaim_after": 1.0}
    return TcpSlots(may_transfer=lambda client: client in transfer, **(options | overrides))


def test_one_client_holds_at_most_per_client_connections(sockets):
    slots = _slots()
    assert slots.admit(_sock(sockets), "192.0.2.1") is not None
    assert slots.admit(_sock(sockets), "::ffff:192.0.2.1") is not None  # mapped: the same
    assert slots.admit(_sock(sockets), "192.0.2.1") is None
    assert slots.admit(_sock(sockets), "192.0.2.2") is not None  # another address


def test_an_ipv6_client_is_its_slash_64():
    assert client_key("2001:db8::1") == client_key("2001:db8::ffff:2")
    assert client_key("2001:db8:0:1::1") != client_key("2001:db8::1")
    assert client_key("::ffff:192.0.2.1") == client_key("192.0.2.1")
    assert client_key("fe80::1%eth0") == client_key("fe80::2")
    assert client_key("not an address") == -1
    # No IPv6 /64 is taken for an IPv4 address.
    assert client_key("::c000:201") != client_key("192.0.2.1")


def test_the_transfer_networks_have_slots_of_their_own_once_the_shared_ones_are_taken(sockets):
    slots = _slots(clients=2, per_client=1, transfer={"198.51.100.7", "198.51.100.8"})
    for client in ("192.0.2.1", "192.0.2.2"):
        assert slots.admit(_sock(sockets), client).pool == "shared"
    assert slots.admit(_sock(sockets), "192.0.2.3") is None
    assert slots.admit(_sock(sockets), "198.51.100.7").pool == "transfer"
    assert slots.admit(_sock(sockets), "198.51.100.8") is None  # the one kept is taken


def test_a_released_slot_is_free_again(sockets):
    slots = _slots(clients=1, per_client=1, transfer_slots=0)
    held = slots.admit(_sock(sockets), "192.0.2.1")
    assert slots.admit(_sock(sockets), "192.0.2.2") is None
    slots.release(held)
    assert slots.admit(_sock(sockets), "192.0.2.2") is not None


def test_a_newcomer_takes_the_slot_of_the_connection_idle_longest_past_the_limit(sockets):
    slots = _slots(clients=3, per_client=1, transfer_slots=0, reclaim_after=1.0)
    pairs = []
    for n in range(3):
        sock = _sock(sockets)
        pairs.append((sockets[-1], slots.admit(sock, f"192.0.2.{n}")))
    now = time.monotonic()
    (_, answering), (_, recent), (old_pair, old) = pairs
    answering.waiting_since = None  # answering: never taken over
    recent.waiting_since = now - 0.5  # idle, but not past reclaim_after
    old.waiting_since = now - 5.0
    newcomer = slots.admit(_sock(sockets), "192.0.2.9")
    assert newcomer is not None and newcomer.pool == "shared"
    assert old.reclaimed and not recent.reclaimed and not answering.reclaimed
    # Its socket is shut down: the thread blocked reading it sees the end and lets go.
    old_pair[1].settimeout(5)
    assert old_pair[1].recv(1) == b""
    # The reclaimed slot, not yet released by its thread, counts no more: the three
    # live ones fill the pool and none is idle past the limit.
    assert slots.admit(_sock(sockets), "192.0.2.10") is None
    slots.release(old)
    recent.waiting_since = now - 2.0
    assert slots.admit(_sock(sockets), "192.0.2.11") is not None
    assert recent.reclaimed
