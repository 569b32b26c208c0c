"""The filter dashboard: this node's filter file (stages as an SVG chart, estimated
false-positive rate, size), every node's applied_seq against the change log head,
the last rebuild, and the "Sync now" / "Rebuild" buttons that run the Celery tasks."""

from __future__ import annotations

import logging
import time

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.urls import reverse

from urlguard.admin.charts import StageBar, format_rate, render_daily_hits, render_stage_chart
from urlguard.admin.pages import http_methods, render_tool
from urlguard.admin.sources import feed_health_rows
from urlguard.celery import EagerResult
from urlguard.conf import conf
from urlguard.hotpath import hitlog
from urlguard.models import NodeStatus, SpamRule
from urlguard.nodesync import registry, sync, tasks

# The key of the estimated false-positive rate in ScalingCountingBloomFilter.info().
FP_KEY = "estimated_fpr"

logger = logging.getLogger(__name__)


def stage_bars(info: dict) -> list[StageBar]:
    """The engine's info()["stages"] as chart and table rows."""
    return [
        StageBar(
            index=int(stage["index"]),
            first_id=stage["first_id"],
            last_id=stage["last_id"],
            count=int(stage["count"]),
            capacity=int(stage["capacity"]),
            k=int(stage["k"]),
            fill=float(stage["fill"]),
            estimated_fpr=float(stage.get("estimated_fpr", 0.0)),
            saturated=int(stage.get("saturated", 0)),
            error_rate=(
                float(stage["error_rate"]) if stage.get("error_rate") is not None else None
            ),
        )
        for stage in info.get("stages", [])
    ]


def filter_state() -> dict:
    """What this node's own filter file says, or why it cannot say anything."""
    filt = registry.get_filter()
    if filt is None:
        return {
            "error": f"The filter file {conf.FILTER_PATH} is {registry.problem() or 'unreadable'} "
            "on this node; checks follow ON_FILTER_ERROR. Rebuild it (button below, or "
            "`manage.py rebuild_filter`)."
        }
    try:
        info = filt.info()
        return {
            "error": "",
            "info": info,
            "bars": stage_bars(info),
            "applied_seq": filt.applied_seq,
            "is_clean": filt.is_clean,
            "path": str(filt.path),
        }
    except Exception as exc:  # a damaged file must show up here, not as a 500
        logger.exception("filter dashboard could not read %s", conf.FILTER_PATH)
        return {"error": f"Reading {conf.FILTER_PATH} failed: {type(exc).__name__}: {exc}"}


def node_rows(head: int) -> list[dict]:
    return [
        {"node": n, "lag": max(head - n.applied_seq, 0)}
        for n in NodeStatus.objects.order_by("node")
    ]


def can_sync(model_admin, request: HttpRequest) -> bool:
    """Sync applies the change log to the filter: for whoever may change the rule list
    (add, change or delete rules) or rebuild the filter; viewing alone is not enough."""
    return (
        model_admin.has_add_permission(request)
        or model_admin.has_change_permission(request)
        or model_admin.has_delete_permission(request)
        or request.user.has_perm("urlguard.rebuild_filter")
    )


def _require_view(model_admin, request: HttpRequest) -> None:
    # The page shows counts, not rules, but it is part of managing rules: staff who
    # may not even see the rule list (e.g. short-link editors) do not get it.
    if not model_admin.has_view_permission(request):
        raise PermissionDenied


@http_methods("GET")
def dashboard_view(model_admin, request: HttpRequest) -> HttpResponse:
    _require_view(model_admin, request)
    head = sync.log_head()
    state = filter_state()
    chart = render_stage_chart(state["bars"]) if not state["error"] else None
    fp_percent = ""
    if not state["error"]:
        fp_percent = format_rate(float(state["info"].get(FP_KEY, 0.0)))
    return render_tool(
        model_admin,
        request,
        "admin/urlguard/spamrule/dashboard.html",
        title="Filter dashboard",
        state=state,
        chart=chart,
        head=head,
        fp_percent=fp_percent,
        table_count=SpamRule.objects.count(),
        lag=max(head - state.get("applied_seq", head), 0),
        nodes=node_rows(head),
        this_node=conf.NODE_NAME,
        can_rebuild=request.user.has_perm("urlguard.rebuild_filter"),
        can_sync=can_sync(model_admin, request),
        status_url=reverse("admin:urlguard_spamrule_dashboard_status"),
        feeds=feed_health_rows(),
        top_rules=hitlog.top_rules(),
        top_hosts=hitlog.top_hosts(),
        hits_chart=render_daily_hits(hitlog.daily_hits()),
    )


@http_methods("GET")
def status_view(model_admin, request: HttpRequest) -> HttpResponse:
    """Polled by the dashboard after "Sync now" / "Rebuild" with a broker: each
    node's lag shrinks to 0 and a rebuild's time appears when its worker reports."""
    _require_view(model_admin, request)
    head = sync.log_head()
    return JsonResponse(
        {
            "head": head,
            "nodes": [
                {
                    "node": r["node"].node,
                    "applied_seq": r["node"].applied_seq,
                    "lag": r["lag"],
                    "is_clean": r["node"].is_clean,
                    "last_rebuild_at": (
                        r["node"].last_rebuild_at.isoformat() if r["node"].last_rebuild_at else None
                    ),
                    "last_rebuild_seconds": r["node"].last_rebuild_seconds,
                    "last_rebuild_reason": r["node"].last_rebuild_reason,
                    "last_verify_at": (
                        r["node"].last_verify_at.isoformat() if r["node"].last_verify_at else None
                    ),
                    "last_verify_missing": r["node"].last_verify_missing,
                    "last_error": r["node"].last_error,
                }
                for r in node_rows(head)
            ],
        }
    )


def _describe(result) -> str:
    """sync.SyncResult.as_dict() in words."""
    if not isinstance(result, dict):
        return ""
    if result.get("rebuilt"):
        seconds = result.get("rebuild_seconds")
        took = f" in {seconds:.2f} s" if seconds is not None else ""
        return (
            f"rebuilt with {result.get('rules')} rules{took}, "
            f"now at change #{result.get('applied_seq')}"
        )
    return (
        f"applied {result.get('applied', 0)} change(s), now at change "
        f"#{result.get('applied_seq')} of #{result.get('head')}"
    )


def _run(request: HttpRequest, task, label: str, **kwargs) -> None:
    """Send `task` to every node. Without a broker it runs here and now, so its
    outcome is known; with one, the page polls NodeStatus for the result."""
    started = time.perf_counter()
    try:
        outcome = task.delay(**kwargs)
    except Exception as exc:
        logger.exception("%s from the dashboard failed", label)
        messages.error(
            request,
            f"{label} failed: {type(exc).__name__}: {exc}. The log has the "
            "details; `manage.py sync_filter` / `rebuild_filter` do the same "
            "from a shell.",
        )
        return
    # No result backend is configured (the nodes report through NodeStatus), so a
    # queued task's state cannot be asked; only an eager one has its result here.
    if isinstance(outcome, EagerResult):
        elapsed = time.perf_counter() - started
        detail = _describe(outcome.result)
        messages.success(
            request, f"{label} finished in {elapsed:.2f} s{': ' + detail if detail else ''}."
        )
    else:
        messages.info(
            request, f"{label} sent to every node; the table below updates as each node reports."
        )


@http_methods("POST")
def sync_view(model_admin, request: HttpRequest) -> HttpResponse:
    if not can_sync(model_admin, request):
        raise PermissionDenied
    _run(request, tasks.catch_up, "Sync")
    return HttpResponseRedirect(reverse("admin:urlguard_spamrule_dashboard") + "?watch=1")


@http_methods("POST")
def rebuild_view(model_admin, request: HttpRequest) -> HttpResponse:
    if not request.user.has_perm("urlguard.rebuild_filter"):
        raise PermissionDenied
    _run(
        request,
        tasks.rebuild_filter,
        "Rebuild",
        reason=f"from the admin dashboard by {request.user.get_username()}",
    )
    return HttpResponseRedirect(reverse("admin:urlguard_spamrule_dashboard") + "?watch=1")
