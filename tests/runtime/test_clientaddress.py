"""The client address the rate limits count: IPv4 as it is, IPv6 by its /64."""

from __future__ import annotations

import pytest
from django.test import RequestFactory

from urlguard.runtime.clientaddress import client_lockout_address, client_network


@pytest.mark.parametrize(
    ("remote", "counted"),
    [
        ("198.51.100.7", "198.51.100.7"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:DB8:1:2::ffff", "2001:db8:1:2::/64"),
        ("fe80::1%eth0", "fe80::/64"),
        ("::ffff:198.51.100.7", "198.51.100.7"),  # an IPv4 client of a dual-stack socket
        ("", "unknown"),
        ("not an address", "not an address"),
    ],
)
def test_client_network(remote, counted):
    request = RequestFactory().get("/", REMOTE_ADDR=remote)
    assert client_network(request) == counted


@pytest.mark.parametrize(
    ("remote", "locked"),
    [
        ("198.51.100.7", "198.51.100.7"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::"),
        ("2001:DB8:1:2::ffff", "2001:db8:1:2::"),
        ("::ffff:198.51.100.7", "198.51.100.7"),
        ("", None),
        ("not an address", None),
    ],
)
def test_client_lockout_address(remote, locked):
    request = RequestFactory().get("/", REMOTE_ADDR=remote)
    assert client_lockout_address(request) == locked
