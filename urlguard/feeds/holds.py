"""Feed entries held for an operator's yes: a feed's new entry goes through the same
policy as the admin's add form (urlguard.writepath.safety: a whole-host rule on a popular
host, a link shortener, a shared hosting platform or this service's own host, or a
rule that would block more than CONFIRM_IMPACT_LINKS short links). Such an entry is
not applied; it is kept as a FeedHold with its reasons, and the rest of the refresh
goes on. An operator accepts it (the admin's feed holds, or `refresh_feeds NAME
--accept-held`), and the next refresh applies it; an entry the feed stops listing
loses its hold."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import islice

import numpy as np
from django.utils import timezone

from urlguard.conf import conf
from urlguard.feeds.staging import Staged
from urlguard.models import Actor, FeedHold, Source, expression_key
from urlguard.writepath.impact import impact_of_adding
from urlguard.writepath.safety import Confirmation, confirmations_many

logger = logging.getLogger(__name__)

__all__ = ["Held", "accept", "record", "screen"]

# The impact on short links is measured for at most this many new entries at once (a
# first load of a big feed is screened by the host lists only, and logged so).
IMPACT_SCREEN_LIMIT = 100_000
_CHUNK = 10_000


@dataclass(frozen=True, slots=True)
class Held:
    index: int  # the entry's place among the refresh's entries
    expression: str
    category: str
    reasons: tuple[Confirmation, ...]

    @property
    def reason(self) -> str:
        return "; ".join(c.reason for c in self.reasons)


def screen(source: Source, staged: Staged, new: np.ndarray, count: int) -> list[Held]:
    """Of the entries of `staged` that `new` marks (each new to `source`, `count` of
    them), those that need an operator's yes and have not had it."""
    if not count:
        return []
    blocked: dict[str, int] = {}
    if conf.CONFIRM_IMPACT_LINKS:
        if count <= IMPACT_SCREEN_LIMIT:
            impact = impact_of_adding(expression for _, expression, _ in staged.entries(new))
            if impact.exact:
                blocked = impact.per_rule
        else:
            logger.info(
                "feed %s: %d new entries; their impact on short links is not screened "
                "(more than %d at once), only the protected host lists are",
                source.name,
                count,
                IMPACT_SCREEN_LIMIT,
            )
    accepted = set(
        FeedHold.objects.filter(source=source, accepted_at__isnull=False).values_list(
            "key", flat=True
        )
    )
    held: list[Held] = []
    # Without a count of blocked links, only a whole-host rule can need a yes
    # (confirmations_many's host lists): the others are not even read.
    iterator = iter(staged.entries(new, whole_hosts=not blocked))
    while chunk := list(islice(iterator, _CHUNK)):
        reasons = confirmations_many((e for _, e, _ in chunk), blocked_links=blocked)
        if not reasons:
            continue
        for index, expression, category in chunk:
            why = reasons.get(expression)
            if why and expression_key(expression) not in accepted:
                held.append(Held(index, expression, category, tuple(why)))
    return held


def record(source: Source, held: list[Held], lists: Callable[[np.ndarray], np.ndarray]) -> None:
    """Keep a FeedHold for each of `held`, and drop the holds (accepted or not) of
    entries the source no longer lists (`lists(keys)`: which of these keys its
    entries have, Staged.has)."""
    rows = dict(FeedHold.objects.filter(source=source).values_list("key", "pk"))
    if rows:
        keys = np.fromiter(rows, dtype=np.int64, count=len(rows))
        gone = keys[~lists(keys)]
        for start in range(0, len(gone), _CHUNK):
            part = gone[start : start + _CHUNK].tolist()
            FeedHold.objects.filter(source=source, key__in=part).delete()
    new = [h for h in held if expression_key(h.expression) not in rows]
    for start in range(0, len(new), _CHUNK):
        FeedHold.objects.bulk_create(
            [
                FeedHold(
                    source=source,
                    expression=h.expression,
                    key=expression_key(h.expression),
                    category=h.category or source.category,
                    codes=",".join(c.code for c in h.reasons),
                    reasons=h.reason,
                )
                for h in new[start : start + _CHUNK]
            ],
            ignore_conflicts=True,
        )


def accept(source: Source, *, actor: Actor = None, expressions: Iterable[str] | None = None) -> int:
    """Accept the held entries of `source` (all, or those of `expressions`): the next
    refresh applies them (it fetches the body again: an unchanged one would otherwise
    answer "not modified"). Returns how many were accepted."""
    pending = FeedHold.objects.filter(source=source, accepted_at__isnull=True)
    if expressions is not None:
        pending = pending.filter(key__in=[expression_key(e) for e in expressions])
    by = actor if getattr(actor, "is_authenticated", False) else None
    accepted = pending.update(accepted_at=timezone.now(), accepted_by=by)
    if accepted:
        Source.objects.filter(pk=source.pk).update(etag="", last_modified="")
        source.etag = source.last_modified = ""
    return accepted
