"""The hot path: is this redirect destination on the spam list?

`Guard.check(url)` canonicalizes the URL, asks the Bloom filter about every
roll-up expression and, only when the filter says "maybe", confirms in the spam
table with one indexed query. The filter never says "no" falsely, and the table
is the truth, so a clean URL costs no database round trip and a listed URL is
never missed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from urlguard.conf import ON_FILTER_ERROR_POLICIES as POLICIES
from urlguard.conf import conf
from urlguard.hotpath.canonical import canonicalize, expressions
from urlguard.hotpath.cleancache import CleanCache, LRUCleanCache
from urlguard.models import SpamRule
from urlguard.nodesync import registry
from urlguard.runtime import metrics
from urlguard.runtime.process import PerProcess
from urlguard.runtime.ratelimitedlog import log_limited

logger = logging.getLogger(__name__)

__all__ = ["Guard", "InvalidURL", "Verdict", "get_guard", "reset_guard", "use_guard"]

# SQLite allows 32766 bound variables (999 before 3.32); PostgreSQL 65535. 500
# expressions per IN (...) keeps every backend happy and each query small.
QUERY_CHUNK = 500


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


@dataclass(slots=True)
class _Prepared:
    url: str
    canonical: str = ""
    exprs: list[str] = field(default_factory=list)
    error: str = ""


class Guard:
    """Checks URLs against the filter returned by `get_filter` and the spam table.

    `get_filter()` returns the process's read-only filter, or None when it cannot
    be read; it is called on every check (the registry makes that a lookup) so
    a rebuilt file is picked up. Settings are resolved once, here.
    """

    def __init__(
        self,
        get_filter: Callable[[], Any],
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
    def check(self, url: str) -> Verdict:
        """Return the verdict for `url`; raise InvalidURL if it is not a usable http(s) URL."""
        try:
            canonical = canonicalize(url)
            exprs = expressions(canonical)
        except ValueError as exc:
            raise InvalidURL(f"not a usable http(s) URL: {exc}") from exc

        filt = self.get_filter()
        if filt is None:
            return self._degraded(url, canonical, exprs, self._unavailable())
        try:
            # Scalar probes with one check of the file, not contains_many: for
            # the ~10 keys of one URL the vectorised path costs more in numpy
            # set-up than it saves (measured 25 µs vs 345 µs on a 4-stage
            # 1M-rule filter, bench/guard.py). check_many() uses contains_many.
            present = getattr(filt, "maybe_present", None)
            if present is not None:
                maybe = tuple(present(exprs))
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

    def _cache_token(self, filt: Any) -> tuple[Any, Any]:
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
        """Verdicts for many URLs: one `contains_many` call for all their
        expressions and one table query per QUERY_CHUNK filter hits.

        A URL that is not a usable http(s) URL gets a Verdict with `error` set
        (blocked False) rather than an exception, so one bad row cannot stop a
        rescan of thousands."""
        prepared: list[_Prepared] = []
        for url in urls:
            item = _Prepared(url)
            try:
                item.canonical = canonicalize(url)
                item.exprs = expressions(item.canonical)
            except ValueError as exc:
                item.error = f"not a usable http(s) URL: {exc}"
            prepared.append(item)
        unique = list(dict.fromkeys(e for p in prepared for e in p.exprs))

        degraded_why = ""
        maybe_set: set[str] = set()
        filt = self.get_filter()
        if filt is None:
            degraded_why = self._unavailable()
        elif unique:
            try:
                hits = filt.contains_many(unique)
                maybe_set = {e for e, hit in zip(unique, hits.tolist(), strict=True) if hit}
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
            if self.on_filter_error == "database":
                maybe_set = set(unique)

        rules: dict[str, SpamRule] = {}
        to_confirm = [e for e in unique if e in maybe_set]
        for start in range(0, len(to_confirm), QUERY_CHUNK):
            chunk = to_confirm[start : start + QUERY_CHUNK]
            rules.update((r.expression, r) for r in SpamRule.objects.filter(expression__in=chunk))

        verdicts = []
        for p in prepared:
            if p.error:
                verdicts.append(
                    Verdict(url=p.url, canonical="", blocked=False, error=p.error, reason=p.error)
                )
                continue
            rule = most_specific(rules[e] for e in p.exprs if e in rules)
            if degraded_why:
                verdicts.append(
                    _table_only(p.url, p.canonical, rule, degraded_why)
                    if self.on_filter_error == "database"
                    else self._unchecked(p.url, p.canonical, degraded_why)
                )
                continue
            maybe = tuple(e for e in p.exprs if e in maybe_set)
            if rule is None:
                verdicts.append(
                    Verdict(
                        url=p.url,
                        canonical=p.canonical,
                        blocked=False,
                        maybe=maybe,
                        reason="filter false positive" if maybe else "",
                    )
                )
            else:
                verdicts.append(
                    Verdict(
                        url=p.url,
                        canonical=p.canonical,
                        blocked=True,
                        rule=rule,
                        category=rule.category,
                        reason=_describe(rule),
                        maybe=maybe,
                    )
                )
        return verdicts


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
