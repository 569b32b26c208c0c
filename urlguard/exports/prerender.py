"""Renders the exports ahead of their pollers. When a node applies changes (the
worker's apply task and boot-time catch-up; in the embedded default the nudge its
request applied, and the upkeep thread's catch-up), each export named in
EXPORTS_PRERENDER is rendered at the new change-log position into the per-position
cache, in a background thread of that process: the first poller after a change is
served a file, never a render of a million rules.

One thread per process (a runtime.process Daemon), started on the first request for
it. Requests coalesce: a
burst of changes is one round of renders at the newest position (and one more if the
log moved during it). A round renders under each export's render lock, so two
processes of a node never render the same position twice. A process killed midway
leaves a temp file only (renders are written aside and renamed into place), which a
later prune removes; the position is rendered by the next round, or served by the
newest render kept until then (see render.rendered)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from django.db import connections

from urlguard.conf import conf
from urlguard.exports.catalog import get_export
from urlguard.exports.projection import current_position
from urlguard.exports.render import RenderBusy, Rendered, rendered
from urlguard.runtime.outage import OutageLog
from urlguard.runtime.process import Daemon, PerProcess

logger = logging.getLogger(__name__)

__all__ = ["AFTER_RENDERS", "PrerenderFailed", "after_changes", "render_all", "request", "wait"]

#: Other projections kept per position, prepared by each round after the exports
#: (the Safe Browsing lists); registered by the app's ready().
AFTER_RENDERS: list[Callable[[], object]] = []


class _Rounds:
    """Requests made in this process and how many of them a finished round covered."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.asked = 0
        self.done = 0


# Remade after fork (a condition held by a parent's thread is no use to a child) and by
# reset_all, like every per-process value.
_rounds = PerProcess(_Rounds, name="urlguard.exports.prerender", remake_after_fork=True)


def request() -> None:
    """Have this process render the exports at the newest position soon; returns at once."""
    rounds = _rounds.get()
    with rounds.cond:
        rounds.asked += 1
        rounds.cond.notify_all()
    _renderer.wake()
    _renderer.start()


def after_changes() -> None:
    """urlguard.nodesync.sync's hook (registered by the app's ready()): this node
    applied changes."""
    request()


def wait(timeout: float) -> bool:
    """Wait until a round has run after every request made so far (a benchmark, a
    test, a graceful stop); False if `timeout` seconds pass first."""
    rounds = _rounds.get()
    with rounds.cond:
        return rounds.cond.wait_for(lambda: rounds.done >= rounds.asked, timeout)


def _loop(stopped: threading.Event) -> None:
    while not stopped.is_set():
        rounds = _rounds.get()
        with rounds.cond:
            covers = rounds.asked
        if covers <= rounds.done:
            # Woken by request(); the bound keeps a stopped thread from lingering.
            _renderer.wait(5.0)
            continue
        try:
            render_all()
        except Exception as exc:
            # The database away, a full disk: pollers are served the newest render
            # kept meanwhile (their headers say how far behind), and the next change
            # or catch-up asks again.
            _outage.get().failed(exc)
        else:
            _outage.get().recovered()
        finally:
            # A thread's connections are its own; never leave one open between rounds.
            connections.close_all()
            with rounds.cond:
                rounds.done = max(rounds.done, covers)
                rounds.cond.notify_all()


_renderer = Daemon("urlguard-prerender", _loop)
# Every round of an outage fails alike: logged once, then counted.
_outage = PerProcess(
    lambda: OutageLog(logger, "pre-rendering the exports"),
    name="urlguard.exports.prerender outage",
    remake_after_fork=True,
)


class PrerenderFailed(Exception):
    """Exports of a round failed to render (the others were rendered)."""


def render_all() -> list[Rendered]:
    """Render each export of EXPORTS_PRERENDER at the current position, unless it is
    rendered already: one round of the thread."""
    done = []
    failed: list[tuple[str, Exception]] = []
    for name in conf.EXPORTS_PRERENDER:
        export = get_export(name)
        if export is None:
            continue
        try:
            done.append(rendered(export, current_position()))
        except RenderBusy as exc:
            logger.warning("pre-rendering %s: %s; the next change retries", name, exc)
        except Exception as exc:
            # One export's failure (the biggest meets a full disk first) is no reason
            # to leave the others behind.
            failed.append((name, exc))
    for job in AFTER_RENDERS:
        try:
            job()
        except RenderBusy as exc:
            logger.warning("preparing %s: %s; the next change retries", job.__qualname__, exc)
        except Exception as exc:
            failed.append((job.__qualname__, exc))
    if failed:
        raise PrerenderFailed(
            "; ".join(f"{name}: {type(exc).__name__}: {exc}" for name, exc in failed)
        ) from failed[0][1]
    return done
