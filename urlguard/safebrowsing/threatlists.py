"""The threat lists served: a rule's category names its list (phishing ->
SOCIAL_ENGINEERING, malware -> MALWARE, the others -> UNWANTED_SOFTWARE), each of
threat entry type URL, answered for ANY_PLATFORM and for whatever platform a client
names (a list here targets no platform in particular)."""

from __future__ import annotations

from urlguard.models import Category
from urlguard.safebrowsing.wire import PLATFORM, THREAT_ENTRY_TYPE, THREAT_TYPE

__all__ = ["LISTS", "URL", "list_of_category", "list_of_threat_type", "threat_type_of"]

#: The lists, in the order their one-byte code in a client state names them.
LISTS = ("MALWARE", "SOCIAL_ENGINEERING", "UNWANTED_SOFTWARE")
URL = THREAT_ENTRY_TYPE["URL"]
ANY_PLATFORM = PLATFORM["ANY_PLATFORM"]

_BY_CATEGORY: dict[str, str] = {
    Category.PHISHING: "SOCIAL_ENGINEERING",
    Category.MALWARE: "MALWARE",
}
_BY_THREAT_TYPE = {
    THREAT_TYPE["MALWARE"]: "MALWARE",
    THREAT_TYPE["SOCIAL_ENGINEERING"]: "SOCIAL_ENGINEERING",
    # Firefox's goog-phish-proto asks for the internal social-engineering type.
    THREAT_TYPE["SOCIAL_ENGINEERING_INTERNAL"]: "SOCIAL_ENGINEERING",
    THREAT_TYPE["UNWANTED_SOFTWARE"]: "UNWANTED_SOFTWARE",
}


def list_of_category(category: str) -> str:
    return _BY_CATEGORY.get(category, "UNWANTED_SOFTWARE")


def list_of_threat_type(threat_type: int) -> str | None:
    """The list a requested threat type reads, None for a type this service has none of."""
    return _BY_THREAT_TYPE.get(threat_type)


def threat_type_of(name: str) -> int:
    return THREAT_TYPE[name]
