"""gunicorn server hooks for urlguard's Prometheus metrics (multiprocess mode):

    gunicorn -c python:urlguard_service.gunicornconf urlguard_service.wsgi -w 4

- `on_starting` (the master, before any worker): removes the metric files of
  processes that no longer run, so a restarted server does not add a dead worker's
  counts to a new one that happens to get its pid, and the directory does not grow
  with every restart. Files of live processes (a Celery worker on this node writes
  its rebuild and change counts to the same directory) are kept.
- `child_exit` (the master, after a worker exited): marks it dead for the live*
  gauge modes (prometheus_client's mark_process_dead).
- `post_request` (a worker, after each response): counts it by status class
  (`urlguard_http_responses_total{code}`), including the ones Django never saw.
- `worker_exit` (a worker, as it exits): writes its buffered statistics (clicks, rule
  hits) before the process ends (urlguard.runtime.stats).
- `logger_class`: the access log never holds a credential (an API key as basic auth's
  user name, a bearer token, a `key` query parameter: urlguard_service.accesslog).

Another config file can take these over: `from urlguard_service.gunicornconf import
on_starting, child_exit, post_request, worker_exit, logger_class`.
"""

from __future__ import annotations

import glob
import os
import re
import sys
from typing import Any

__all__ = [
    "child_exit",
    "clear_dead_processes",
    "logger_class",
    "on_starting",
    "post_request",
    "worker_exit",
]

_PID = re.compile(r"_(\d+)\.db$")

logger_class = "urlguard_service.accesslog.RedactingLogger"


def _metrics_dir() -> str:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "urlguard_service.settings")
    # Settings only, no app registry: the master must not open database connections
    # its workers would inherit.
    from urlguard.runtime.metrics import multiprocess_dir

    return multiprocess_dir()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def clear_dead_processes(directory: str) -> list[str]:
    """Remove the metric files in `directory` whose process is gone; returns them."""
    removed = []
    for path in glob.glob(os.path.join(directory, "*.db")):
        match = _PID.search(path)
        if match is None or _alive(int(match.group(1))):
            continue
        try:
            os.remove(path)
        except FileNotFoundError:
            continue
        removed.append(path)
    return removed


def on_starting(server: Any) -> None:
    directory = _metrics_dir()
    removed = clear_dead_processes(directory)
    server.log.info(
        "urlguard metrics in %s (%d file(s) of dead processes removed)", directory, len(removed)
    )


def child_exit(server: Any, worker: Any) -> None:
    from prometheus_client import multiprocess  # the `metrics` extra: only where it runs

    multiprocess.mark_process_dead(worker.pid, _metrics_dir())


def post_request(worker: Any, req: Any, environ: Any, resp: Any) -> None:
    status = getattr(resp, "status_code", None)
    if isinstance(status, int):
        from urlguard.runtime import metrics  # Django is set up by now, not at load

        metrics.responded(status)


def worker_exit(server: Any, worker: Any) -> None:
    # gunicorn also calls it in the master, for a worker it found already gone.
    if worker.pid != os.getpid():
        return
    stats = sys.modules.get("urlguard.runtime.stats")
    if stats is None:  # a worker that never loaded the app has nothing buffered
        return
    pending = {name: n for name, n in stats.pending().items() if n}
    stats.gunicorn_worker_exit(server, worker)
    server.log.info(
        "urlguard: worker %s exiting: its buffered statistics flushed (%s)",
        worker.pid,
        ", ".join(f"{name} {n}" for name, n in sorted(pending.items())) or "none",
    )
