"""Who runs a long write, and whether they still do: a feed refresh's claim, an admin
job and an unfinished change set each record their owner (host, pid and the pid's
start time, plus the Celery task id on a worker) and a heartbeat that one thread per
process writes while the process owns anything. An owner on this host is gone as
soon as its process is dead; one elsewhere when its heartbeat is older than
HEARTBEAT_TIMEOUT. Work whose owner is gone is taken over (a claim, a change set) or
marked failed to be run again (a job, by recover_orphans).

Heartbeats are written, and their ages judged, on one clock, the database's
(database_now): hosts' own clocks may disagree by an hour, and one ahead would hold
its dead claims for that hour, one behind have its live ones taken over at once."""

from __future__ import annotations

import functools
import logging
import math
import os
import socket
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Q
from django.db.models.functions import Now
from django.db.models.sql import Query
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from urlguard.conf import conf
from urlguard.models import AdminJob, ChangeSet, Source
from urlguard.runtime.process import on_reset

logger = logging.getLogger(__name__)

__all__ = [
    "Owner",
    "beat_while_owned",
    "database_now",
    "gone_reason",
    "me",
    "recover_orphans",
]

# What a job whose runner died says, for the page and the log.
ORPHANED_JOB = "The worker stopped; run it again to finish."


def _start_ticks(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of `pid`, from /proc; None where
    there is no /proc (then a pid alone identifies a process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except FileNotFoundError:
        return ("gone", "") if os.path.isdir("/proc/self") else None
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[0], fields[19]


@functools.cache
def this_host() -> str:
    """The host name, and where Linux tells them, the pid namespace and the boot: two
    containers of one host name (host networking) or one host after a reboot never
    take each other's pids for their own."""
    host = socket.gethostname().replace(":", "_")
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()[:8]
    except OSError:
        return host
    return f"{host}~{namespace}~{boot}"


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    start: str  # the pid's start time: a pid reused by another process is not the owner
    task: str = ""

    def __str__(self) -> str:
        text = f"{self.host}:{self.pid}:{self.start}"
        return f"{text} task {self.task}" if self.task else text

    @classmethod
    def parse(cls, text: str) -> Owner | None:
        ident, _, task = text.partition(" task ")
        host, sep, rest = ident.rpartition(":")
        host, sep2, pid = host.rpartition(":")
        if not (sep and sep2 and pid.isdigit()):
            return None
        return cls(host, int(pid), rest, task)

    def describe(self) -> str:
        where = f"pid {self.pid} on {self.host.partition('~')[0]}"
        return f"{where} (Celery task {self.task})" if self.task else where

    def alive(self) -> bool:
        """False only when certain: this host, and its process is dead (or a zombie,
        or the pid is another process's now)."""
        if self.host != this_host():
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        found = _start_ticks(self.pid)
        if found is None:
            return True
        state, start = found
        return state not in ("gone", "Z", "X") and (not self.start or start == self.start)


def me() -> Owner:
    """This process (and the Celery task it runs, on a worker)."""
    pid = os.getpid()
    found = _start_ticks(pid)
    task = ""
    try:
        from celery import current_task  # Celery is optional: ImportError lands below

        request = getattr(current_task, "request", None)
        if request is not None and request.id and not request.is_eager:
            task = str(request.id)
    except Exception:  # no Celery task context: a command, a web process
        task = ""
    return Owner(this_host(), pid, found[1] if found else "", task)


def database_now(using: str = DEFAULT_DB_ALIAS) -> datetime:
    """The database's clock (Django's Now(): PostgreSQL's statement_timestamp(); on
    SQLite, embedded on one host, that host's clock as SQLite reads it), the one every
    host stamps claims and heartbeats with and judges their ages by."""
    connection = connections[using]
    sql, params = Query(None).get_compiler(connection=connection).compile(Now())
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {sql}", params)
        value = cursor.fetchone()[0]
    if isinstance(value, str):  # SQLite: naive UTC text
        value = parse_datetime(value)
    if value is None:
        raise ValueError(f"the database's clock read as {value!r}")
    return timezone.make_aware(value, UTC) if timezone.is_naive(value) else value


def describe(owner: str) -> str:
    parsed = Owner.parse(owner)
    return parsed.describe() if parsed is not None else (owner or "an unknown process")


def gone_reason(
    owner: str,
    heartbeat: datetime | None,
    since: datetime | None,
    now: datetime | None = None,
) -> str:
    """Why the owner of a claim, job or change set is gone ("" while it may still be
    working): nobody owns it, its process is dead (an owner on this host), or no
    heartbeat for over HEARTBEAT_TIMEOUT (an owner elsewhere), judged at `now` of the
    database's clock (read here if not given)."""
    if not owner:
        return "nobody owns it"
    parsed = Owner.parse(owner)
    if parsed is not None and parsed.host == this_host():
        # Its process tells for certain, where a heartbeat may only be late (a
        # database busy with a long write).
        return "" if parsed.alive() else f"{parsed.describe()} is dead"
    last = heartbeat or since
    timeout = conf.HEARTBEAT_TIMEOUT
    age = math.inf if last is None else ((now or database_now()) - last).total_seconds()
    if age > timeout:
        return (
            f"no heartbeat from {describe(owner)} for {age:.0f} s (HEARTBEAT_TIMEOUT={timeout:g})"
        )
    return ""


# -- the heartbeat ------------------------------------------------------------------


class _Heart:
    """One daemon thread per process, beating while the process owns anything: it
    writes now() into the heartbeat of every claim, job and change set whose owner is
    this process, and stops after a beat that found nothing (unless work was taken
    since)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.kicked = False
        self.stop = threading.Event()

    def kick(self) -> None:
        with self.lock:
            self.kicked = True
            if self.thread is None or not self.thread.is_alive():
                self.stop.clear()
                self.thread = threading.Thread(
                    target=self._loop, name="urlguard-heartbeat", daemon=True
                )
                self.thread.start()

    def _loop(self) -> None:
        process = str(me()).partition(" task ")[0]
        failures = 0
        while not self.stop.wait(conf.HEARTBEAT_INTERVAL):
            try:
                beaten = beat(process)
                failures = 0
            except Exception as exc:
                if not failures:
                    logger.warning("heartbeat of %s could not be written: %s", process, exc)
                failures += 1
                # A busy database is no end of the work: beat again, a few times.
                beaten = int(failures < _TRIES)
            finally:
                connections.close_all()
            with self.lock:
                if not beaten and not self.kicked:
                    self.thread = None
                    return
                self.kicked = False

    def halt(self, timeout: float = 5.0) -> None:
        """Stop beating now, even while something is owned (tests: a long write a test
        started must not beat, or log, during a later test)."""
        with self.lock:
            thread, self.thread = self.thread, None
        if thread is not None:
            self.stop.set()
            thread.join(timeout)


# Failed beats in a row after which the thread stops until work is taken again.
_TRIES = 3


ACTIVE_JOB_STATES = ("running", "previewing")


def _owned_by(field: str, process: str) -> Q:
    """Rows whose owner is `process` (host:pid:start), whichever of its tasks."""
    return Q(**{field: process}) | Q(**{f"{field}__startswith": f"{process} task "})


def beat(process: str) -> int:
    """Write the heartbeat of everything `process` owns; returns how many rows."""
    now = database_now()
    return (
        Source.objects.filter(
            _owned_by("refresh_owner", process), refreshing_since__isnull=False
        ).update(refresh_heartbeat=now)
        + AdminJob.objects.filter(_owned_by("owner", process), state__in=ACTIVE_JOB_STATES).update(
            heartbeat=now
        )
        + ChangeSet.objects.filter(_owned_by("owner", process), finished__isnull=True).update(
            heartbeat=now
        )
    )


_heart = _Heart()
on_reset(_heart.halt)


def beat_while_owned() -> None:
    """Call after taking ownership of something: this process's heartbeat runs until
    it owns nothing."""
    _heart.kick()


# -- orphans ------------------------------------------------------------------------


def recover_orphans() -> dict[str, int]:
    """Mark every running admin job whose owner is gone failed (run it again to
    finish), release every feed claim whose owner is gone, and let go of every
    unfinished change set whose writer is gone (it is partial: the work run again
    finishes it). Cheap: it reads only rows that are running."""
    now = database_now()
    stale = now - timedelta(seconds=conf.HEARTBEAT_TIMEOUT)
    jobs = claims = sets = 0
    for job in AdminJob.objects.filter(state__in=ACTIVE_JOB_STATES).only(
        "pk", "kind", "state", "owner", "heartbeat", "started", "created", "message"
    ):
        reason = gone_reason(job.owner, job.heartbeat, job.started, now)
        if not job.owner and (job.started or job.created) > stale:
            reason = ""  # started before jobs named their runner: given the heartbeat's time
        if not reason:
            continue
        # Only if nothing changed since it was read (its owner may just have beaten).
        jobs += AdminJob.objects.filter(
            pk=job.pk, state=job.state, owner=job.owner, heartbeat=job.heartbeat
        ).update(state="failed", finished=now, message=ORPHANED_JOB)
        logger.warning("admin job %s (%s) marked failed: %s", job.pk, job.kind, reason)
    # A claim of no recorded owner (made before claims named one) waits out
    # FEED_CLAIM_TIMEOUT, as urlguard.feeds.refresh does.
    unowned_stale = now - timedelta(seconds=conf.FEED_CLAIM_TIMEOUT)
    for source in Source.objects.filter(refreshing_since__isnull=False).only(
        "pk", "name", "refreshing_since", "refresh_owner", "refresh_heartbeat"
    ):
        reason = gone_reason(
            source.refresh_owner, source.refresh_heartbeat, source.refreshing_since, now
        )
        since = source.refreshing_since
        if not source.refresh_owner and since is not None and since > unowned_stale:
            reason = ""
        if not reason:
            continue
        claims += Source.objects.filter(
            pk=source.pk,
            refreshing_since=source.refreshing_since,
            refresh_owner=source.refresh_owner,
        ).update(refreshing_since=None, refresh_owner="", refresh_heartbeat=None)
        logger.warning(
            "feed %s: the refresh claimed at %s stopped (%s); released, the next refresh "
            "finishes it",
            source.name,
            source.refreshing_since,
            reason,
        )
    for cs in (
        ChangeSet.objects.filter(finished__isnull=True)
        .exclude(owner="")
        .only("pk", "kind", "owner", "heartbeat", "created")
    ):
        reason = gone_reason(cs.owner, cs.heartbeat, cs.created, now)
        if reason:
            sets += ChangeSet.objects.filter(
                pk=cs.pk, owner=cs.owner, heartbeat=cs.heartbeat
            ).update(owner="")
            logger.warning("%s was interrupted (%s): partial until it is run again", cs, reason)
    return {"jobs": jobs, "claims": claims, "change_sets": sets}
