"""The Safe Browsing v4 messages this service reads and writes, built at import from
the field numbers of Google's published safebrowsing.proto (proto2: a field set to
zero is still sent, and Firefox requires `first_value` and the enums present). Both
wire forms: binary protobuf, and the JSON mapping the REST API uses."""

from __future__ import annotations

from typing import Any

from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    json_format,
    message_factory,
)
from google.protobuf.message import DecodeError, Message

__all__ = [
    "COMPRESSION",
    "PLATFORM",
    "RESPONSE_TYPE",
    "THREAT_ENTRY_TYPE",
    "THREAT_TYPE",
    "WireError",
    "from_json",
    "message",
    "parse",
    "to_json",
]

PACKAGE = "urlguard.safebrowsing.v4"

_F = descriptor_pb2.FieldDescriptorProto
OPTIONAL, REPEATED = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
INT32, INT64, BYTES, STRING = _F.TYPE_INT32, _F.TYPE_INT64, _F.TYPE_BYTES, _F.TYPE_STRING
ENUM, MESSAGE = _F.TYPE_ENUM, _F.TYPE_MESSAGE

# The public API's names; 5 is the social-engineering list Firefox asks for
# (goog-phish-proto), answered like 2.
THREAT_TYPE = {
    "THREAT_TYPE_UNSPECIFIED": 0,
    "MALWARE": 1,
    "SOCIAL_ENGINEERING": 2,
    "UNWANTED_SOFTWARE": 3,
    "POTENTIALLY_HARMFUL_APPLICATION": 4,
    "SOCIAL_ENGINEERING_INTERNAL": 5,
    "API_ABUSE": 6,
    "MALICIOUS_BINARY": 7,
    "CSD_WHITELIST": 8,
    "CSD_DOWNLOAD_WHITELIST": 9,
    "CLIENT_INCIDENT": 10,
    "SUBRESOURCE_FILTER": 13,
}
PLATFORM = {
    "PLATFORM_TYPE_UNSPECIFIED": 0,
    "WINDOWS": 1,
    "LINUX": 2,
    "ANDROID": 3,
    "OSX": 4,
    "IOS": 5,
    "ANY_PLATFORM": 6,
    "ALL_PLATFORMS": 7,
    "CHROME": 8,
}
THREAT_ENTRY_TYPE = {
    "THREAT_ENTRY_TYPE_UNSPECIFIED": 0,
    "URL": 1,
    "EXECUTABLE": 2,
    "IP_RANGE": 3,
    "CHROME_EXTENSION": 4,
    "FILENAME": 5,
    "CERT": 6,
}
COMPRESSION = {"COMPRESSION_TYPE_UNSPECIFIED": 0, "RAW": 1, "RICE": 2}
RESPONSE_TYPE = {"RESPONSE_TYPE_UNSPECIFIED": 0, "PARTIAL_UPDATE": 1, "FULL_UPDATE": 2}

# name -> [(field name, number, label, type, enum or message type name)]
_MESSAGES: dict[str, list[tuple[str, int, int, int, str]]] = {
    "ClientInfo": [
        ("client_id", 1, OPTIONAL, STRING, ""),
        ("client_version", 2, OPTIONAL, STRING, ""),
    ],
    "Checksum": [("sha256", 1, OPTIONAL, BYTES, "")],
    "ThreatEntry": [("hash", 1, OPTIONAL, BYTES, ""), ("url", 2, OPTIONAL, STRING, "")],
    "RawIndices": [("indices", 1, REPEATED, INT32, "")],
    "RawHashes": [("prefix_size", 1, OPTIONAL, INT32, ""), ("raw_hashes", 2, OPTIONAL, BYTES, "")],
    "RiceDeltaEncoding": [
        ("first_value", 1, OPTIONAL, INT64, ""),
        ("rice_parameter", 2, OPTIONAL, INT32, ""),
        ("num_entries", 3, OPTIONAL, INT32, ""),
        ("encoded_data", 4, OPTIONAL, BYTES, ""),
    ],
    "ThreatEntrySet": [
        ("compression_type", 1, OPTIONAL, ENUM, "CompressionType"),
        ("raw_hashes", 2, OPTIONAL, MESSAGE, "RawHashes"),
        ("raw_indices", 3, OPTIONAL, MESSAGE, "RawIndices"),
        ("rice_hashes", 4, OPTIONAL, MESSAGE, "RiceDeltaEncoding"),
        ("rice_indices", 5, OPTIONAL, MESSAGE, "RiceDeltaEncoding"),
    ],
    "MetadataEntry": [("key", 1, OPTIONAL, BYTES, ""), ("value", 2, OPTIONAL, BYTES, "")],
    "ThreatEntryMetadata": [("entries", 1, REPEATED, MESSAGE, "MetadataEntry")],
    "ThreatInfo": [
        ("threat_types", 1, REPEATED, ENUM, "ThreatType"),
        ("platform_types", 2, REPEATED, ENUM, "PlatformType"),
        ("threat_entries", 3, REPEATED, MESSAGE, "ThreatEntry"),
        ("threat_entry_types", 4, REPEATED, ENUM, "ThreatEntryType"),
    ],
    "ThreatMatch": [
        ("threat_type", 1, OPTIONAL, ENUM, "ThreatType"),
        ("platform_type", 2, OPTIONAL, ENUM, "PlatformType"),
        ("threat", 3, OPTIONAL, MESSAGE, "ThreatEntry"),
        ("threat_entry_metadata", 4, OPTIONAL, MESSAGE, "ThreatEntryMetadata"),
        ("cache_duration", 5, OPTIONAL, MESSAGE, "Duration"),
        ("threat_entry_type", 6, OPTIONAL, ENUM, "ThreatEntryType"),
    ],
    "Constraints": [
        ("max_update_entries", 1, OPTIONAL, INT32, ""),
        ("max_database_entries", 2, OPTIONAL, INT32, ""),
        ("region", 3, OPTIONAL, STRING, ""),
        ("supported_compressions", 4, REPEATED, ENUM, "CompressionType"),
        ("language", 5, OPTIONAL, STRING, ""),
        ("device_location", 6, OPTIONAL, STRING, ""),
    ],
    "ListUpdateRequest": [
        ("threat_type", 1, OPTIONAL, ENUM, "ThreatType"),
        ("platform_type", 2, OPTIONAL, ENUM, "PlatformType"),
        ("state", 3, OPTIONAL, BYTES, ""),
        ("constraints", 4, OPTIONAL, MESSAGE, "Constraints"),
        ("threat_entry_type", 5, OPTIONAL, ENUM, "ThreatEntryType"),
    ],
    "FetchThreatListUpdatesRequest": [
        ("client", 1, OPTIONAL, MESSAGE, "ClientInfo"),
        ("list_update_requests", 3, REPEATED, MESSAGE, "ListUpdateRequest"),
    ],
    "ListUpdateResponse": [
        ("threat_type", 1, OPTIONAL, ENUM, "ThreatType"),
        ("threat_entry_type", 2, OPTIONAL, ENUM, "ThreatEntryType"),
        ("platform_type", 3, OPTIONAL, ENUM, "PlatformType"),
        ("response_type", 4, OPTIONAL, ENUM, "ResponseType"),
        ("additions", 5, REPEATED, MESSAGE, "ThreatEntrySet"),
        ("removals", 6, REPEATED, MESSAGE, "ThreatEntrySet"),
        ("new_client_state", 7, OPTIONAL, BYTES, ""),
        ("checksum", 8, OPTIONAL, MESSAGE, "Checksum"),
    ],
    "FetchThreatListUpdatesResponse": [
        ("list_update_responses", 1, REPEATED, MESSAGE, "ListUpdateResponse"),
        ("minimum_wait_duration", 2, OPTIONAL, MESSAGE, "Duration"),
    ],
    "FindFullHashesRequest": [
        ("client", 1, OPTIONAL, MESSAGE, "ClientInfo"),
        ("client_states", 2, REPEATED, BYTES, ""),
        ("threat_info", 3, OPTIONAL, MESSAGE, "ThreatInfo"),
    ],
    "FindFullHashesResponse": [
        ("matches", 1, REPEATED, MESSAGE, "ThreatMatch"),
        ("minimum_wait_duration", 2, OPTIONAL, MESSAGE, "Duration"),
        ("negative_cache_duration", 3, OPTIONAL, MESSAGE, "Duration"),
    ],
    "ThreatListDescriptor": [
        ("threat_type", 1, OPTIONAL, ENUM, "ThreatType"),
        ("platform_type", 2, OPTIONAL, ENUM, "PlatformType"),
        ("threat_entry_type", 3, OPTIONAL, ENUM, "ThreatEntryType"),
    ],
    "ListThreatListsResponse": [("threat_lists", 1, REPEATED, MESSAGE, "ThreatListDescriptor")],
}
_ENUMS = {
    "ThreatType": THREAT_TYPE,
    "PlatformType": PLATFORM,
    "ThreatEntryType": THREAT_ENTRY_TYPE,
    "CompressionType": COMPRESSION,
    "ResponseType": RESPONSE_TYPE,
}


# The protocol's Duration has google.protobuf.Duration's fields; as that type its JSON
# form is the API's ("300s"), which JSON clients parse.
_DURATION = duration_pb2.DESCRIPTOR


def _file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(
        name="urlguard/safebrowsing/v4.proto",
        package=PACKAGE,
        syntax="proto2",
        dependency=[_DURATION.name],
    )
    for name, values in _ENUMS.items():
        enum = proto.enum_type.add(name=name)
        for value_name, number in values.items():
            enum.value.add(name=value_name, number=number)
    for name, fields in _MESSAGES.items():
        msg = proto.message_type.add(name=name)
        for field_name, number, label, kind, type_name in fields:
            field = msg.field.add(name=field_name, number=number, label=label, type=kind)
            if type_name == "Duration":
                field.type_name = ".google.protobuf.Duration"
            elif type_name:
                field.type_name = f".{PACKAGE}.{type_name}"
    return proto


_pool = descriptor_pool.DescriptorPool()
_pool.AddSerializedFile(_DURATION.serialized_pb)
_pool.Add(_file())
_classes = {
    name: message_factory.GetMessageClass(_pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
    for name in _MESSAGES
}
_classes["Duration"] = message_factory.GetMessageClass(
    _pool.FindMessageTypeByName("google.protobuf.Duration")
)


def message(name: str, **fields: Any) -> Any:
    """A new message of type `name` (e.g. "ThreatEntrySet")."""
    return _classes[name](**fields)


class WireError(ValueError):
    """A request body that is not the message it should be."""


def parse(name: str, data: bytes) -> Any:
    msg = _classes[name]()
    try:
        msg.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise WireError(f"not a {name} protobuf message ({exc})") from None
    return msg


def from_json(name: str, text: bytes | str) -> Any:
    msg = _classes[name]()
    try:
        json_format.Parse(text, msg, max_recursion_depth=20)
    except (json_format.ParseError, ValueError, RecursionError) as exc:
        raise WireError(f"not a {name} JSON message ({exc})") from None
    return msg


def to_json(msg: Message) -> str:
    return json_format.MessageToJson(msg, indent=None)
