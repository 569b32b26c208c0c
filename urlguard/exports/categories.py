"""The one table that maps a rule's category to what other enforcement points
understand: the rspamd symbol and score of the rspamd maps, and the bit of the
URIBL answer's last octet (127.0.0.<bits>). Bit 0 is never used, so no listing is
ever 127.0.0.1 (which resolvers and shortener plugins read as "query refused")."""

from __future__ import annotations

from typing import NamedTuple

from urlguard.models import Category

__all__ = ["CATEGORY_TABLE", "CategoryExport", "uribl_address"]


class CategoryExport(NamedTuple):
    rspamd_symbol: str
    rspamd_score: float
    uribl_bit: int


# README "Serving the list to other enforcement points" prints this table.
CATEGORY_TABLE: dict[str, CategoryExport] = {
    Category.PHISHING: CategoryExport("URLGUARD_PHISHING", 10.0, 2),
    Category.MALWARE: CategoryExport("URLGUARD_MALWARE", 10.0, 4),
    Category.SPAM: CategoryExport("URLGUARD_SPAM", 5.0, 8),
    Category.UNWANTED: CategoryExport("URLGUARD_UNWANTED", 3.0, 16),
    Category.OTHER: CategoryExport("URLGUARD_OTHER", 3.0, 32),
}


def category_export(category: str) -> CategoryExport:
    return CATEGORY_TABLE.get(category, CATEGORY_TABLE[Category.OTHER])


def uribl_address(categories: set[str] | frozenset[str]) -> str:
    """127.0.0.<OR of the categories' bits>: never 127.0.0.1."""
    bits = 0
    for category in categories:
        bits |= category_export(category).uribl_bit
    return f"127.0.0.{bits or CATEGORY_TABLE[Category.OTHER].uribl_bit}"
