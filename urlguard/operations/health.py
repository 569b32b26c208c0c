"""Probes for load balancers and orchestrators: `GET /healthz` (the process answers;
nothing else is touched) and `GET /readyz` (this node gives correct, current answers:
its filter file is mapped and readable, it is not too far behind the change log, and
the database answers). Lag while the shared broker is unreachable is reported (a
"broker" check) but does not fail readiness: every node lags alike then, and a load
balancer that drained them all would turn a broker fault into an outage.

ProbeMiddleware answers both before host validation, sessions, CSRF and the redirect
guard: a prober sends whatever Host header it likes (a pod's IP address), must not
pay for the rest of the stack, and must never be redirected or cached. A failing
readiness is logged when it changes, not on every probe (the prober asks every few
seconds); the same views are in the URLconf for a stack without the middleware.
Outside METRICS_ALLOWED_NETWORKS (and without METRICS_TOKEN) /readyz says only
`ready` and `failed`: the node's name, its file's path, counts and a database error
naming host and port are for the operator, not for anyone who can reach the port.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.utils import timezone

from urlguard.conf import conf
from urlguard.models import ChangeEvent
from urlguard.nodesync import nudge, registry
from urlguard.operations import metricsview
from urlguard.runtime.process import on_reset

if TYPE_CHECKING:
    from prometheus_client.core import GaugeMetricFamily

logger = logging.getLogger(__name__)

__all__ = [
    "DEGRADING_CHECKS",
    "ProbeMiddleware",
    "ReadyCollector",
    "healthz",
    "metrics_view",
    "readiness",
    "readyz",
]

# The previous readiness of this process (None: not asked yet) and what was degraded,
# so that only a change is logged.
_was_ready: bool | None = None
_was_degraded: list[str] = []

#: Conditions that make this node degraded, not unready: /readyz still answers 200
#: (the redirect guard answers right; a load balancer draining every node for them
#: would turn one fault into an outage) but names them under "degraded", and
#: urlguard_ready_check says which. Registered by the app's ready() (the exports'
#: lag: urlguard.exports, above this package, cannot be imported here).
DEGRADING_CHECKS: dict[str, Callable[[], dict[str, Any]]] = {}


@on_reset
def _forget_readiness() -> None:
    global _was_ready, _was_degraded
    _was_ready = None
    _was_degraded = []


def _json(data: dict[str, Any], status: int = 200) -> JsonResponse:
    response = JsonResponse(data, status=status)
    response["Cache-Control"] = "no-store"
    return response


def _refuse_method(request: HttpRequest) -> JsonResponse | None:
    if request.method in ("GET", "HEAD"):
        return None
    response = _json({"error": f"method {request.method} not allowed; use GET"}, 405)
    response["Allow"] = "GET, HEAD"
    return response


def healthz(request: HttpRequest) -> JsonResponse:
    """200 while the process can answer a request at all: no database, no filter."""
    return _refuse_method(request) or _json({"status": "alive"})


def _filter_check(path: str) -> tuple[dict[str, Any], int | None]:
    filt = registry.get_filter(path)
    if filt is None:
        return {"ok": False, "error": f"filter file {path} is {registry.problem(path)}"}, None
    try:
        applied = int(filt.applied_seq)
        rules = int(filt.count)
    except Exception as exc:  # a mapping that fails now is remapped on the next check
        registry.forget(path)
        return {"ok": False, "error": f"filter file {path} is unreadable: {exc}"}, None
    return {"ok": True, "path": path, "applied_seq": applied, "rules": rules}, applied


def _lag_check(applied: int, head: int) -> dict[str, Any]:
    max_changes = conf.READY_MAX_LAG_CHANGES
    max_seconds = conf.READY_MAX_LAG_SECONDS
    check: dict[str, Any] = {"max_changes": max_changes, "max_seconds": max_seconds}
    if applied > head:
        return {
            **check,
            "ok": False,
            "error": f"the filter has applied change #{applied} but the change log ends at "
            f"#{head} (a file from another database?)",
        }
    changes = head - applied
    seconds = 0.0
    if changes:
        oldest = (
            ChangeEvent.objects.filter(seq__gt=applied)
            .order_by("seq")
            .values_list("created", flat=True)
            .first()
        )
        if oldest is not None:
            seconds = max(0.0, (timezone.now() - oldest).total_seconds())
    ok = changes <= max_changes and seconds <= max_seconds
    check.update(ok=ok, changes=changes, seconds=round(seconds, 3))
    if not ok:
        check["error"] = (
            f"{changes} change(s) behind the change log, the oldest {seconds:.0f} s old "
            f"(at most {max_changes} changes and {max_seconds:g} s allowed)"
        )
    return check


def readiness() -> dict[str, Any]:
    """What /readyz answers: {"ready", "node", "failed": [names], "checks": {name: {...}}}."""
    checks: dict[str, dict[str, Any]] = {}
    checks["filter"], applied = _filter_check(conf.FILTER_PATH)
    head: int | None = None
    try:
        head = ChangeEvent.objects.head()
    except Exception as exc:
        checks["database"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    else:
        checks["database"] = {"ok": True, "log_head": head}
    if applied is None or head is None:
        checks["lag"] = {"ok": False, "error": "unknown without the filter and the database"}
    else:
        try:
            checks["lag"] = _lag_check(applied, head)
        except Exception as exc:
            checks["database"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            checks["lag"] = {"ok": False, "error": "unknown without the database"}
    if not checks["lag"]["ok"] and "changes" in checks["lag"]:
        _excuse_a_broker_outage(checks)
    failed = [name for name, check in checks.items() if not check["ok"] and name != "broker"]
    degraded = []
    for name, degrading in DEGRADING_CHECKS.items():
        try:
            checks[name] = degrading()
        except Exception as exc:
            checks[name] = {"ok": False, "error": f"unknown: {type(exc).__name__}: {exc}"}
        if not checks[name]["ok"]:
            degraded.append(name)
    return {
        "ready": not failed,
        "node": conf.NODE_NAME,
        "failed": failed,
        "degraded": degraded,
        "checks": checks,
    }


class ReadyCollector:
    """What `GET /readyz` would answer now: alertable where a probe only steers traffic."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        # Only a /metrics answered with prometheus_client installed (the `metrics` extra)
        # collects: a site without it imports this module all the same.
        from prometheus_client.core import GaugeMetricFamily

        answer = readiness()
        yield GaugeMetricFamily(
            "urlguard_ready", "1 if this node's /readyz answers 200", value=float(answer["ready"])
        )
        checks = GaugeMetricFamily(
            "urlguard_ready_check", "1 if this /readyz condition holds", labels=["check"]
        )
        for name, check in answer["checks"].items():
            checks.add_metric([name], float(bool(check["ok"])))
        yield checks


#: Collectors of packages above this one, registered by the app's ready() (the
#: exports' lag and sizes).
EXTRA_COLLECTORS: list[Any] = []


def metrics_view(request: HttpRequest) -> HttpResponse:
    """`GET /metrics` with this node's readiness among the figures."""
    return metricsview.metrics_view(request, extra=[ReadyCollector(), *EXTRA_COLLECTORS])


def _excuse_a_broker_outage(checks: dict[str, dict[str, Any]]) -> None:
    """Lag while the broker cannot be reached is every node's lag at once (nudges and
    the catch-up broadcast both go through it): reported, but not a reason to take
    this node out of a load balancer, which would drain the whole fleet for it."""
    problem = nudge.broker_problem()
    if not problem:
        return
    checks["broker"] = {"ok": False, "error": problem}
    lag = checks["lag"]
    lag["ok"] = True
    lag["warning"] = (
        f"{lag.pop('error')}: the broker shared by every node is unreachable, so every "
        "node lags alike (not a reason to drain this one); `manage.py sync_filter` on "
        "each node applies the changes now"
    )


def readyz(request: HttpRequest) -> JsonResponse:
    """200 when this node is ready to answer checks correctly, else 503 naming why;
    either way naming what is degraded."""
    global _was_ready, _was_degraded
    refused = _refuse_method(request)
    if refused is not None:
        return refused
    state = readiness()
    ready = state["ready"]
    if ready != _was_ready:
        if not ready:
            reasons = "; ".join(f"{n}: {state['checks'][n].get('error')}" for n in state["failed"])
            logger.warning("node %s is not ready: %s", state["node"], reasons)
        elif _was_ready is not None:
            logger.info("node %s is ready again", state["node"])
        _was_ready = ready
    if state["degraded"] != _was_degraded:
        if state["degraded"]:
            reasons = "; ".join(
                f"{n}: {state['checks'][n].get('error')}" for n in state["degraded"]
            )
            logger.warning("node %s is degraded: %s", state["node"], reasons)
        else:
            logger.info("node %s is no longer degraded", state["node"])
        _was_degraded = state["degraded"]
    shown = (
        state
        if metricsview.may_see_internals(request)
        else {"ready": ready, "failed": state["failed"], "degraded": state["degraded"]}
    )
    response = _json(shown, 200 if ready else 503)
    if not ready:
        response["Retry-After"] = "5"
        # Logged above when it changed; django.request would log every probe.
        response._has_been_logged = True  # type: ignore[attr-defined]
    return response


PROBES: dict[str, Callable[[HttpRequest], HttpResponseBase]] = {
    "/healthz": healthz,
    "/readyz": readyz,
    # A scraper, like a prober, sends the target's address as Host.
    "/metrics": metrics_view,
}


class ProbeMiddleware:
    """Answers /healthz, /readyz and /metrics before the rest of the stack (see the
    module doc)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        probe = PROBES.get(request.path_info)
        if self.async_mode:
            return self.__acall__(request, probe)
        if probe is None:
            return self.get_response(request)
        return probe(request)

    async def __acall__(
        self, request: HttpRequest, probe: Callable[[HttpRequest], HttpResponseBase] | None
    ) -> HttpResponseBase:
        if probe is None:
            return await self.get_response(request)
        return await sync_to_async(probe, thread_sensitive=True)(request)
