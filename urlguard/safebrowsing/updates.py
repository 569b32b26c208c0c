"""threatListUpdates:fetch, one list at a time: a client state names the change-log
position of the client's copy and that copy's checksum; a state this node keeps the
lists of gets a PARTIAL_UPDATE (the prefixes added since, and the indices into the
client's sorted copy of those removed), any other (missing, of another list, from
another database, pruned, corrupt) a FULL_UPDATE. Every response carries the threat
type, entry type and platform it answers, its response type, the new client state and
the checksum of the list after the update."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from urlguard.safebrowsing import rice, wire
from urlguard.safebrowsing.prefixes import ListsAt, Stamp, checksum, load, store_dir
from urlguard.safebrowsing.recent import Recent
from urlguard.safebrowsing.threatlists import ANY_PLATFORM, URL, list_of_threat_type

__all__ = [
    "EMPTY",
    "decode_state",
    "diff",
    "encode_state",
    "full_set",
    "hash_set",
    "index_set",
    "list_update",
    "prefixes_for",
]

STATE_VERSION = 1
_STATE_LENGTH = 2 + 8 + 8
RAW, RICE = wire.COMPRESSION["RAW"], wire.COMPRESSION["RICE"]
FULL, PARTIAL = wire.RESPONSE_TYPE["FULL_UPDATE"], wire.RESPONSE_TYPE["PARTIAL_UPDATE"]
EMPTY = np.zeros(0, dtype=np.uint32)
_EMPTY_CHECKSUM = checksum(EMPTY)


def encode_state(threat_type: int, seq: int, sha256: bytes) -> bytes:
    """Version, threat type, position, and the first 8 bytes of the copy's checksum: a
    state of another list, or from before a rebuild of the same position, is unknown."""
    return bytes([STATE_VERSION, threat_type & 0xFF]) + seq.to_bytes(8, "big") + sha256[:8]


def decode_state(state: bytes, threat_type: int) -> tuple[int, bytes] | None:
    """(position, checksum start) of a state this list gave, else None."""
    if len(state) != _STATE_LENGTH or state[0] != STATE_VERSION or state[1] != threat_type & 0xFF:
        return None
    return int.from_bytes(state[2:10], "big"), state[10:]


def prefixes_for(lists: ListsAt, threat_type: int, entry_type: int) -> tuple[np.ndarray, bytes]:
    """The list a request names and its checksum: empty for a threat or entry type this
    service has none of."""
    name = list_of_threat_type(threat_type) if entry_type in (URL, 0) else None
    if name is None:
        return EMPTY, _EMPTY_CHECKSUM
    return lists.prefixes[name], lists.checksum(name)


def hash_set(prefixes: np.ndarray, compression: int) -> Any:
    """Prefixes (big-endian integers, sorted) as a ThreatEntrySet."""
    if compression == RICE:
        # The protocol codes each prefix's bytes read as a little-endian integer.
        encoded = rice.encode(np.sort(prefixes.astype(np.uint32).byteswap()))
        return wire.message(
            "ThreatEntrySet",
            compression_type=RICE,
            rice_hashes=_rice(encoded),
        )
    return wire.message(
        "ThreatEntrySet",
        compression_type=RAW,
        raw_hashes=wire.message(
            "RawHashes", prefix_size=4, raw_hashes=prefixes.astype(">u4").tobytes()
        ),
    )


def index_set(indices: np.ndarray, compression: int) -> Any:
    if compression == RICE:
        return wire.message(
            "ThreatEntrySet", compression_type=RICE, rice_indices=_rice(rice.encode(indices))
        )
    return wire.message(
        "ThreatEntrySet",
        compression_type=RAW,
        raw_indices=wire.message("RawIndices", indices=indices.tolist()),
    )


def _rice(encoded: rice.Encoded) -> Any:
    return wire.message(
        "RiceDeltaEncoding",
        first_value=encoded.first_value,
        rice_parameter=encoded.parameter,
        num_entries=encoded.num_entries,
        encoded_data=encoded.data,
    )


def full_set_path(seq: int, name: str) -> Path:
    return store_dir() / f"{seq}.{name}.rice.pb"


_full_sets: Recent[tuple[Stamp, str], bytes] = Recent(6)


def full_set(lists: ListsAt, name: str) -> bytes:
    """The RICE-coded whole of list `name` at `lists`' position as a serialized
    ThreatEntrySet: the file prepared with the position (urlguard.safebrowsing.prepared),
    or made now where it is missing."""
    key = (lists.stamp, name)
    found = _full_sets.get(key)
    if found is not None:
        return found
    path = full_set_path(lists.seq, name)
    try:
        found = path.read_bytes()
    except FileNotFoundError:
        found = hash_set(lists.prefixes[name], RICE).SerializeToString()
    return _full_sets.put(key, found)


def diff(old: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(indices into `old` of the prefixes `new` lacks, prefixes of `new` that `old`
    lacks), both sorted: one stable sort of the two lists side by side, in which a
    prefix of both appears twice in a row."""
    both = np.concatenate([old, new])
    order = np.argsort(both, kind="stable")
    ordered = both[order]
    paired = np.zeros(len(both), dtype=bool)
    same = ordered[1:] == ordered[:-1]
    paired[1:] |= same
    paired[:-1] |= same
    alone = order[~paired]
    n = len(old)
    return alone[alone < n], both[alone[alone >= n]]


def list_update(request: Any, lists: ListsAt) -> Any:
    """The ListUpdateResponse to one ListUpdateRequest, `lists` being the newest kept."""
    threat_type = request.threat_type
    entry_type = request.threat_entry_type or URL
    compressions = set(request.constraints.supported_compressions)
    compression = RICE if RICE in compressions else RAW
    new, sha256 = prefixes_for(lists, threat_type, entry_type)
    response = wire.message(
        "ListUpdateResponse",
        threat_type=threat_type,
        threat_entry_type=entry_type,
        platform_type=request.platform_type or ANY_PLATFORM,
        new_client_state=encode_state(threat_type, lists.seq, sha256),
        checksum=wire.message("Checksum", sha256=sha256),
    )
    old = _client_copy(request.state, threat_type, entry_type)
    if old is None:
        response.response_type = FULL
        if len(new):
            name = list_of_threat_type(threat_type)
            if compression == RICE and name is not None:
                response.additions.add().MergeFromString(full_set(lists, name))
            else:
                response.additions.append(hash_set(new, compression))
        return response
    response.response_type = PARTIAL
    removed, added = diff(old, new)
    if len(added):
        response.additions.append(hash_set(added, compression))
    if len(removed):
        response.removals.append(index_set(removed, compression))
    return response


def _client_copy(state: bytes, threat_type: int, entry_type: int) -> np.ndarray | None:
    """The list as the client holding `state` has it, None where unknown."""
    decoded = decode_state(state, threat_type)
    if decoded is None:
        return None
    seq, start = decoded
    kept = load(seq)
    if kept is None:
        return None
    old, sha256 = prefixes_for(kept, threat_type, entry_type)
    return old if sha256[:8] == start else None
