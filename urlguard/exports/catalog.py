"""The exports served at /lists/<name>, by name."""

from __future__ import annotations

from collections.abc import Callable

from urlguard.exports.abp import AbpExport
from urlguard.exports.base import Export
from urlguard.exports.domains import DomainsExport
from urlguard.exports.hosts import HostsExport
from urlguard.exports.rpz import RpzExport
from urlguard.exports.rspamd_domains import RspamdDomainsExport
from urlguard.exports.rspamd_urls import RspamdUrlsExport

__all__ = ["EXPORTS", "get_export"]

EXPORTS: dict[str, Callable[[], Export]] = {
    e.name: e
    for e in (
        HostsExport,
        DomainsExport,
        AbpExport,
        RspamdDomainsExport,
        RspamdUrlsExport,
        RpzExport,
    )
}


def get_export(name: str) -> Export | None:
    """A fresh instance (formats keep per-render state)."""
    made = EXPORTS.get(name)
    return made() if made is not None else None
