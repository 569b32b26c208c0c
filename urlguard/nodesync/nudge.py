"""Telling every node that the change log grew, right after a rule write commits,
without ever holding the request that made it for more than NUDGE_TIMEOUT.

The nudge is only a hint (the work is defined by the log): when it cannot be sent
in time, the edit stands and the periodic catch-up applies it. What happened is
remembered per thread, so the admin can say what is true ("applied within
seconds", or "at the next catch-up, within N s").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from urlguard.celery import APPLY_CHANGES_TASK, current_app, in_process
from urlguard.conf import conf
from urlguard.nodesync import embedded, registry, sync
from urlguard.runtime.process import PerProcess, on_reset

logger = logging.getLogger(__name__)

__all__ = [
    "Outcome",
    "broker_problem",
    "deliver",
    "forget_broker_check",
    "last_outcome",
    "send",
    "sending_to",
    "when_applied",
]

# The longest a request waits for its nudge: to publish it (broker), or to apply it
# in-process (embedded default, where it waits at most this for the writer lock).
NUDGE_TIMEOUT = 1.0
# Per socket operation of the publish, so a hung broker frees the sending thread.
SOCKET_TIMEOUT = 0.5
FRESH_SECONDS = 10.0


@dataclass(frozen=True)
class Outcome:
    """What became of the nudge for change `seq`."""

    seq: int
    delivered: bool
    detail: str = ""  # why not, when not
    at: float = field(default_factory=time.monotonic)
    #: Sent through the broker (not applied in-process): then every node's catch-up
    #: (a beat broadcast) waits for the broker too.
    via_broker: bool = False


_last = threading.local()


@on_reset
def _forget_outcomes() -> None:
    global _last
    _last = threading.local()


def last_outcome() -> Outcome | None:
    """The outcome of the last nudge sent by this thread (None: none yet)."""
    return getattr(_last, "outcome", None)


def when_applied() -> str:
    """For a message after an edit: when the nodes apply it, as far as this thread
    knows from the nudge it just sent (at its commit, moments ago: an outcome older
    than FRESH_SECONDS belongs to an earlier request and says nothing)."""
    outcome = last_outcome()
    if outcome is None or outcome.delivered or time.monotonic() - outcome.at > FRESH_SECONDS:
        return "Nodes apply it within seconds"
    if outcome.via_broker:
        return (
            f"It is saved, but the broker did not take the nudge ({outcome.detail}): the "
            "nodes apply it when the broker answers again; `manage.py sync_filter` on "
            "each node applies it now"
        )
    return (
        "It is saved, but the nodes could not be told at once "
        f"({outcome.detail}): they apply it at their next catch-up, within "
        f"{conf.CATCHUP_INTERVAL:g} s"
    )


def send(seq: int) -> None:
    """Ask every node to apply the log up to `seq`. Runs after the commit; a failure
    is logged, never raised: the edit is committed and the periodic catch-up applies it."""
    _delivery.get()(seq)


def deliver(seq: int) -> None:
    """What send() does unless a stand-in took its place (see sending_to)."""
    via_broker = not in_process()
    try:
        if via_broker:
            _publish(seq)
        else:
            _apply_here(seq)
    except Exception as exc:  # broker down or hung, or (in-process) the apply failed
        _last.outcome = Outcome(seq, False, f"{type(exc).__name__}: {exc}", via_broker=via_broker)
        logger.warning(
            "change #%s is committed but the apply_changes nudge failed (%s: %s); %s",
            seq,
            type(exc).__name__,
            exc,
            "the nodes apply it when the broker answers again (`manage.py sync_filter` "
            "on each node applies it now)"
            if via_broker
            else "the catch-up thread (or `manage.py sync_filter`) applies it",
        )
    else:
        _last.outcome = Outcome(seq, True, via_broker=via_broker)


_delivery: PerProcess[Callable[[int], None]] = PerProcess(lambda: deliver, name="nudge delivery")


def sending_to(func: Callable[[int], None]) -> AbstractContextManager[None]:
    """`with sending_to(sent.append):` every nudge of the block goes to `func` instead
    (tests: nudges captured, lost, or delivered and then something else)."""
    return _delivery.use(func)


def _apply_here(seq: int) -> None:
    """The embedded default: this process applies the change itself. If another one
    holds the file (a rebuild), the catch-up thread takes over and applies it as
    soon as the lock is free; the request does not wait for that."""
    try:
        sync.sync_and_report(seq, lock_timeout=NUDGE_TIMEOUT)
    except registry.WriterBusy:
        embedded.wake()
        raise


class NudgeTimeout(TimeoutError):
    """The broker took the connection but did not answer in time."""


def _publish(seq: int) -> None:
    """Publish on a connection of its own with short timeouts, from a helper thread
    the request waits for at most NUDGE_TIMEOUT (a broker that accepts connections
    but never answers must not hold an admin edit for the worker timeout)."""
    failure: list[BaseException] = []
    done = threading.Event()
    celery_app = current_app()

    def publish() -> None:
        try:
            with celery_app.connection_for_write(
                connect_timeout=SOCKET_TIMEOUT, transport_options=_transport_options()
            ) as connection:
                celery_app.tasks[APPLY_CHANGES_TASK].apply_async(
                    kwargs={"up_to_seq": seq}, connection=connection, retry=False
                )
        except BaseException as exc:
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=publish, name=f"urlguard-nudge-{seq}", daemon=True).start()
    if not done.wait(NUDGE_TIMEOUT):
        raise NudgeTimeout(f"the broker did not answer within {NUDGE_TIMEOUT:g} s")
    if failure:
        raise failure[0]


# How long a broker check is reused: a load balancer probes every few seconds.
BROKER_CHECK_SECONDS = 5.0
_broker_check: tuple[float, str] | None = None  # (monotonic time, problem)


@on_reset
def forget_broker_check() -> None:
    """Ask the broker again at the next broker_problem() (tests; a changed broker)."""
    global _broker_check
    _broker_check = None


def broker_problem() -> str:
    """Why this node cannot reach its broker ("" when it can, or has none: in-process
    tasks). One connection attempt bounded like a nudge, reused BROKER_CHECK_SECONDS."""
    global _broker_check
    if in_process():
        return ""
    now = time.monotonic()
    if _broker_check is not None and now - _broker_check[0] < BROKER_CHECK_SECONDS:
        return _broker_check[1]
    failure: list[BaseException] = []
    done = threading.Event()

    celery_app = current_app()

    def connect() -> None:
        try:
            with celery_app.connection_for_read(
                connect_timeout=SOCKET_TIMEOUT, transport_options=_transport_options()
            ) as connection:
                connection.ensure_connection(max_retries=1)
                channel = connection.default_channel
                client = getattr(channel, "client", None)
                if client is not None and hasattr(client, "ping"):
                    client.ping()  # redis: a hung server takes connections, never answers
        except BaseException as exc:
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=connect, name="urlguard-broker-check", daemon=True).start()
    if not done.wait(NUDGE_TIMEOUT):
        problem = f"the broker did not answer within {NUDGE_TIMEOUT:g} s"
    elif failure:
        problem = f"{type(failure[0]).__name__}: {failure[0]}"
    else:
        problem = ""
    _broker_check = (time.monotonic(), problem)
    return problem


def _transport_options() -> dict[str, Any]:
    # Each transport spells its socket timeouts its own way.
    celery_app = current_app()
    url = str(celery_app.conf.broker_write_url or celery_app.conf.broker_url or "")
    if url.startswith(("redis", "rediss", "sentinel")):
        return {
            "socket_timeout": SOCKET_TIMEOUT,
            "socket_connect_timeout": SOCKET_TIMEOUT,
            "max_retries": 0,
        }
    if url.startswith(("amqp", "pyamqp")):
        return {"read_timeout": SOCKET_TIMEOUT, "write_timeout": SOCKET_TIMEOUT}
    return {}
