"""`check_text(text)`: every link of a text (urlguard.content.links) checked with one
batch call to the guard, each with its verdict; a listed one is recorded in the hit
log as a hit from posted text."""

from __future__ import annotations

from collections.abc import Iterable

from urlguard.content.links import find_links
from urlguard.hotpath import hitlog
from urlguard.hotpath.guard import Verdict, get_guard

__all__ = ["check_text", "listed_links"]


def check_text(text: str, *, where: str = "") -> list[Verdict]:
    """A Verdict for each distinct link of `text`, in the order they first appear
    (Verdict.url is the link as find_links gives it). `where` names the text's place
    for the hit log (a form, "comment 12", "API key NAME"). Raises TextTooLong over
    CONTENT_MAX_CHARS; an unreadable filter answers by ON_FILTER_ERROR, as for a
    redirect."""
    links = list(dict.fromkeys(find_links(text)))
    if not links:
        return []
    verdicts = get_guard().check_many(links)
    for verdict in verdicts:
        if verdict.blocked:
            hitlog.text_blocked(verdict, where=where or "posted text")
    return verdicts


def listed_links(verdicts: Iterable[Verdict]) -> list[Verdict]:
    """The verdicts that refuse their link (listed, or not checkable while
    ON_FILTER_ERROR is "closed")."""
    return [verdict for verdict in verdicts if verdict.blocked]
