"""Prometheus metrics of this node, served at `GET /metrics` (access-limited) by
urlguard.operations.metricsview.

prometheus_client runs in multiprocess mode: every process (gunicorn workers, the
Celery worker, a management command) writes its counters to its own memory-mapped
files in one directory per node (METRICS_DIR, default <DATA_DIR>/metrics; the
environment's PROMETHEUS_MULTIPROC_DIR wins), and a scrape sums them. Figures of the
filter file itself are read from this node's file when scraped (the view's collectors),
not counted.

gunicorn: `-c python:urlguard_service.gunicornconf` clears the files of dead processes at
start and marks an exited worker dead (see that module).
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import re
import threading
import time
from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

try:
    import prometheus_client  # noqa: F401
except ImportError:  # the `metrics` extra: without it nothing is counted, /metrics says so
    HAVE_PROMETHEUS = False
else:
    HAVE_PROMETHEUS = True

from urlguard.conf import conf
from urlguard.runtime.process import Daemon, PerProcess

logger = logging.getLogger(__name__)

__all__ = [
    "changes_applied",
    "continued",
    "counted_checks",
    "dns_answered",
    "dns_dropped",
    "dns_notified",
    "dns_transfer",
    "multiprocess_dir",
    "prepare",
    "rebuilt",
    "responded",
    "safebrowsing_request",
    "timed_check",
    "warned",
]


def multiprocess_dir() -> str:
    """This node's directory of metric files (created if missing)."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or conf.METRICS_DIR
    os.makedirs(path, exist_ok=True)
    return path


VERDICTS = ("clean", "blocked", "false_positive", "degraded", "invalid")
# Check times from a filter-only answer (~10 µs) to one waiting on the database.
CHECK_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.1, 1.0)


class _Metrics:
    """The metric objects of this process. Made on first use, not at import: a value
    opens its process's file in the directory the environment names at that moment,
    and Django imports this module before a test run (or a deployment) names it."""

    def __init__(self) -> None:
        try:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = multiprocess_dir()
        except OSError as exc:
            logger.error("metrics: no directory for metric files (%s); counting per process", exc)
        # After PROMETHEUS_MULTIPROC_DIR is set (read at import); [metrics] is optional.
        from prometheus_client import Counter, Histogram, values

        # prometheus_client picks its value class from the environment when first
        # imported: pick again in case something imported it before the line above.
        values.ValueClass = values.get_value_class()
        self.checks = Counter(
            "urlguard_checks_total",
            "URLs checked by the guard (redirects, the API, rescans), by verdict",
            ["verdict"],
        )
        # Children resolved once: a labelled lookup per check costs more than the count.
        self.by_verdict = {verdict: self.checks.labels(verdict=verdict) for verdict in VERDICTS}
        self.check_seconds = Histogram(
            "urlguard_check_seconds",
            "Time of one Guard.check: canonicalization, filter probe, a confirming query on a hit",
            buckets=CHECK_BUCKETS,
        )
        self.warnings = Counter(
            "urlguard_warnings_total",
            "Warning pages shown instead of a redirect, by rule category (or why unchecked)",
            ["category"],
        )
        self.continues = Counter(
            "urlguard_continue_total", "Warned redirects followed through 'continue anyway'"
        )
        self.changes_applied = Counter(
            "urlguard_changes_applied_total", "Change-log rows applied to this node's filter file"
        )
        self.stats_written = Counter(
            "urlguard_stats_written_total",
            "Statistics (clicks, ...) written by this node's flushes, by kind",
            ["kind"],
        )
        self.stats_failures = Counter(
            "urlguard_stats_flush_failures_total",
            "Flushes of statistics the database refused (kept and retried), by kind",
            ["kind"],
        )
        self.rebuilds = Counter(
            "urlguard_rebuilds_total",
            "Rebuilds of this node's filter file from the spam table, by reason",
            ["reason"],
        )
        self.responses = Counter(
            "urlguard_http_responses_total",
            "HTTP responses this node's gunicorn workers sent, by status class (2xx, 5xx ...)",
            ["code"],
        )
        self.dns_answers = Counter(
            "urlguard_dns_answers_total",
            "DNS answers of serve_dns, by zone (rpz, uribl, other) and response code",
            ["zone", "rcode"],
        )
        self.dns_dropped = Counter(
            "urlguard_dns_dropped_total",
            "DNS packets serve_dns dropped unanswered: malformed, response, rate_limited, tcp_busy",
            ["reason"],
        )
        self.dns_transfers = Counter(
            "urlguard_dns_transfers_total",
            "RPZ zone transfers served: axfr, ixfr, ixfr_full (too far behind), refused",
            ["kind"],
        )
        self.dns_notifies = Counter(
            "urlguard_dns_notifies_total", "NOTIFY messages sent, by result", ["result"]
        )
        self.safebrowsing = Counter(
            "urlguard_safebrowsing_requests_total",
            "Safe Browsing API requests: update, fullhash, lists; by client id and status",
            ["method", "client", "code"],
        )


class _Uncounted:
    """Every metric where prometheus_client is not installed: counts nothing."""

    _buckets: tuple = ()

    def labels(self, **labels: str) -> _Uncounted:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def __getattr__(self, name: str) -> _Uncounted:
        return self


def _make() -> _Metrics:
    return _Metrics() if HAVE_PROMETHEUS else _Uncounted()  # type: ignore[return-value]


#: This process's metrics: registered once with prometheus_client, so kept through a
#: reset (registering them again would be refused); a forked child keeps them too,
#: since the multiprocess files are named by the pid that writes them.
registered: PerProcess[_Metrics] = PerProcess(_make, name="metrics", resettable=False)


#: How often the checks counted in memory reach the metric files.
FLUSH_SECONDS = 1.0


class CheckTally:
    """The checks of this process, counted in memory and added to the metric files by
    a daemon thread every FLUSH_SECONDS (and at exit). Each increment of a
    multiprocess value takes a lock and writes a memory-mapped file (~2 µs), and a
    check would pay for three: a fifth of a whole Guard.check. In memory it is a
    list increment under a lock; a scrape sees a check within FLUSH_SECONDS, and a
    process killed with SIGKILL loses at most that much."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts = [0] * len(VERDICTS)
        self.buckets = [0] * (len(CHECK_BUCKETS) + 1)  # the last one is +Inf
        self.seconds = 0.0

    def add(self, verdict: int, seconds: float) -> None:
        with self.lock:
            self.counts[verdict] += 1
            # bisect_left: the first bound >= seconds, i.e. Prometheus' "le".
            self.buckets[bisect_left(CHECK_BUCKETS, seconds)] += 1
            self.seconds += seconds
        if _flusher.thread is None:
            _start_flusher()

    def add_untimed(self, verdict: int, n: int) -> None:
        with self.lock:
            self.counts[verdict] += n
        if _flusher.thread is None:
            _start_flusher()

    def flush(self) -> None:
        """Add what was counted since the last flush to the metric files."""
        with self.lock:
            counts, self.counts = self.counts, [0] * len(VERDICTS)
            buckets, self.buckets = self.buckets, [0] * (len(CHECK_BUCKETS) + 1)
            seconds, self.seconds = self.seconds, 0.0
        if not any(counts) or not HAVE_PROMETHEUS:
            return
        m = registered.get()
        for label, n in zip(VERDICTS, counts, strict=True):
            if n:
                m.by_verdict[label].inc(n)
        # Histogram.observe() one by one is what this avoids; these are its own values
        # (prometheus_client pinned; tests/operations/test_metrics.py reads them back).
        for value, n in zip(m.check_seconds._buckets, buckets, strict=True):
            if n:
                value.inc(n)
        m.check_seconds._sum.inc(seconds)


#: The checks of this process. A forked child starts with an empty one: the parent
#: flushes what it counted.
tally: PerProcess[CheckTally] = PerProcess(CheckTally, name="check tally", remake_after_fork=True)


def _flush_loop(stopped: threading.Event) -> None:
    while not stopped.wait(FLUSH_SECONDS):
        try:
            flush()
        except Exception:
            logger.exception("metrics: writing the check counts failed")


_flusher = Daemon("urlguard-metrics", _flush_loop)


def _start_flusher() -> None:
    registered.get()  # this process's metric files exist from its first check on
    _flusher.start()


def prepare() -> None:
    """Make this process's metrics now: from here on the environment names their
    multiprocess directory, which a scrape's collector reads."""
    registered.get()


def flush() -> None:
    """Write the checks counted in memory now (tests; a process about to exit)."""
    counted = tally.value
    if counted is not None:
        counted.flush()


atexit.register(flush)


def verdict_label(verdict: Any) -> str:
    """The `verdict` label of a guard.Verdict."""
    if verdict.error:
        return "invalid"
    if verdict.degraded:
        return "degraded"
    if verdict.blocked:
        return "blocked"
    return "false_positive" if verdict.maybe else "clean"


def _verdict_index(verdict: Any) -> int:
    # verdict_label's order of VERDICTS, without the dict lookup on the hot path.
    if verdict.error:
        return 4
    if verdict.degraded:
        return 3
    if verdict.blocked:
        return 1
    return 2 if verdict.maybe else 0


_Check = TypeVar("_Check", bound=Callable[..., Any])


def timed_check(check: _Check) -> _Check:
    """Decorates Guard.check(url, parsed=None): counts each verdict and its time. A
    ValueError is the guard's InvalidURL (this module cannot import the guard)."""
    clock = time.perf_counter

    @functools.wraps(check)
    def timed(self: Any, url: str, parsed: Any = None) -> Any:
        started = clock()
        try:
            verdict = check(self, url, parsed)
        except ValueError:
            (tally.value or tally.get()).add(4, clock() - started)
            raise
        (tally.value or tally.get()).add(_verdict_index(verdict), clock() - started)
        return verdict

    return cast(_Check, timed)


def counted_checks(
    check_many: Callable[[Any, Sequence[str]], list[Any]],
) -> Callable[[Any, Sequence[str]], list[Any]]:
    """Decorates Guard.check_many: counts its verdicts (its time is no single check's)."""

    @functools.wraps(check_many)
    def counted(self: Any, urls: Sequence[str]) -> list[Any]:
        verdicts = check_many(self, urls)
        for index, n in Tally(map(_verdict_index, verdicts)).items():
            (tally.value or tally.get()).add_untimed(index, n)
        return verdicts

    return counted


def warned(kind: str, verdict: Any = None) -> None:
    """A warning page was shown: `kind` as warning_response takes it."""
    rule = getattr(verdict, "rule", None)
    registered.get().warnings.labels(category=rule.category if rule else kind).inc()


def continued() -> None:
    """A warned redirect was followed ("continue anyway")."""
    registered.get().continues.inc()


def stats_written(kind: str, n: int) -> None:
    """A flush of urlguard.runtime.stats wrote `n` entries of `kind`."""
    registered.get().stats_written.labels(kind=kind).inc(n)


def stats_failed(kind: str) -> None:
    """A flush of urlguard.runtime.stats could not write `kind` (kept for the next one)."""
    registered.get().stats_failures.labels(kind=kind).inc()


def dns_answered(zone: str, rcode: str) -> None:
    registered.get().dns_answers.labels(zone=zone, rcode=rcode).inc()


def dns_dropped(reason: str) -> None:
    registered.get().dns_dropped.labels(reason=reason).inc()


def dns_transfer(kind: str) -> None:
    registered.get().dns_transfers.labels(kind=kind).inc()


def dns_notified(result: str) -> None:
    registered.get().dns_notifies.labels(result=result).inc()


#: Client ids counted by name per process; later ones count as "other" (the id is
#: the client's to choose, and every label value is a series).
SAFEBROWSING_CLIENTS = 20
_clients_seen: set[str] = set()


def safebrowsing_request(method: str, client: str, status: int) -> None:
    """A Safe Browsing request of `method` from `client` (its client id) was answered."""
    if client and client not in _clients_seen:
        if len(_clients_seen) >= SAFEBROWSING_CLIENTS:
            client = "other"
        else:
            _clients_seen.add(client)
    registered.get().safebrowsing.labels(method=method, client=client, code=str(status)).inc()


def changes_applied(n: int) -> None:
    """This process applied `n` change-log rows to the node's filter file."""
    registered.get().changes_applied.inc(n)


# The rebuild reasons of urlguard.nodesync.sync, as a label of few values.
_REBUILD_KINDS = (
    ("verify", re.compile(r"(full verify|spot check) found")),
    ("missing", re.compile(r"is missing")),
    ("dirty", re.compile(r"dirty")),
    ("unreadable", re.compile(r"unreadable")),
    ("settings", re.compile(r"was built with")),
    ("ahead", re.compile(r"applied_seq \d+ but the change log ends")),
    ("disagrees", re.compile(r"disagrees with the log")),
    ("compact", re.compile(r"^compacting")),
    ("requested", re.compile(r"requested|^rebuild ")),
)


def responded(status: int) -> None:
    """A gunicorn worker of this node sent a response with this status."""
    registered.get().responses.labels(code=f"{status // 100}xx").inc()


def rebuild_kind(reason: str) -> str:
    for kind, pattern in _REBUILD_KINDS:
        if pattern.search(reason):
            return kind
    return "other"


def rebuilt(reason: str) -> None:
    """This process rebuilt the node's filter file, for `reason` (sync's words)."""
    registered.get().rebuilds.labels(reason=rebuild_kind(reason)).inc()
