"""Long admin operations as AdminJob rows, never inside one request: an import (a dry
run, then the commit through urlguard.writepath.changes.add_rules), a bulk delete (a summary
with its impact, then the removal through urlguard.writepath.changes.remove_rules) and a
rescan of the short links. Each job's input is stored in AdminJobChunk rows (about
a megabyte of whole lines each: the upload is streamed in, the job streams it out)
and its progress is written to the row for the page to poll.

Where the work runs: on a Celery worker when a broker is configured; in the
embedded default, on one runner thread of the serving process (so the request that
starts a job returns at once); inline only where no other thread can see the
database (SQLite in memory: the tests)."""

from __future__ import annotations

import io
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from django.db import connections, router, transaction
from django.utils import timezone

from urlguard import shortlinks
from urlguard.celery import shared_task
from urlguard.models import Actor, AdminJob, AdminJobChunk, ChangeSet, SpamRule, row_user
from urlguard.runtime import database, ownership
from urlguard.shortlinks.rescan import rescan_links
from urlguard.wording import counted
from urlguard.writepath import changes
from urlguard.writepath.impact import build_link_index, impact_of_adding, impact_of_removing
from urlguard.writepath.importing import parse_rules

logger = logging.getLogger(__name__)

# Rules handed to changes.add_rules per transaction. Each chunk is one transaction
# and one filter update: big enough to amortise both, small enough that progress
# moves every second or so and a failure loses at most one chunk's work.
IMPORT_CHUNK = changes.CHUNK_SIZE
# Refused lines kept for the preview page; the counts cover the whole file (and the
# download holds every refused line).
MAX_REFUSED_SHOWN = 1_000
# How often a running job writes its progress (a write per chunk would be noise).
PROGRESS_EVERY_SECONDS = 0.5
# Characters of whole lines per AdminJobChunk row.
CHUNK_CHARS = 1 << 20
# Rules a bulk delete shows by name on its summary page.
DELETE_SAMPLES = 20


# -- where jobs run ------------------------------------------------------------------


class _Runner:
    """One daemon thread per process that runs admin jobs one after another, for the
    embedded default (no broker): the request that starts a job only queues it."""

    def __init__(self) -> None:
        self.queue: queue.Queue[tuple[Callable[[int], object], int]] = queue.Queue()
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def submit(self, func: Callable[[int], object], job_id: int) -> None:
        with self.lock:
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(
                    target=self._loop, name="urlguard-admin-jobs", daemon=True
                )
                self.thread.start()
        self.queue.put((func, job_id))

    def _loop(self) -> None:
        while True:
            func, job_id = self.queue.get()
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
    from urlguard.celery import in_process

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


class _Progress:
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


def _begin(job_id: int, kind: str, state: str = AdminJob.State.RUNNING) -> AdminJob | None:
    job = AdminJob.objects.filter(pk=job_id, kind=kind).first()
    if job is None:
        logger.warning("admin job %s (%s) no longer exists; nothing to do", job_id, kind)
        return None
    job.state = state
    job.started = job.heartbeat = timezone.now()
    job.message = ""
    # Its owner's heartbeat tells a job that runs from one whose runner died.
    job.owner = str(ownership.me())
    job.save(update_fields=["state", "started", "message", "owner", "heartbeat"])
    ownership.beat_while_owned()
    return job


def _written_before(job: AdminJob) -> ChangeSet | None:
    """The change set a first run of this job left unfinished (it stopped), which the
    job run again finishes."""
    pk = job.params.get("writes")
    return ChangeSet.objects.filter(pk=pk, finished__isnull=True).first() if pk else None


def _writes_into(job: AdminJob, change_set: ChangeSet) -> None:
    job.params = {**job.params, "writes": change_set.pk}
    AdminJob.objects.filter(pk=job.pk).update(params=job.params)


def run_again(job: AdminJob) -> bool:
    """Queue a failed import or bulk delete again (its input is kept until it is
    done): what its first run wrote stays, and the rest is written into the same
    change set. A failed revert is run again from its change set's page."""
    tasks: dict[str, Any] = {"import": import_rules_job, "delete": delete_rules_job}
    task = tasks.get(job.kind)
    if task is None or job.params.get("phase") != "commit":
        return False
    claimed = AdminJob.objects.filter(pk=job.pk, state=AdminJob.State.FAILED).update(
        state=AdminJob.State.QUEUED, message="Waiting for a worker.", finished=None
    )
    if claimed:
        dispatch(task, job.pk)
    return bool(claimed)


def _fail(job: AdminJob, exc: BaseException, message: str) -> None:
    logger.exception("admin job %s failed", job.pk)
    job.state = AdminJob.State.FAILED
    job.finished = timezone.now()
    job.message = f"{message}: {type(exc).__name__}: {exc}"
    job.save(update_fields=["state", "finished", "message", "done", "result"])


# -- imports ---------------------------------------------------------------------------


def create_import(
    texts: Iterable[str], *, default_category: str, filename: str, user: Actor
) -> AdminJob:
    """An import job holding the uploaded text, waiting for its dry run."""
    job = AdminJob.objects.create(
        kind=AdminJob.Kind.IMPORT,
        state=AdminJob.State.QUEUED,
        created_by=row_user(user),
        params={"filename": filename, "default_category": default_category, "phase": "preview"},
        message="Waiting for the dry run to start.",
    )
    job.total = store_chunks(job, texts)
    job.save(update_fields=["total"])
    return job


def start_preview(job: AdminJob) -> None:
    dispatch(preview_import_job, job.pk)


def preview_import(text: str, *, default_category: str, filename: str, user: Actor) -> AdminJob:
    """create_import and its dry run, here and now (commands and tests)."""
    job = create_import([text], default_category=default_category, filename=filename, user=user)
    preview_import_job(job.pk)
    job.refresh_from_db()
    return job


def refused_entry(lineno: int, raw: str, error: str) -> str:
    """One refused line for the download: its reason as a comment above it, so the
    file can be fixed and uploaded again as it is."""
    reason = " ".join(error.split())
    return f"# line {lineno}: {reason}\n{raw}\n"


@shared_task(name="urlguard.admin.preview_import_job")
def preview_import_job(job_id: int) -> dict | None:
    """The dry run: sort every line into new / already present / repeated / refused and
    work out the impact of the new rules. Writes only the AdminJob row."""
    job = _begin(job_id, AdminJob.Kind.IMPORT, AdminJob.State.PREVIEWING)
    if job is None:
        return None
    started = time.perf_counter()
    progress = _Progress(job)
    total_lines = job.total
    new: list[str] = []
    pending: list[str] = []
    refused: list[dict] = []
    refused_file = io.StringIO()
    refused_count = repeated = present = lines = 0

    def check_pending() -> None:
        nonlocal present
        listed = changes.existing_expressions(pending)
        present += len(listed)
        new.extend(e for e in pending if e not in listed)
        pending.clear()

    try:
        for parsed in parse_rules(iter_lines(job), default_category=job.params["default_category"]):
            lines += 1
            if parsed.error is not None:
                refused_count += 1
                refused_file.write(refused_entry(parsed.lineno, parsed.raw, parsed.error))
                if len(refused) < MAX_REFUSED_SHOWN:
                    refused.append(
                        {"lineno": parsed.lineno, "raw": parsed.raw[:300], "error": parsed.error}
                    )
            elif parsed.duplicate_of is not None:
                repeated += 1
            elif parsed.expression is not None:
                pending.append(parsed.expression)
                if len(pending) >= IMPORT_CHUNK:
                    check_pending()
                    progress(parsed.lineno, total_lines)
        check_pending()
        progress(
            total_lines,
            total_lines,
            force=True,
            message="Working out the impact on the short links.",
        )
        impact = impact_of_adding(new)
    except Exception as exc:
        _fail(job, exc, "The dry run failed")
        return None
    job.state = AdminJob.State.PREVIEWED
    job.finished = timezone.now()
    job.done = job.total = len(new)
    job.message = ""
    job.refused = refused_file.getvalue()
    job.result = {
        "lines": lines,
        "new": len(new),
        "present": present,
        "repeated": repeated,
        "refused": refused_count,
        "refused_lines": refused,
        "refused_truncated": refused_count > len(refused),
        "sample_new": new[:20],
        "impact": impact.as_dict(),
        "preview_seconds": round(time.perf_counter() - started, 3),
    }
    job.save(update_fields=["state", "finished", "done", "total", "message", "refused", "result"])
    return {"new": len(new)}


def start_import(job: AdminJob, *, user: Actor) -> bool:
    """Queue a previewed import (once: a second click finds it no longer previewed).
    `user`, who commits it, is its actor from here on (the rules, the change log and
    the rescan are theirs), not whoever uploaded the file; the uploader stays in
    params["uploaded_by"]."""
    uploader = job.created_by
    params = {
        **job.params,
        "phase": "commit",
        "uploaded_by": uploader.get_username() if uploader else None,
    }
    claimed = AdminJob.objects.filter(pk=job.pk, state=AdminJob.State.PREVIEWED).update(
        state=AdminJob.State.QUEUED,
        message="Waiting for a worker.",
        done=0,
        created_by=row_user(user),
        params=params,
    )
    if claimed:
        job.created_by, job.params = row_user(user), params
        dispatch(import_rules_job, job.pk)
    return bool(claimed)


def start_rescan(*, user: Actor, after_import: int | None = None) -> AdminJob:
    job = AdminJob.objects.create(
        kind=AdminJob.Kind.RESCAN,
        state=AdminJob.State.QUEUED,
        created_by=row_user(user),
        params={"after_import": after_import} if after_import else {},
        message="Waiting for a worker.",
    )
    dispatch(rescan_links_job, job.pk)
    return job


def rescan_after_adding(*, user: Actor, after_import: int | None = None) -> AdminJob | None:
    """New rules may block existing short links: queue their rescan (which also brings
    the impact index up to date), where the site has short links; None where it has
    none (an import and a feed refresh both end with this)."""
    if not shortlinks.installed():
        return None
    return start_rescan(user=user, after_import=after_import)


@shared_task(name="urlguard.admin.import_rules_job")
def import_rules_job(job_id: int) -> dict | None:
    job = _begin(job_id, AdminJob.Kind.IMPORT)
    if job is None:
        return None
    progress = _Progress(job)
    lines = int(job.result.get("lines", 0))
    source = f"import:{job.params.get('filename', '')}"[:200]
    started = time.perf_counter()
    # Lines the dry run refused stay refused (they are in the download); anything
    # add_rules refuses now was refused at commit time (the rules changed between).
    entries = (
        parsed
        for parsed in parse_rules(iter_lines(job), default_category=job.params["default_category"])
        if parsed.error is None
    )
    try:
        with changes.change_set(
            kind=ChangeSet.Kind.IMPORT,
            actor=job.created_by,
            note=f"import #{job.number}: {job.params.get('filename', '')}"[:1000],
            source=source,
            resume=_written_before(job),
        ) as change_set:
            _writes_into(job, change_set)
            bulk = changes.add_rules(
                entries,
                source=source,
                user=job.created_by,
                chunk_size=IMPORT_CHUNK,
                progress=lambda handled: progress(handled, lines),
                change_set=change_set,
            )
    except Exception as exc:
        entries.close()  # and so the cursor over the job's input, while the database is open
        added = SpamRule.objects.filter(source=source, created__gte=job.started).count()
        job.result = {**job.result, "added": added}
        # Not re-raised: the job row carries the error to the page, and in-process
        # execution must not turn it into a traceback page.
        _fail(job, exc, f"Stopped after {added} rules were added (those stay)")
        return None
    # A job run again counts what its first run added too (those it now skipped).
    earlier = change_set.added - len(bulk.added)
    added = change_set.added
    skipped = len(bulk.skipped) - int(job.result.get("repeated", 0)) - earlier
    refused = [str(r) for r in bulk.refused]
    rescan = rescan_after_adding(user=job.created_by, after_import=job.pk)
    job.state = AdminJob.State.DONE
    job.finished = timezone.now()
    job.done = job.total = added + max(skipped, 0)
    job.result = {
        **job.result,
        "added": added,
        "skipped": max(skipped, 0),
        "refused_at_commit": refused[:MAX_REFUSED_SHOWN],
        "import_seconds": round(time.perf_counter() - started, 3),
        "rescan_job": rescan.pk if rescan else None,
        "change_set": change_set.pk,
    }
    job.message = f"Added {counted(added, 'rule')} ({max(skipped, 0):,} already present)."
    if refused:
        job.message += f" {len(refused)} were refused at commit time."
    job.save(update_fields=["state", "finished", "done", "total", "result", "message"])
    # The input has served its purpose (the refused lines stay for the download).
    AdminJobChunk.objects.filter(job=job).delete()
    return {"added": added}


# -- bulk deletes --------------------------------------------------------------------------


def create_delete(rules, *, user: Actor) -> AdminJob:
    """A bulk-delete job for the rules (a QuerySet or primary keys), waiting for its
    summary. Only the keys are read here: a million of them is a few megabytes."""
    pks = (
        rules.values_list("pk", flat=True).iterator(chunk_size=20_000)
        if hasattr(rules, "values_list")
        else iter(rules)
    )
    job = AdminJob.objects.create(
        kind=AdminJob.Kind.DELETE,
        state=AdminJob.State.QUEUED,
        created_by=row_user(user),
        params={"phase": "preview"},
        message="Waiting for the summary to start.",
    )
    job.total = store_chunks(job, (f"{pk}\n" for pk in pks))
    job.save(update_fields=["total"])
    dispatch(preview_delete_job, job.pk)
    return job


def _job_pks(job: AdminJob) -> Iterator[list[int]]:
    batch: list[int] = []
    for line in iter_lines(job):
        batch.append(int(line))
        if len(batch) >= IMPORT_CHUNK:
            yield batch
            batch = []
    if batch:
        yield batch


@shared_task(name="urlguard.admin.preview_delete_job")
def preview_delete_job(job_id: int) -> dict | None:
    """The summary of a bulk delete: how many rules (still there), a sample of them by
    name, and what removing them unblocks. Writes only the AdminJob row."""
    job = _begin(job_id, AdminJob.Kind.DELETE, AdminJob.State.PREVIEWING)
    if job is None:
        return None
    progress = _Progress(job)
    expressions: list[str] = []
    categories: dict[str, int] = {}
    samples: list[dict] = []
    try:
        for batch in _job_pks(job):
            for part in changes.in_batches(batch):
                for pk, expression, category in SpamRule.objects.filter(pk__in=part).values_list(
                    "pk", "expression", "category"
                ):
                    expressions.append(expression)
                    categories[category] = categories.get(category, 0) + 1
                    if len(samples) < DELETE_SAMPLES:
                        samples.append({"id": pk, "expression": expression, "category": category})
            progress(len(expressions), job.total)
        progress(
            job.total, job.total, force=True, message="Working out the impact on the short links."
        )
        impact = impact_of_removing(expressions)
    except Exception as exc:
        _fail(job, exc, "The summary failed")
        return None
    job.state = AdminJob.State.PREVIEWED
    job.finished = timezone.now()
    job.done = job.total = len(expressions)
    job.message = ""
    job.result = {
        "rules": len(expressions),
        "categories": categories,
        "samples": samples,
        "impact": impact.as_dict(),
    }
    job.save(update_fields=["state", "finished", "done", "total", "message", "result"])
    return {"rules": len(expressions)}


def _start_commit(job: AdminJob, task: Callable[[int], object], reason: str) -> bool:
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


def start_delete(job: AdminJob, *, reason: str = "") -> bool:
    return _start_commit(job, delete_rules_job, reason)


@shared_task(name="urlguard.admin.delete_rules_job")
def delete_rules_job(job_id: int) -> dict | None:
    job = _begin(job_id, AdminJob.Kind.DELETE)
    if job is None:
        return None
    progress = _Progress(job)
    removed = handled = 0
    try:
        with changes.change_set(
            kind=ChangeSet.Kind.BULK_DELETE,
            actor=job.created_by,
            reason=job.params.get("reason", ""),
            note=f"bulk delete #{job.number}",
            resume=_written_before(job),
        ) as change_set:
            _writes_into(job, change_set)
            removed = change_set.removed  # by a first run that stopped
            for batch in _job_pks(job):
                removed += changes.remove_rules(
                    batch, user=job.created_by, source="admin", change_set=change_set
                )
                handled += len(batch)
                progress(handled, job.total)
    except Exception as exc:
        job.done = handled
        job.result = {**job.result, "removed": removed}
        _fail(job, exc, f"Stopped after {removed} rules were removed (those stay removed)")
        return None
    job.state = AdminJob.State.DONE
    job.finished = timezone.now()
    job.done = job.total
    job.result = {**job.result, "removed": removed, "change_set": change_set.pk}
    job.message = f"Removed {counted(removed, 'rule')}."
    gone = job.total - removed
    if gone:
        job.message += f" {gone:,} were already gone."
    job.save(update_fields=["state", "finished", "done", "result", "message"])
    AdminJobChunk.objects.filter(job=job).delete()
    return {"removed": removed}


# -- rescans -------------------------------------------------------------------------------


@shared_task(name="urlguard.admin.rescan_links_job")
def rescan_links_job(job_id: int) -> dict | None:
    job = _begin(job_id, AdminJob.Kind.RESCAN)
    if job is None:
        return None
    # On a worker, the import's broadcast nudges may still wait behind this job:
    # bring this node's filter up to the change log first, or just-listed rules
    # would be missed by the scan.
    try:
        from urlguard.nodesync import sync

        sync.sync()
    except Exception:
        logger.warning("rescan: could not bring the filter up to date first", exc_info=True)
    progress = _Progress(job)
    try:
        result = rescan_links(progress=progress)
    except Exception as exc:
        _fail(job, exc, "Rescan failed")
        return None
    job.state = AdminJob.State.DONE
    job.finished = timezone.now()
    job.done = job.total = result.scanned
    job.result = result.as_dict()
    hits = len(result.hits)
    job.message = (
        f"Scanned {counted(result.scanned, 'link')} in {result.seconds:.1f} s: "
        f"{counted(hits, 'link')} {'points' if hits == 1 else 'point'} to spam."
    )
    if result.unchecked:
        job.message += (
            f" {result.unchecked} could not be checked because the filter is "
            "unreadable (see the filter dashboard)."
        )
    job.save(update_fields=["state", "finished", "done", "total", "result", "message"])
    # The rescan has just read every link: the impact index follows it, so links
    # edited since the last build are counted right again.
    try:
        build_link_index()
    except Exception:
        logger.exception("rescan: the short-link index for impact figures could not be rebuilt")
    return {"scanned": result.scanned, "hits": len(result.hits)}


# -- reverts ---------------------------------------------------------------------------------


def create_revert(change_set, *, user: Actor) -> AdminJob:
    """A revert job for `change_set`, waiting for its summary."""
    job = AdminJob.objects.create(
        kind=AdminJob.Kind.REVERT,
        state=AdminJob.State.QUEUED,
        created_by=row_user(user),
        params={"phase": "preview", "change_set": change_set.pk},
        message="Waiting for the summary to start.",
    )
    dispatch(preview_revert_job, job.pk)
    return job


@shared_task(name="urlguard.admin.preview_revert_job")
def preview_revert_job(job_id: int) -> dict | None:
    """What reverting would do: rules removed again, rules brought back, and the
    impact of both on the short links. Writes only the AdminJob row."""
    from urlguard.models import ChangeSet
    from urlguard.writepath import revert

    job = _begin(job_id, AdminJob.Kind.REVERT, AdminJob.State.PREVIEWING)
    if job is None:
        return None
    try:
        change_set = ChangeSet.objects.get(pk=job.params["change_set"])
        plan = revert.plan_revert(change_set)
        unblocks, blocks = revert.impact_of_reverting(change_set)
    except Exception as exc:
        _fail(job, exc, "The summary failed")
        return None
    job.state = AdminJob.State.PREVIEWED
    job.finished = timezone.now()
    job.done = job.total = plan.to_remove + plan.to_restore
    job.message = ""
    job.result = {
        "to_remove": plan.to_remove,
        "to_restore": plan.to_restore,
        "unchanged": plan.unchanged,
        "remove_samples": plan.remove_samples,
        "restore_samples": plan.restore_samples,
        "unblocks": unblocks.as_dict() if plan.to_remove else None,
        "blocks": blocks.as_dict() if plan.to_restore else None,
    }
    job.save(update_fields=["state", "finished", "done", "total", "message", "result"])
    return {"to_remove": plan.to_remove, "to_restore": plan.to_restore}


def start_revert(job: AdminJob, *, reason: str = "") -> bool:
    return _start_commit(job, revert_job, reason)


@shared_task(name="urlguard.admin.revert_job")
def revert_job(job_id: int) -> dict | None:
    from urlguard.models import ChangeEvent, ChangeSet
    from urlguard.writepath import revert

    job = _begin(job_id, AdminJob.Kind.REVERT)
    if job is None:
        return None
    progress = _Progress(job)
    events = job.total
    try:
        change_set = ChangeSet.objects.get(pk=job.params["change_set"])
        events = ChangeEvent.objects.filter(change_set=change_set).count()
        done = revert.revert_change_set(
            change_set,
            user=job.created_by,
            reason=job.params.get("reason", ""),
            progress=lambda n: progress(n, events),
        )
    except Exception as exc:
        _fail(job, exc, "The revert stopped (what it changed so far stays, in its change set)")
        return None
    job.state = AdminJob.State.DONE
    job.finished = timezone.now()
    job.done = job.total
    job.result = {
        **job.result,
        "revert_change_set": done.pk,
        "added": done.added,
        "removed": done.removed,
    }
    job.message = (
        f"Reverted {change_set}: {counted(done.removed, 'rule')} removed, "
        f"{counted(done.added, 'rule')} restored (change set #{done.pk})."
    )
    job.save(update_fields=["state", "finished", "done", "result", "message"])
    return {"change_set": done.pk}
