"""The Safe Browsing v4 API as a client speaks it through Django's test client: a
protobuf update fetched, its hashes and removal indices read (RAW or RICE), applied to
the client's sorted copy with its checksum checked, and full hashes found."""

from __future__ import annotations

import base64
import hashlib

from urlguard.safebrowsing import rice, wire

BASE = "/safebrowsing/v4"
PHISHING, MALWARE, FIREFOX_PHISHING = 2, 1, 5


def prefix(expression: str) -> bytes:
    return hashlib.sha256(expression.encode()).digest()[:4]


def fetch_proto(client, key, requests, **extra):
    message = wire.message("FetchThreatListUpdatesRequest")
    message.client.client_id = "navclient-auto-ffox"
    for threat_type, state, compression in requests:
        one = message.list_update_requests.add(
            threat_type=threat_type, platform_type=2, threat_entry_type=1, state=state
        )
        one.constraints.supported_compressions.append(compression)
    req = base64.urlsafe_b64encode(message.SerializeToString()).decode()
    response = client.get(
        f"{BASE}/threatListUpdates:fetch",
        {"$ct": "application/x-protobuf", "key": key, "$req": req},
        HTTP_X_HTTP_METHOD_OVERRIDE="POST",
    )
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/x-protobuf"
    return wire.parse("FetchThreatListUpdatesResponse", response.content)


def hashes_of(entry_set) -> list[bytes]:
    if entry_set.compression_type == 2:
        r = entry_set.rice_hashes
        values = rice.decode(r.first_value, r.rice_parameter, r.num_entries, r.encoded_data)
        return sorted(int(v).to_bytes(4, "little") for v in values)
    raw = entry_set.raw_hashes.raw_hashes
    return [raw[i : i + 4] for i in range(0, len(raw), 4)]


def indices_of(entry_set) -> list[int]:
    if entry_set.compression_type == 2:
        r = entry_set.rice_indices
        return rice.decode(r.first_value, r.rice_parameter, r.num_entries, r.encoded_data).tolist()
    return list(entry_set.raw_indices.indices)


def apply(copy: list[bytes], update) -> list[bytes]:
    """What a client does with one ListUpdateResponse; asserts its checksum."""
    if update.response_type == 2:
        copy = []
    gone = {i for removal in update.removals for i in indices_of(removal)}
    copy = [p for i, p in enumerate(copy) if i not in gone]
    for addition in update.additions:
        copy.extend(hashes_of(addition))
    copy = sorted(copy)
    assert hashlib.sha256(b"".join(copy)).digest() == update.checksum.sha256
    return copy


def find(client, key, prefixes, threat_type=PHISHING):
    message = wire.message("FindFullHashesRequest")
    message.client.client_id = "navclient-auto-ffox"
    message.threat_info.threat_types.append(threat_type)
    message.threat_info.platform_types.append(2)
    message.threat_info.threat_entry_types.append(1)
    for p in prefixes:
        message.threat_info.threat_entries.add(hash=p)
    response = client.post(
        f"{BASE}/fullHashes:find?$ct=application/x-protobuf&key={key}",
        message.SerializeToString(),
        "application/x-protobuf",
    )
    assert response.status_code == 200, response.content
    return wire.parse("FindFullHashesResponse", response.content)
