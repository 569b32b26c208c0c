"""`GET /metrics`: this node's Prometheus metrics (urlguard.runtime.metrics) plus what is
read when scraped (the filter file, the feeds, the statistics lost), for allowed
addresses or the token."""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from urlguard.conf import conf
from urlguard.models import ChangeEvent, NodeStatus, Source, StatsLoss
from urlguard.nodesync import registry
from urlguard.runtime import metrics

if metrics.HAVE_PROMETHEUS:
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.multiprocess import MultiProcessCollector

logger = logging.getLogger(__name__)


class FilterCollector:
    """This node's filter file as it is when scraped (any process maps the same file)."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        figures: dict[str, tuple[str, float]] = {}
        filt = registry.get_filter(conf.FILTER_PATH)
        try:
            if filt is not None:
                figures.update(
                    applied_seq=("Newest change-log seq applied to the file", filt.applied_seq),
                    rules=("Rules in this node's filter file", filt.count),
                    stages=("Stages in this node's filter file", filt.stage_count),
                )
        except Exception:
            logger.warning("metrics: reading filter %s failed", conf.FILTER_PATH, exc_info=True)
            figures.clear()
        readable = ("1 if this node's filter file is readable, else 0", float(bool(figures)))
        figures["readable"] = readable
        if "applied_seq" in figures:
            try:
                head = ChangeEvent.objects.head()
                info = (
                    NodeStatus.objects.filter(node=conf.NODE_NAME)
                    .values_list("info", flat=True)
                    .first()
                )
            except Exception:
                logger.warning("metrics: the database did not answer", exc_info=True)
            else:
                figures["lag_changes"] = (
                    "Change-log rows this node's filter file has not applied yet",
                    max(0, head - figures["applied_seq"][1]),
                )
                fpr = (info or {}).get("estimated_fpr")
                if isinstance(fpr, (int, float)):
                    figures["estimated_fpr"] = (
                        "False-positive rate of the file, measured at its last full status report",
                        fpr,
                    )
        for name, (doc, value) in figures.items():
            yield GaugeMetricFamily(f"urlguard_filter_{name}", doc, value=float(value))


class FeedCollector:
    """The subscribed feeds' last refresh, from their Source rows when scraped (one
    query; the rows are shared by every node, so any node reports the same)."""

    FIELDS = (
        "name",
        "enabled",
        "last_status",
        "last_refresh_at",
        "last_success_at",
        "failures",
        "last_entries",
        "last_duration",
        "held_at",
    )

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            feeds = list(Source.objects.filter(kind=Source.Kind.FEED).values(*self.FIELDS))
        except Exception:
            logger.warning("metrics: the feeds could not be read", exc_info=True)
            return

        def family(name: str, doc: str, labels: tuple[str, ...] = ("feed",)) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"urlguard_feed_{name}", doc, labels=list(labels))

        success = family("last_success_timestamp_seconds", "End of the feed's last good refresh")
        refresh = family("last_refresh_timestamp_seconds", "End of the feed's last refresh")
        failures = family("failures", "Refreshes of the feed failed in a row")
        entries = family("entries", "Entries the feed listed at its last refresh")
        duration = family("last_refresh_seconds", "How long the feed's last refresh took")
        status = family(
            "status", "1 for the outcome of the feed's last refresh", ("feed", "status")
        )
        held = family("held", "1 while a suspiciously shrunken refresh waits to be accepted")
        enabled = family("enabled", "1 if the feed is refreshed")
        for feed in feeds:
            name = [feed["name"]]
            for metric, value in (
                (success, feed["last_success_at"]),
                (refresh, feed["last_refresh_at"]),
            ):
                if value is not None:
                    metric.add_metric(name, value.timestamp())
            failures.add_metric(name, feed["failures"])
            if feed["last_entries"] is not None:
                entries.add_metric(name, feed["last_entries"])
            if feed["last_duration"] is not None:
                duration.add_metric(name, feed["last_duration"])
            status.add_metric([feed["name"], feed["last_status"]], 1)
            held.add_metric(name, float(feed["held_at"] is not None))
            enabled.add_metric(name, float(feed["enabled"]))
        yield from (success, refresh, failures, entries, duration, status, held, enabled)


class StatsLossCollector:
    """Statistics dropped because a buffer was full, per kind and node, from the
    StatsLoss rows when scraped (every node's, like the admin shows them)."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            rows = list(StatsLoss.objects.values_list("kind", "node", "lost"))
        except Exception:
            logger.warning("metrics: the statistics losses could not be read", exc_info=True)
            return
        lost = GaugeMetricFamily(
            "urlguard_stats_lost",
            "Statistics a node dropped because its buffer was full, by kind and node",
            labels=["kind", "node"],
        )
        for kind, node, n in rows:
            lost.add_metric([kind, node], n)
        yield lost


def _allowed(request: HttpRequest) -> bool:
    token = str(conf.METRICS_TOKEN or "")
    if token:
        given = request.headers.get("Authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return True
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(address in network for network in conf.METRICS_ALLOWED_NETWORKS)


def metrics_view(request: HttpRequest, extra: Sequence[Any] = ()) -> HttpResponse:
    """`GET /metrics`: the Prometheus text format, for allowed addresses or the token;
    `extra` collectors add their families (the probes' readiness)."""
    if not metrics.HAVE_PROMETHEUS:  # read now: the tests take it away after the import
        response: HttpResponse = JsonResponse(
            {"error": "metrics need prometheus_client: pip install 'urlguard[metrics]'"},
            status=501,
        )
    elif not _allowed(request):
        response = JsonResponse(
            {"error": "metrics are not served to this address (METRICS_ALLOWED_NETWORKS)"},
            status=403,
        )
    else:
        metrics.prepare()
        metrics.flush()  # this process's own checks, up to now
        registry = CollectorRegistry()
        multiprocess = "PROMETHEUS_MULTIPROC_DIR" in os.environ
        if multiprocess:
            MultiProcessCollector(registry)
        registry.register(FilterCollector())
        for collector in extra:
            registry.register(collector)
        registry.register(FeedCollector())
        registry.register(StatsLossCollector())
        body = generate_latest(registry)
        if not multiprocess:
            body = generate_latest(REGISTRY) + body
        response = HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
    response["Cache-Control"] = "no-store"
    return response


def may_see_internals(request: HttpRequest) -> bool:
    """The request comes from METRICS_ALLOWED_NETWORKS or sends METRICS_TOKEN: it may
    read metrics and /readyz's details (node, paths, counts, database errors)."""
    return _allowed(request)
