"""TrustedProxyMiddleware: behind the reverse proxies named in URLGUARD["TRUSTED_PROXIES"],
REMOTE_ADDR is made the visitor's address before anything keys on it (the rate limits,
visitor ids, the admin's login lock-out, the /metrics allowlist).

Only what trusted hops wrote is believed. X-Forwarded-For is read from the right: each
proxy appends the address that connected to it, so an entry is the client's own only
while every entry to its right is a trusted proxy; what lies further left came from the
client and may say anything. A request whose REMOTE_ADDR is not a trusted proxy is left
as it came: a client that reaches the server directly cannot name its own address."""

from __future__ import annotations

import ipaddress
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.http import HttpRequest

from urlguard.conf import conf
from urlguard.runtime.process import PerProcess

__all__ = ["PROXY_ADDRESS", "TrustedProxyMiddleware", "forwarded_client"]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Networks = tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]

#: The request.META key that keeps the proxy's address when REMOTE_ADDR is rewritten.
PROXY_ADDRESS = "urlguard.proxy_address"
# One header's work is bounded: at most MAX_HOPS entries looked at, read from its last
# MAX_CHARS characters (64 of the longest IPv6 text and ", " fit in 3,008).
MAX_HOPS = 64
MAX_CHARS = 4096


def _address(entry: str) -> Address | None:
    """The address `entry` spells, spaces around it stripped; None for anything else.
    nginx's $proxy_add_x_forwarded_for appends $remote_addr, never a port, brackets or
    an IPv6 zone, so those are refused like any other text."""
    text = entry.strip(" \t")
    if "%" in text:
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _is_trusted(address: Address, networks: Networks) -> bool:
    # A dual-stack socket reports an IPv4 peer as ::ffff:a.b.c.d.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in networks)


def forwarded_client(remote_addr: str, forwarded_for: str, networks: Networks) -> str:
    """The client's address: `remote_addr` unless it is in `networks`; then the first
    entry of `forwarded_for`, from the right, that is not. Where the walk stops early
    (an entry that is no address, more than MAX_HOPS entries or MAX_CHARS characters)
    it is the last trusted hop's address: never one that no trusted hop wrote."""
    proxy = _address(remote_addr)
    if proxy is None or not _is_trusted(proxy, networks):
        return remote_addr
    entries = forwarded_for[-MAX_CHARS:].rsplit(",", MAX_HOPS)
    if len(forwarded_for) > MAX_CHARS or len(entries) > MAX_HOPS:
        # The leftmost piece is cut short, or holds the entries beyond MAX_HOPS.
        del entries[0]
    client = remote_addr
    for entry in reversed(entries):
        address = _address(entry)
        if address is None:
            return client
        client = str(address)
        if not _is_trusted(address, networks):
            return client
    return client


def _use_forwarded_client(request: HttpRequest, networks: Networks) -> None:
    forwarded_for = request.META.get("HTTP_X_FORWARDED_FOR")
    if forwarded_for is None:
        return
    remote_addr = str(request.META.get("REMOTE_ADDR") or "")
    client = forwarded_client(remote_addr, forwarded_for, networks)
    if client != remote_addr:
        request.META[PROXY_ADDRESS] = remote_addr
        request.META["REMOTE_ADDR"] = client


class TrustedProxyMiddleware:
    """Sets REMOTE_ADDR to the visitor's address on requests from a trusted proxy
    (sync and async). Put it before every middleware that reads REMOTE_ADDR."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        if self.async_mode:
            return self.__acall__(request)
        networks = _networks()
        if networks:
            _use_forwarded_client(request, networks)
        return self.get_response(request)

    async def __acall__(self, request: HttpRequest):
        networks = _networks()
        if networks:
            _use_forwarded_client(request, networks)
        return await self.get_response(request)


# Resolved once per process (and again after a URLGUARD change): with none configured
# a request costs one attribute read and a test.
_resolved: PerProcess[Networks] = PerProcess(lambda: conf.TRUSTED_PROXIES, name="trusted proxies")
_networks = _resolved.get


@receiver(setting_changed)
def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "URLGUARD":
        _resolved.reset()
