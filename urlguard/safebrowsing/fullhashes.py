"""fullHashes:find: the full SHA-256 hashes of the rules whose prefixes a client
found in its copy of a list, searched in the newest kept position's lookup (the
projection a client's list comes from; the pre-render keeps it at the log's head),
with the positive and negative cache durations of the settings. No database query:
a find costs about what a clean /api/check does."""

from __future__ import annotations

from typing import Any

import numpy as np

from urlguard.conf import conf
from urlguard.safebrowsing import wire
from urlguard.safebrowsing.prefixes import LookupMissing, newest_lookup
from urlguard.safebrowsing.threatlists import ANY_PLATFORM, URL, list_of_threat_type

__all__ = ["MAX_ENTRIES", "find"]

#: Hashes one request may ask about (Firefox asks a handful per page).
MAX_ENTRIES = 1000


def _duration(seconds: int) -> Any:
    return wire.message("Duration", seconds=seconds, nanos=0)


def find(request: Any) -> tuple[Any, list[int]]:
    """(the FindFullHashesResponse, the ids of the rules it matched); LookupMissing
    where there is something to look up and no lookup to look in."""
    info = request.threat_info
    wanted: dict[str, list[int]] = {}
    for threat_type in info.threat_types:
        name = list_of_threat_type(threat_type)
        if name is not None and threat_type not in wanted.setdefault(name, []):
            wanted[name].append(threat_type)
    entry_types = set(info.threat_entry_types) or {URL}
    platform = info.platform_types[0] if info.platform_types else ANY_PLATFORM
    # 4 to 32 bytes each: the view refuses any other.
    prefixes = [entry.hash for entry in info.threat_entries]
    response = wire.message(
        "FindFullHashesResponse",
        negative_cache_duration=_duration(conf.SAFEBROWSING_NEGATIVE_CACHE_DURATION),
        minimum_wait_duration=_duration(0),
    )
    if not wanted or not prefixes or URL not in entry_types:
        return response, []
    arrays = newest_lookup()
    if arrays is None:
        # No match would tell the client these hashes are clean for the negative
        # cache duration; it keeps its copy and asks again on an error.
        raise LookupMissing("no full-hash lookup is kept in the Safe Browsing folder")
    keys = np.array([int.from_bytes(p[:4], "big") for p in prefixes], dtype=np.uint32)
    cache = _duration(conf.SAFEBROWSING_CACHE_DURATION)
    matched: list[int] = []
    for name, threat_types in wanted.items():
        column = arrays[f"{name}.prefixes"]
        lo = np.searchsorted(column, keys, side="left")
        hi = np.searchsorted(column, keys, side="right")
        seen: set[int] = set()
        for a, b in zip(lo.tolist(), hi.tolist(), strict=True):
            for row in range(a, b):
                if row in seen:
                    continue
                seen.add(row)
                digest = arrays[f"{name}.hashes"][row].tobytes()
                if not any(digest.startswith(p) for p in prefixes):
                    continue
                matched.append(int(arrays[f"{name}.ids"][row]))
                for threat_type in threat_types:
                    response.matches.append(_match(threat_type, platform, digest, cache))
    return response, matched


def _match(threat_type: int, platform: int, digest: bytes, cache: Any) -> Any:
    return wire.message(
        "ThreatMatch",
        threat_type=threat_type,
        platform_type=platform,
        threat_entry_type=URL,
        threat=wire.message("ThreatEntry", hash=digest),
        cache_duration=cache,
        # Present though empty: JSON clients read its entries.
        threat_entry_metadata=wire.message("ThreatEntryMetadata"),
    )
