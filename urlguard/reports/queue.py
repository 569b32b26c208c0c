"""The mistake-report queue's work: closing the reports about a rule with the change
set that acted on them, the change set an action makes (its reason is the report),
who lists a reported rule, and the three actions on a report besides narrowing it:
remove its rule, allowlist the host a feed's rule blocks whole, dismiss it. The admin
(urlguard.admin.reportqueue) shows the queue and asks before it acts."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.utils import timezone

from urlguard.hotpath.canonical import split_expression
from urlguard.models import Actor, ChangeSet, MistakeReport, RuleSource, Source, SpamRule
from urlguard.writepath import changes
from urlguard.writepath.allowlist import AllowResult, allow_host

__all__ = [
    "acting_on",
    "allowlist_host_of",
    "allowlist_reported_host",
    "dismiss",
    "listings",
    "reason_of",
    "remove_reported_rule",
    "resolve",
]


def resolve(rule_or_report, status: str, actor: Actor, change_set: ChangeSet | None = None) -> int:
    """Close the open reports about the report's rule (or about `rule`), linking the
    change set that acted on them."""
    if isinstance(rule_or_report, MistakeReport):
        reports = MistakeReport.objects.filter(pk=rule_or_report.pk)
        if rule_or_report.rule_id is not None:
            reports = MistakeReport.objects.filter(rule_id=rule_or_report.rule_id)
    else:
        reports = MistakeReport.objects.filter(rule=rule_or_report)
    return reports.filter(status=MistakeReport.Status.OPEN).update(
        status=status, resolved_by=actor, resolved_at=timezone.now(), change_set=change_set
    )


def reason_of(report: MistakeReport) -> str:
    """What a change set made for `report` says as its reason."""
    text = f"mistake report #{report.pk} about {report.destination[:300]}"
    if report.comment:
        text += f": “{report.comment[:300]}”"
    return text


@contextmanager
def acting_on(report_id: Any, actor: Actor) -> Iterator[ChangeSet | None]:
    """A change set for the writes inside, carrying the report (given by its id, as
    the narrow form passes it) as its reason; None (no set) for no such report."""
    report = MistakeReport.objects.filter(pk=int(report_id)).first() if report_id else None
    if report is None:
        yield None
        return
    with changes.change_set(kind=ChangeSet.Kind.ADMIN, actor=actor, reason=reason_of(report)) as cs:
        try:
            yield cs
        except BaseException:
            if not ChangeSet.objects.filter(pk=cs.pk, events__isnull=False).exists():
                cs.delete()  # refused before anything was written: no empty set stays
            raise


def listings(rule: SpamRule) -> list[RuleSource]:
    """Who lists `rule` and since when, feeds first."""
    rows = RuleSource.objects.filter(rule=rule).select_related("source")
    return sorted(rows, key=lambda row: (not row.source.is_feed, row.source.name))


def allowlist_host_of(rule: SpamRule) -> str | None:
    """The host to allowlist against `rule`: a rule on a whole host that a feed lists
    (the allowlist refuses only such rules, and only from feeds)."""
    host, path = split_expression(rule.expression)
    if path != "/":
        return None
    if not RuleSource.objects.filter(rule=rule, source__kind=Source.Kind.FEED).exists():
        return None
    return host


def remove_reported_rule(
    report: MistakeReport, rule: SpamRule, actor: Actor
) -> tuple[ChangeSet, int]:
    """Remove the report's rule in a change set whose reason is the report, closing the
    open reports about it: (the change set, how many reports it closed)."""
    with changes.change_set(kind=ChangeSet.Kind.ADMIN, actor=actor, reason=reason_of(report)) as cs:
        # Closed first: removing the rule unlinks its reports (SET_NULL).
        closed = resolve(report, MistakeReport.Status.REMOVED, actor, cs)
        changes.remove_rule(rule, actor=actor, source="admin", change_set=cs)
    return cs, closed


def allowlist_reported_host(
    report: MistakeReport, rule: SpamRule, host: str, actor: Actor
) -> tuple[AllowResult, int]:
    """Allowlist `host`, which the feeds' `rule` blocks whole: their listings are
    withdrawn at once and stay out at their next refreshes; the open reports about the
    rule are closed. (What allow_host did, how many reports it closed.)"""
    # Read first: withdrawing the rule unlinks its reports (SET_NULL).
    about = list(
        MistakeReport.objects.filter(rule=rule, status=MistakeReport.Status.OPEN).values_list(
            "pk", flat=True
        )
    )
    result = allow_host(host, note=reason_of(report)[:200], actor=actor)
    closed = MistakeReport.objects.filter(pk__in=about, status=MistakeReport.Status.OPEN).update(
        status=MistakeReport.Status.ALLOWLISTED,
        resolved_by=actor,
        resolved_at=timezone.now(),
        change_set=result.change_set,
    )
    return result, closed


def dismiss(report: MistakeReport, actor: Actor) -> None:
    """Close `report`; its rule stays."""
    MistakeReport.objects.filter(pk=report.pk, status=MistakeReport.Status.OPEN).update(
        status=MistakeReport.Status.DISMISSED, resolved_by=actor, resolved_at=timezone.now()
    )
