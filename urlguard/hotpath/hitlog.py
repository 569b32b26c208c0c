"""The hit log: which rules fire, how often, when last, how many visitors clicked
"continue anyway", and which blocked hosts come up most. Recorded on the warning
page (never on the redirect's fast path) into the batched statistics buffer of
urlguard.runtime.stats, flushed once a second by its thread, one statement per table: a
warning costs an append in memory, never a database write.

Per rule and day (RuleHitDay: hits, continued, last hit) and per blocked host and
day (HostHitDay), kept HIT_LOG_DAYS days; per rule since it was listed
(RuleHitTotal: the sortable columns of the rules list). And each event on its own
(HitEvent: when, where from, the destination, the rule and its expression), the
newest HIT_EVENTS_KEPT kept: the admin's hit log.

The daily rows past HIT_LOG_DAYS are pruned daily: by Celery beat (`urlguard-hit-log`),
or without a broker by a daemon thread of each serving process, started by its first
request (like the embedded catch-up and feed refresh)."""

from __future__ import annotations

import datetime as dt
import logging
import threading
from typing import Any

from django.db import connections
from django.db.models import Sum
from django.utils import timezone

from urlguard.celery import PRUNE_HIT_LOG_INTERVAL, PRUNE_HIT_LOG_TASK, shared_task
from urlguard.conf import conf
from urlguard.models import HitEvent, HostHitDay, RuleHitDay, RuleHitTotal, SpamRule, database
from urlguard.runtime import stats
from urlguard.runtime.firstrequest import FirstRequest
from urlguard.runtime.process import Daemon

__all__ = [
    "api_blocked",
    "continued",
    "full_hash_matched",
    "install",
    "prune",
    "prune_hit_log",
    "stop",
    "text_blocked",
    "top_hosts",
    "top_rules",
    "warned",
]

logger = logging.getLogger(__name__)

WARNED, CONTINUED = 0, 1


def _write(items: list[tuple[int, int, str, dt.datetime]]) -> None:
    """Flush (urlguard.runtime.stats, inside a transaction): merge the buffered events."""
    days: dict[tuple[int, dt.date], list] = {}
    totals: dict[int, list] = {}
    hosts: dict[tuple[str, dt.date], int] = {}
    for kind, rule_id, host, at in items:
        day = at.date()
        entry = days.setdefault((rule_id, day), [0, 0, at])
        total = totals.setdefault(rule_id, [0, 0, at])
        for row in (entry, total):
            row[kind] += 1
            row[2] = max(row[2], at)
        if kind == WARNED and host:
            hosts[(host[:255], day)] = hosts.get((host[:255], day), 0) + 1
    database.upsert_adding(
        RuleHitDay,
        ("rule_id", "day"),
        ("hits", "continued"),
        "last_at",
        [(r, d, h, c, at) for (r, d), (h, c, at) in days.items()],
    )
    database.upsert_adding(
        RuleHitTotal,
        ("rule_id",),
        ("hits", "continued"),
        "last_at",
        [(r, h, c, at) for r, (h, c, at) in totals.items()],
    )
    database.upsert_adding(
        HostHitDay, ("host", "day"), ("hits",), None, [(h, d, n) for (h, d), n in hosts.items()]
    )


EVENTS = stats.batch("rule_hits", flush=_write, model=RuleHitDay)


def _write_events(events: list[HitEvent]) -> None:
    """Flush (urlguard.runtime.stats, inside a transaction): the events, each with its rule's
    expression and category (one query), then forget all but the newest
    HIT_EVENTS_KEPT (one indexed DELETE: ids grow with time)."""
    missing = {e.rule_id for e in events if e.rule_id is not None and not e.expression}
    if missing:
        known = {
            pk: (expression, category)
            for pk, expression, category in SpamRule.objects.filter(pk__in=missing).values_list(
                "pk", "expression", "category"
            )
        }
        for event in events:
            if not event.expression and event.rule_id in known:
                event.expression, event.category = known[event.rule_id]
                if event.action == HitEvent.Action.FULL_HASH and not event.host:
                    # The browser sends no URL: the rule's host is what it was warned of.
                    event.host = event.expression.split("/", 1)[0][:255]
    created = HitEvent.objects.bulk_create(events)
    newest = max((e.pk for e in created if e.pk is not None), default=None)
    if newest is None:
        newest = HitEvent.objects.order_by("-pk").values_list("pk", flat=True).first()
    if newest is not None:
        HitEvent.objects.filter(pk__lte=newest - conf.HIT_EVENTS_KEPT).delete()


HIT_EVENTS = stats.batch("hit_events", flush=_write_events, model=HitEvent)


def warned(
    rule_id: int,
    host: str,
    *,
    where: str = "",
    destination: str = "",
    expression: str = "",
    category: str = "",
) -> None:
    """The warning page was shown for `rule_id`'s block of `host` (a redirect from
    `where` to `destination`)."""
    now = timezone.now()
    EVENTS.append((WARNED, rule_id, host, now))
    HIT_EVENTS.append(
        HitEvent(
            at=now,
            action=HitEvent.Action.WARNED,
            where=where[:200],
            destination=destination[:2000],
            host=host[:255],
            rule_id=rule_id,
            expression=expression[:2000],
            category=category,
        )
    )


def api_blocked(verdict: Any, *, where: str) -> None:
    """The check API answered "blocked" for `verdict` (an event of the hit log only:
    no warning was shown, so the daily warning counts do not move)."""
    _blocked_event(verdict, HitEvent.Action.API, where)


def text_blocked(verdict: Any, *, where: str) -> None:
    """A link in posted text (a comment, a form field, `api/check-text`) was found
    listed (an event of the hit log only, like an API answer)."""
    _blocked_event(verdict, HitEvent.Action.TEXT, where)


def _blocked_event(verdict: Any, action: str, where: str) -> None:
    rule = verdict.rule
    if rule is None:
        return
    host = verdict.canonical.split("://", 1)[-1].split("/", 1)[0] if verdict.canonical else ""
    HIT_EVENTS.append(
        HitEvent(
            at=timezone.now(),
            action=action,
            where=where[:200],
            destination=str(verdict.url)[:2000],
            host=host[:255],
            rule_id=rule.pk,
            expression=rule.expression[:2000],
            category=rule.category,
        )
    )


def full_hash_matched(rule_id: int, *, where: str) -> None:
    """A Safe Browsing client was answered the full hash of rule `rule_id` (a browser
    about to show its own warning; only the hash is sent, never the URL). The flush
    names the rule's expression and category."""
    HIT_EVENTS.append(
        HitEvent(
            at=timezone.now(), action=HitEvent.Action.FULL_HASH, where=where[:200], rule_id=rule_id
        )
    )


def continued(rule_id: int, *, destination: str = "", host: str = "") -> None:
    """A visitor followed "continue anyway" past `rule_id`'s warning."""
    now = timezone.now()
    EVENTS.append((CONTINUED, rule_id, "", now))
    HIT_EVENTS.append(
        HitEvent(
            at=now,
            action=HitEvent.Action.CONTINUED,
            destination=destination[:2000],
            host=host[:255],
            rule_id=rule_id,
        )
    )


def prune(now: dt.datetime | None = None) -> int:
    """Forget daily rows older than HIT_LOG_DAYS (the per-rule totals stay)."""
    cutoff = (now or timezone.now()).date() - dt.timedelta(days=conf.HIT_LOG_DAYS)
    removed, _ = RuleHitDay.objects.filter(day__lt=cutoff).delete()
    hosts, _ = HostHitDay.objects.filter(day__lt=cutoff).delete()
    return removed + hosts


@shared_task(name=PRUNE_HIT_LOG_TASK, ignore_result=True)
def prune_hit_log() -> int:
    """Scheduled (beat, daily): prune()."""
    return prune()


def install() -> None:
    """No broker: prune in a daemon thread of this process from its first request on."""
    _first_request.install()


def _loop(stopped: threading.Event) -> None:
    # At start, then daily: a process restarted more often than daily still prunes.
    while not stopped.is_set():
        try:
            prune()
        except Exception:
            logger.exception("pruning the hit log failed; retrying in %g s", PRUNE_HIT_LOG_INTERVAL)
        finally:
            connections.close_all()
        pruner.wait(PRUNE_HIT_LOG_INTERVAL)


#: The pruning thread of this process.
pruner = Daemon("urlguard-hit-log", _loop)
_first_request = FirstRequest("urlguard.hotpath.hitlog", pruner.start)


def stop(timeout: float = 5.0) -> None:
    """Stop the thread (tests), so that a later install() starts a new one."""
    pruner.stop(timeout)
    _first_request.uninstall()


def _since(days: int) -> dt.date:
    return timezone.now().date() - dt.timedelta(days=days - 1)


def top_rules(days: int = 7, limit: int = 10) -> list[dict]:
    """[{rule_id, expression, hits, continued}] most hits first, over `days` days."""
    rows = list(
        RuleHitDay.objects.filter(day__gte=_since(days))
        .values("rule_id")
        .annotate(hits=Sum("hits"), continued=Sum("continued"))
        .order_by("-hits")[:limit]
    )
    ids = [r["rule_id"] for r in rows]
    names = dict(SpamRule.objects.filter(pk__in=ids).values_list("pk", "expression"))
    # A removed rule is named by the expression its events kept.
    gone = dict(
        HitEvent.objects.filter(rule_id__in=set(ids) - names.keys())
        .exclude(expression="")
        .values_list("rule_id", "expression")
    )
    return [
        {**r, "expression": names.get(r["rule_id"]), "removed": gone.get(r["rule_id"])}
        for r in rows
    ]


def top_hosts(days: int = 7, limit: int = 10) -> list[dict]:
    rows = (
        HostHitDay.objects.filter(day__gte=_since(days))
        .values("host")
        .annotate(hits=Sum("hits"))
        .order_by("-hits")[:limit]
    )
    return [dict(row) for row in rows]


def daily_hits(days: int = 7) -> list[tuple[dt.date, int]]:
    """Warnings shown per day, oldest first, zero-filled."""
    first = _since(days)
    found = dict(
        RuleHitDay.objects.filter(day__gte=first)
        .values_list("day")
        .annotate(n=Sum("hits"))
        .values_list("day", "n")
    )
    return [
        (first + dt.timedelta(days=i), found.get(first + dt.timedelta(days=i), 0))
        for i in range(days)
    ]


def rule_days(rule_id: int, days: int = 7) -> list[tuple[dt.date, int]]:
    """One rule's warnings per day, oldest first, zero-filled."""
    first = _since(days)
    found = dict(
        RuleHitDay.objects.filter(rule_id=rule_id, day__gte=first).values_list("day", "hits")
    )
    return [
        (first + dt.timedelta(days=i), found.get(first + dt.timedelta(days=i), 0))
        for i in range(days)
    ]
