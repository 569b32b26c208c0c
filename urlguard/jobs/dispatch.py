"""Where jobs run and what every kind shares: each job's input is stored in
AdminJobChunk rows (about a megabyte of whole lines each: the upload is streamed in, the
job streams it out), its progress is written to the row for the page to poll, and a
failed job records why.

Where the work runs: on a Celery worker when a broker is configured; in the
embedded default, on one runner thread of the serving process (so the request that
starts a job returns at once); inline only where no other thread can see the
database (SQLite in memory: the tests)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from django.db import connections, router, transaction
from django.utils import timezone

from urlguard.models import AdminJob, AdminJobChunk, ChangeSet, database
from urlguard.runtime import ownership
from urlguard.runtime.process import Daemon

logger = logging.getLogger(__name__)


# How often a running job writes its progress (a write per chunk would be noise).
PROGRESS_EVERY_SECONDS = 0.5
# Characters of whole lines per AdminJobChunk row.
CHUNK_CHARS = 1 << 20


# -- where jobs run ------------------------------------------------------------------


class _Runner:
    """One daemon thread per process that runs admin jobs one after another, for the
    embedded default (no broker): the request that starts a job only queues it."""

    def __init__(self) -> None:
        self.queue: queue.Queue[tuple[Callable[[int], object], int]] = queue.Queue()
        self.daemon = Daemon("urlguard-admin-jobs", self._loop)

    def submit(self, func: Callable[[int], object], job_id: int) -> None:
        self.queue.put((func, job_id))
        self.daemon.start()

    def _loop(self, stopped: threading.Event) -> None:
        while not stopped.is_set():
            try:
                # A bounded wait: a stopped runner ends within it.
                func, job_id = self.queue.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                func(job_id)
            except Exception:  # the job records its own failure; this is a last resort
                logger.exception("admin job %s crashed on the runner thread", job_id)
            finally:
                connections.close_all()
                self.queue.task_done()

    def join(self) -> None:
        """Wait until every queued job has run (tests, benchmarks)."""
        self.queue.join()


runner = _Runner()


def _memory_database() -> bool:
    return database.in_memory_sqlite(connections[router.db_for_write(AdminJob)])


def dispatch(task, job_id: int) -> None:
    """Run the Celery task `task` for the job: on a worker (after the commit, so the
    worker finds the row), else on this process's runner thread, else (an in-memory
    test database, invisible to other threads) right here."""
    from urlguard.celery import in_process  # per call: tests patch urlguard.celery's

    if not in_process():
        transaction.on_commit(lambda: task.delay(job_id))
    elif _memory_database():
        task(job_id)
    else:
        transaction.on_commit(lambda: runner.submit(task, job_id))


# -- job input, streamed through AdminJobChunk rows -------------------------------------


def store_chunks(job: AdminJob, texts: Iterable[str]) -> int:
    """Save `texts` (pieces of one text, any sizes) as the job's chunks of whole lines;
    returns the number of lines."""
    buffer: list[str] = []
    size = seq = lines = 0

    def save(text: str) -> None:
        nonlocal seq
        AdminJobChunk.objects.create(job=job, seq=seq, text=text)
        seq += 1

    for text in texts:
        lines += text.count("\n")
        buffer.append(text)
        size += len(text)
        if size >= CHUNK_CHARS:
            joined = "".join(buffer)
            cut = joined.rfind("\n") + 1
            if cut:
                save(joined[:cut])
                joined = joined[cut:]
            buffer, size = ([joined], len(joined)) if joined else ([], 0)
    rest = "".join(buffer)
    if rest:
        save(rest)
        lines += not rest.endswith("\n")
    return lines


def iter_lines(job: AdminJob) -> Iterator[str]:
    """The job's input, line by line, one chunk in memory at a time, each read by a
    query of its own (an open cursor across the job's writes would hold an SQLite read
    snapshot: see urlguard.writepath.revert._events)."""
    seq = -1
    while True:
        chunk = (
            AdminJobChunk.objects.filter(job=job, seq__gt=seq)
            .order_by("seq")
            .values_list("seq", "text")
            .first()
        )
        if chunk is None:
            return
        seq, text = chunk
        yield from text.splitlines()


class Progress:
    """Writes done/total to the job row, at most every PROGRESS_EVERY_SECONDS."""

    def __init__(self, job: AdminJob):
        self.job = job
        self.last = 0.0

    def __call__(self, done: int, total: int, *, force: bool = False, message: str = "") -> None:
        now = time.monotonic()
        if force or now - self.last >= PROGRESS_EVERY_SECONDS:
            self.last = now
            fields: dict[str, int | str] = {"done": done, "total": total}
            if message:
                fields["message"] = message
            AdminJob.objects.filter(pk=self.job.pk).update(**fields)


def begin(job_id: int, kind: str, state: str = AdminJob.State.RUNNING) -> AdminJob | None:
    job = AdminJob.objects.filter(pk=job_id, kind=kind).first()
    if job is None:
        logger.warning("admin job %s (%s) no longer exists; nothing to do", job_id, kind)
        return None
    job.state = state
    # On the database's clock, as every heartbeat: hosts' own clocks may disagree.
    job.started = job.heartbeat = ownership.database_now()
    job.message = ""
    # Its owner's heartbeat tells a job that runs from one whose runner died.
    job.owner = str(ownership.me())
    job.save(update_fields=["state", "started", "message", "owner", "heartbeat"])
    ownership.beat_while_owned()
    return job


def written_before(job: AdminJob) -> ChangeSet | None:
    """The change set a first run of this job left unfinished (it stopped), which the
    job run again finishes."""
    pk = job.params.get("writes")
    return ChangeSet.objects.filter(pk=pk, finished__isnull=True).first() if pk else None


def writes_into(job: AdminJob, change_set: ChangeSet) -> None:
    job.params = {**job.params, "writes": change_set.pk}
    AdminJob.objects.filter(pk=job.pk).update(params=job.params)


def previewed(
    job: AdminJob, total: int, result: dict[str, Any], *, refused: str | None = None
) -> None:
    """The job's summary is ready: it waits, PREVIEWED, for a person to commit it
    (with the refused lines' download, for an import)."""
    job.state = AdminJob.State.PREVIEWED
    job.finished = timezone.now()
    job.done = job.total = total
    job.message = ""
    job.result = result
    fields = ["state", "finished", "done", "total", "message", "result"]
    if refused is not None:
        job.refused = refused
        fields.append("refused")
    job.save(update_fields=fields)


def fail(job: AdminJob, exc: BaseException, message: str) -> None:
    logger.exception("admin job %s failed", job.pk)
    job.state = AdminJob.State.FAILED
    job.finished = timezone.now()
    job.message = f"{message}: {type(exc).__name__}: {exc}"
    job.save(update_fields=["state", "finished", "message", "done", "result"])


def start_commit(job: AdminJob, task: Callable[[int], object], reason: str) -> bool:
    """Queue `task` for a previewed job (once: a second click finds it no longer
    previewed), with the operator's reason."""
    claimed = AdminJob.objects.filter(pk=job.pk, state=AdminJob.State.PREVIEWED).update(
        state=AdminJob.State.QUEUED,
        message="Waiting for a worker.",
        done=0,
        params={**job.params, "phase": "commit", "reason": reason[:1000]},
    )
    if claimed:
        dispatch(task, job.pk)
    return bool(claimed)
