"""The hot path: is this redirect destination on the spam list?

`Guard.check(url)` canonicalizes the URL (or takes the reading the caller
already made, `parsed`), asks the Bloom filter about every roll-up expression
and, only when the filter says "maybe", confirms in the spam table with one
indexed query. The filter never says "no" falsely, and the table
is the truth, so a clean URL costs no database round trip and a listed URL is
never missed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, fields
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
from django.core.signals import setting_changed
from django.dispatch import receiver

from urlguard.conf import ON_FILTER_ERROR_POLICIES as POLICIES
from urlguard.conf import conf
from urlguard.hotpath.canonical import (
    CanonicalURL,
    ExpandedBatch,
    canonical_url,
    expand_many,
    expressions_of,
)
from urlguard.hotpath.cleancache import CleanCache, LRUCleanCache
from urlguard.models import SpamRule, database
from urlguard.nodesync import registry
from urlguard.runtime import metrics
from urlguard.runtime.process import PerProcess
from urlguard.runtime.ratelimitedlog import log_limited

if TYPE_CHECKING:
    from filterengine import ScalingCountingBloomFilter

logger = logging.getLogger(__name__)

__all__ = [
    "CheckedFilter",
    "Guard",
    "InvalidURL",
    "ProbingFilter",
    "Verdict",
    "get_guard",
    "reset_guard",
    "use_guard",
]

QUERY_CHUNK = database.IN_BATCH


class InvalidURL(ValueError):
    """The destination is not a usable http(s) URL, so there is nothing to look up."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the guard decided about one URL.

    `maybe` lists the expressions the filter answered "maybe" for (the admin's
    check page shows them); `degraded` is True when the filter could not be
    read and the answer came from the ON_FILTER_ERROR policy instead; `error` is
    set only by `Guard.check_many` for a URL that could not be checked (where
    `Guard.check` raises InvalidURL), and then `blocked` is False.
    """

    url: str
    canonical: str
    blocked: bool
    rule: SpamRule | None = None
    category: str = ""
    reason: str = ""
    maybe: tuple[str, ...] = ()
    degraded: bool = False
    error: str = ""

    @property
    def category_label(self) -> str:
        if self.rule is not None:
            return str(self.rule.get_category_display())
        return self.category


_SET = {f.name: Verdict.__dict__[f.name].__set__ for f in fields(Verdict)}
_set_url, _set_canonical, _set_blocked = _SET["url"], _SET["canonical"], _SET["blocked"]
_set_rule, _set_category, _set_reason = _SET["rule"], _SET["category"], _SET["reason"]
_set_maybe, _set_degraded, _set_error = _SET["maybe"], _SET["degraded"], _SET["error"]


def _clean(url: str, canonical: str) -> Verdict:
    """Verdict(url=url, canonical=canonical, blocked=False), in half the time: a
    frozen dataclass's __init__ goes through object.__setattr__ once per field,
    and a batch makes one of these for nearly every URL. (A field added to Verdict
    must be set here too: test_guard compares this with Verdict's own.)"""
    verdict: Verdict = object.__new__(Verdict)
    _set_url(verdict, url)
    _set_canonical(verdict, canonical)
    _set_blocked(verdict, False)
    _set_rule(verdict, None)
    _set_category(verdict, "")
    _set_reason(verdict, "")
    _set_maybe(verdict, ())
    _set_degraded(verdict, False)
    _set_error(verdict, "")
    return verdict


def _specificity(expression: str) -> tuple[int, int]:
    # Longer host first (sub.example.com/ beats example.com/), then longer path
    # (example.com/a/b/ beats example.com/a/): the most specific rule explains
    # the block best and carries the category the list maintainer meant.
    host, _, path = expression.partition("/")
    return (host.count(".") + 1, len(path))


def most_specific(rules: Iterable[SpamRule]) -> SpamRule | None:
    return max(rules, key=lambda r: _specificity(r.expression), default=None)


def _describe(rule: SpamRule) -> str:
    return f"matches the rule {rule.expression} ({rule.get_category_display()})"


def _table_only(url: str, canonical: str, rule: SpamRule | None, why: str) -> Verdict:
    """The verdict of the "database" policy: the spam table's answer alone."""
    note = f"checked against the spam table only: {why}"
    if rule is None:
        return Verdict(url=url, canonical=canonical, blocked=False, degraded=True, reason=note)
    return Verdict(
        url=url,
        canonical=canonical,
        blocked=True,
        rule=rule,
        category=rule.category,
        degraded=True,
        reason=f"{_describe(rule)}; {note}",
    )


class CheckedFilter(Protocol):
    """What the guard asks of a filter: ScalingCountingBloomFilter, or a host's own.
    Where it has them, `maybe_present` (ProbingFilter) and `generation`/`applied_seq`
    (the clean cache's validity) are used too."""

    def contains(self, key: str) -> bool: ...

    def contains_many(self, keys: Sequence[str]) -> np.ndarray: ...


class ProbingFilter(CheckedFilter, Protocol):
    """A filter that answers a handful of keys with one check of its file, as
    ScalingCountingBloomFilter does: the guard asks one URL's keys this way where the
    filter has it (a host's own may not), and contains() key by key elsewhere."""

    def maybe_present(self, keys: Sequence[str]) -> list[str]:
        """The keys that may be present, in order."""
        ...


if TYPE_CHECKING:  # mypy holds the engine's filter to both protocols
    _engine_filter: type[ProbingFilter] = ScalingCountingBloomFilter


class Guard:
    """Checks URLs against the filter returned by `get_filter` and the spam table.

    `get_filter()` returns the process's read-only filter, or None when it cannot
    be read; it is called on every check (the registry makes that a lookup) so
    a rebuilt file is picked up. Settings are resolved once, here.
    """

    def __init__(
        self,
        get_filter: Callable[[], CheckedFilter | None],
        *,
        on_filter_error: str = "database",
        clean_cache: CleanCache | None = None,
        discard_filter: Callable[[], None] | None = None,
        why_unavailable: Callable[[], str] | None = None,
    ) -> None:
        if on_filter_error not in POLICIES:
            raise ValueError(
                f"URLGUARD['ON_FILTER_ERROR'] must be one of {', '.join(POLICIES)}; "
                f"got {on_filter_error!r}"
            )
        self.get_filter = get_filter
        # Called after the filter raised, so that the next check maps it afresh.
        self._discard_filter = discard_filter
        # Says why get_filter() returned None (missing, dirty, behind...): degraded
        # path only.
        self._why_unavailable = why_unavailable
        self.on_filter_error = on_filter_error
        self.clean_cache: CleanCache = clean_cache if clean_cache is not None else LRUCleanCache()
        # (generation, applied_seq) of the filter the clean cache was filled under.
        self._clean_token: tuple[Any, Any] | None = None

    # -- the hot path -----------------------------------------------------------

    @metrics.timed_check
    def check(self, url: str, parsed: CanonicalURL | None = None) -> Verdict:
        """Return the verdict for `url`; raise InvalidURL if it is not a usable http(s) URL.

        `parsed` is canonical_url(url) where the caller has read `url` already
        (the middleware: browser_target(destination) gives the URL to send and
        its reading), so that each destination is read once."""
        if parsed is None:
            try:
                parsed = canonical_url(url)
            except ValueError as exc:
                raise InvalidURL(f"not a usable http(s) URL: {exc}") from exc
        canonical = str(parsed)
        exprs = expressions_of(parsed)

        filt = self.get_filter()
        if filt is None:
            return self._degraded(url, canonical, exprs, self._unavailable())
        try:
            # Scalar probes with one check of the file, not contains_many: for
            # the ~10 keys of one URL the vectorised path costs more in numpy
            # set-up than it saves (measured 25 µs vs 345 µs on a 4-stage
            # 1M-rule filter, bench/guard.py). check_many() uses contains_many.
            # A ProbingFilter? (hasattr: a protocol's isinstance costs microseconds)
            if hasattr(filt, "maybe_present"):
                maybe = tuple(cast(ProbingFilter, filt).maybe_present(exprs))
            else:  # another filter type (a host's own): key by key
                maybe = tuple([e for e in exprs if filt.contains(e)])
        except Exception as exc:  # any failure of the filter is a degraded filter
            self._discard()
            return self._degraded(
                url, canonical, exprs, f"reading the filter failed: {exc}", exc_info=True
            )
        if not maybe:
            return Verdict(url=url, canonical=canonical, blocked=False)

        token = self._cache_token(filt)
        if canonical in self.clean_cache:
            return Verdict(
                url=url,
                canonical=canonical,
                blocked=False,
                maybe=maybe,
                reason="filter false positive (cached)",
            )
        rule = most_specific(SpamRule.objects.filter(expression__in=maybe))
        if rule is None:
            # Only store under the token read before the query: if the filter
            # advanced meanwhile (a rule was added), the cache was cleared and
            # this answer may be stale.
            if self._clean_token == token:
                self.clean_cache.add(canonical)
            return Verdict(
                url=url,
                canonical=canonical,
                blocked=False,
                maybe=maybe,
                reason="filter false positive",
            )
        return Verdict(
            url=url,
            canonical=canonical,
            blocked=True,
            rule=rule,
            category=rule.category,
            reason=_describe(rule),
            maybe=maybe,
        )

    def _unavailable(self) -> str:
        why = ""
        if self._why_unavailable is not None:
            try:
                why = self._why_unavailable()
            except Exception:
                logger.debug("asking why the filter is unavailable failed", exc_info=True)
        if why:
            return f"the filter file could not be opened or used: it is {why}"
        return "the filter file could not be opened"

    def _discard(self) -> None:
        if self._discard_filter is not None:
            try:
                self._discard_filter()
            except Exception:
                logger.debug("discarding the filter mapping failed", exc_info=True)

    def _cache_token(self, filt: CheckedFilter) -> tuple[Any, Any]:
        # The clean cache is valid for one state of the filter: any applied
        # change or rebuild may have listed a URL we remember as clean.
        try:
            token = (getattr(filt, "generation", None), getattr(filt, "applied_seq", None))
        except Exception:  # the file went bad since the lookup: cache nothing under it
            token = (object(), None)
        if token != self._clean_token:
            self.clean_cache.clear()
            self._clean_token = token
        return token

    def _degraded(
        self, url: str, canonical: str, exprs: list[str], why: str, *, exc_info: bool = False
    ) -> Verdict:
        policy = self.on_filter_error
        log_limited(
            "filter",
            logging.ERROR,
            "urlguard: %s; ON_FILTER_ERROR=%r applies until it is readable again "
            "(run `manage.py sync_filter` or `rebuild_filter`)",
            why,
            policy,
            exc_info=exc_info,
        )
        if policy != "database":
            return self._unchecked(url, canonical, why)
        rule = most_specific(SpamRule.objects.filter(expression__in=exprs))
        return _table_only(url, canonical, rule, why)

    def _unchecked(self, url: str, canonical: str, why: str) -> Verdict:
        """The verdict of the "open" or "closed" policy."""
        if self.on_filter_error == "open":
            return Verdict(
                url=url,
                canonical=canonical,
                blocked=False,
                degraded=True,
                reason=f"not checked: {why} (failing open)",
            )
        return Verdict(
            url=url,
            canonical=canonical,
            blocked=True,
            degraded=True,
            reason=f"could not be checked: {why} (failing closed)",
        )

    # -- batches (rescans) ------------------------------------------------------

    @metrics.counted_checks
    def check_many(self, urls: Sequence[str]) -> list[Verdict]:
        """Verdicts for many URLs, each as `check` gives it: every URL read once
        (canonical.expand_many), one `contains_many` call for all their
        expressions, and one table query per QUERY_CHUNK filter hits.

        A URL that is not a usable http(s) URL gets a Verdict with `error` set
        (blocked False) rather than an exception, so one bad row cannot stop a
        rescan of thousands."""
        batch = expand_many(urls)
        exprs, starts = batch.exprs, batch.starts

        degraded_why = ""
        # Positions in `exprs` the filter may hold: few (listed URLs and false
        # positives), so everything after the probe works on them alone.
        hit_positions: list[int] = []
        filt = self.get_filter()
        if filt is None:
            degraded_why = self._unavailable()
        elif exprs:
            try:
                hit_positions = np.flatnonzero(filt.contains_many(exprs)).tolist()
            except Exception as exc:
                self._discard()
                degraded_why = f"reading the filter failed: {exc}"
        if degraded_why:
            log_limited(
                "filter",
                logging.ERROR,
                "urlguard: %s; ON_FILTER_ERROR=%r applies to this batch",
                degraded_why,
                self.on_filter_error,
            )
            return self._degraded_many(urls, batch, degraded_why)

        # The URLs with a hit, each with its hit expressions in order.
        maybe_of: dict[int, list[str]] = {}
        index = 0
        for position in hit_positions:
            while starts[index + 1] <= position:
                index += 1
            maybe_of.setdefault(index, []).append(exprs[position])
        rules = _rules_for(list(dict.fromkeys(e for hits in maybe_of.values() for e in hits)))

        verdicts = []
        canonicals, errors = batch.canonical, batch.errors
        for i, url in enumerate(urls):
            maybe_list = maybe_of.get(i)
            if maybe_list is None:
                if i in errors:
                    verdicts.append(_unusable(url, errors[i]))
                else:
                    verdicts.append(_clean(url, canonicals[i]))
                continue
            maybe = tuple(maybe_list)
            rule = most_specific(rules[e] for e in maybe if e in rules)
            if rule is None:
                verdicts.append(
                    Verdict(
                        url=url,
                        canonical=canonicals[i],
                        blocked=False,
                        maybe=maybe,
                        reason="filter false positive",
                    )
                )
            else:
                verdicts.append(
                    Verdict(
                        url=url,
                        canonical=canonicals[i],
                        blocked=True,
                        rule=rule,
                        category=rule.category,
                        reason=_describe(rule),
                        maybe=maybe,
                    )
                )
        return verdicts

    def _degraded_many(self, urls: Sequence[str], batch: ExpandedBatch, why: str) -> list[Verdict]:
        """check_many's verdicts under ON_FILTER_ERROR, as `check` gives each."""
        canonicals, errors, exprs, starts = batch
        table = self.on_filter_error == "database"
        rules = _rules_for(list(dict.fromkeys(exprs))) if table else {}
        verdicts = []
        for i, url in enumerate(urls):
            if i in errors:
                verdicts.append(_unusable(url, errors[i]))
            elif table:
                listed = (rules[e] for e in exprs[starts[i] : starts[i + 1]] if e in rules)
                verdicts.append(_table_only(url, canonicals[i], most_specific(listed), why))
            else:
                verdicts.append(self._unchecked(url, canonicals[i], why))
        return verdicts


def _unusable(url: str, error: str) -> Verdict:
    why = f"not a usable http(s) URL: {error}"
    return Verdict(url=url, canonical="", blocked=False, error=why, reason=why)


def _rules_for(expressions: list[str]) -> dict[str, SpamRule]:
    """The spam table's rules among `expressions`, one query per QUERY_CHUNK."""
    rules: dict[str, SpamRule] = {}
    for start in range(0, len(expressions), QUERY_CHUNK):
        chunk = expressions[start : start + QUERY_CHUNK]
        # No ORDER BY: the rules are looked up by expression, which is unique.
        found = SpamRule.objects.filter(expression__in=chunk).order_by()
        rules.update((rule.expression, rule) for rule in found)
    return rules


def _make_guard() -> Guard:
    # The path is resolved once here, not on every check.
    path = conf.FILTER_PATH
    return Guard(
        partial(registry.get_filter, path),
        on_filter_error=conf.ON_FILTER_ERROR,
        discard_filter=partial(registry.forget, path),
        why_unavailable=partial(registry.problem, path),
    )


# The test client builds a new middleware per request, so nothing per-instance may
# hold the filter or the caches.
_guard: PerProcess[Guard] = PerProcess(_make_guard, name="guard")

#: The process-wide Guard.
get_guard = _guard.get
#: Forget the process-wide Guard (settings changed; tests).
reset_guard = _guard.reset


def use_guard(guard: Guard) -> AbstractContextManager[None]:
    """`with use_guard(Guard(...)):` the process-wide Guard for the block (tests: a
    fake filter, a failure policy)."""
    return _guard.use(guard)


@receiver(setting_changed)
def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "URLGUARD":
        reset_guard()
