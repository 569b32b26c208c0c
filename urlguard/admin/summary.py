"""The operator's day at a glance, for the admin's first page and the dashboard: open
mistake reports, feeds failing or held, how far the nodes lag the change log, and
warnings shown today. A handful of indexed queries, no feed or filter work."""

from __future__ import annotations

from typing import Any

from django.db.models import Sum
from django.urls import reverse
from django.utils import timezone

from urlguard.conf import conf
from urlguard.models import ChangeEvent, MistakeReport, NodeStatus, RuleHitDay, Source

__all__ = ["operator_summary"]


def operator_summary() -> dict[str, Any]:
    open_reports = MistakeReport.objects.filter(status=MistakeReport.Status.OPEN).count()
    feeds = Source.objects.filter(kind=Source.Kind.FEED, enabled=True)
    held = feeds.filter(held_at__isnull=False).count()
    failing = (
        feeds.filter(held_at__isnull=True)
        .filter(failures__gte=conf.FEED_UNHEALTHY_FAILURES)
        .count()
    )
    head = ChangeEvent.objects.head()
    nodes = list(NodeStatus.objects.values_list("node", "applied_seq"))
    lag, lagging_node = 0, ""
    for node, applied in nodes:
        if head - applied > lag:
            lag, lagging_node = head - applied, node
    warnings_today = (
        RuleHitDay.objects.filter(day=timezone.localdate()).aggregate(n=Sum("hits"))["n"] or 0
    )
    feeds_url = reverse("admin:urlguard_source_changelist") + "?kind__exact=feed"
    return {
        "open_reports": open_reports,
        "reports_url": reverse("admin:urlguard_mistakereport_changelist") + "?status__exact=open",
        "failing_feeds": failing,
        "held_feeds": held,
        "feeds_url": feeds_url,
        "nodes": len(nodes),
        "lag": lag,
        "lagging_node": lagging_node,
        "warnings_today": warnings_today,
        "attention": bool(open_reports or failing or held or lag),
    }
