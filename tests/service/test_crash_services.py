"""A Celery worker SIGKILLed in the middle of a feed refresh and of an admin revert
(it kills itself right after a known chunk committed), on PostgreSQL and Redis; the
worker started again lets go of what the dead one held at boot, and the work run
again is finished, with nothing left claimed or running."""

from __future__ import annotations

import signal

from tests.support.services import LIVE, Worker, wait_for
from urlguard import jobs
from urlguard.feeds.tasks import refresh_feed
from urlguard.models import AdminJob, ChangeSet, Source, SpamRule

pytestmark = LIVE

RULES = 3000
CHUNK = 500


def killing(after: int, feed_root: str) -> dict[str, str]:
    return {
        "URLGUARD_TEST_FEED_ROOT": feed_root,
        "DJANGO_SETTINGS_MODULE": "tests.support.kill_settings",
        "URLGUARD_TEST_KILL_AFTER": str(after),
        "URLGUARD_TEST_CHUNK": str(CHUNK),
    }


def died(worker: Worker) -> None:
    code = worker.proc.wait(timeout=120)
    assert code == -signal.SIGKILL, worker.log.read_text()[-3000:]


def test_a_worker_killed_mid_refresh_then_mid_revert_finishes_both(start_worker, tmp_path):
    body = tmp_path / "feed.txt"
    body.write_text("".join(f"svc-crash{i}.example.net\n" for i in range(RULES)))
    source = Source.objects.create(name="crash", kind="feed", url=f"file://{body}")
    feed_root = {"URLGUARD_TEST_FEED_ROOT": str(tmp_path)}

    # A refresh, killed after two chunks: the claim and a partial change set stay.
    worker = start_worker(env=killing(2, str(tmp_path)))
    refresh_feed.delay(source.pk)
    died(worker)
    assert SpamRule.objects.count() == 2 * CHUNK
    source.refresh_from_db()
    assert source.refreshing_since is not None
    # The worker started again lets go of the claim at boot (its owner's pid is dead).
    worker = start_worker(env=feed_root)
    wait_for(
        lambda: Source.objects.get(pk=source.pk).refreshing_since is None,
        what="the dead worker's claim released at boot",
        log=worker.log,
    )
    refresh_feed.delay(source.pk)
    wait_for(
        lambda: Source.objects.filter(pk=source.pk, last_status="ok").exists(),
        timeout=60,
        what="the refresh run again",
        log=worker.log,
    )
    assert SpamRule.objects.count() == RULES
    (refresh,) = ChangeSet.objects.filter(kind="refresh")
    assert refresh.added == RULES and refresh.finished is not None and not refresh.owner
    worker.stop()

    # The admin's revert of that refresh, killed after two chunks.
    worker = start_worker(env=killing(2, str(tmp_path)))
    job = jobs.create_revert(refresh, actor=None)
    wait_for(
        lambda: AdminJob.objects.get(pk=job.pk).state == "previewed",
        timeout=60,
        what="the revert's summary",
        log=worker.log,
    )
    assert jobs.start_revert(AdminJob.objects.get(pk=job.pk))
    died(worker)
    assert SpamRule.objects.count() == RULES - 2 * CHUNK
    assert AdminJob.objects.get(pk=job.pk).state == "running"
    worker = start_worker(env=feed_root)
    wait_for(
        lambda: AdminJob.objects.get(pk=job.pk).state == "failed",
        what="the orphaned revert job failed at boot",
        log=worker.log,
    )
    assert AdminJob.objects.get(pk=job.pk).message == "The worker stopped; run it again to finish."
    again = jobs.create_revert(refresh, actor=None)
    wait_for(
        lambda: AdminJob.objects.get(pk=again.pk).state == "previewed",
        timeout=60,
        what="the summary of what is left",
        log=worker.log,
    )
    assert AdminJob.objects.get(pk=again.pk).result["to_remove"] == RULES - 2 * CHUNK
    assert jobs.start_revert(AdminJob.objects.get(pk=again.pk))
    wait_for(
        lambda: AdminJob.objects.get(pk=again.pk).state == "done",
        timeout=60,
        what="the revert run again",
        log=worker.log,
    )
    assert not SpamRule.objects.exists()
    (revert,) = ChangeSet.objects.filter(kind="revert")
    assert revert.removed == RULES and revert.finished is not None and not revert.owner
    assert not AdminJob.objects.filter(state__in=("running", "previewing")).exists()
    assert not Source.objects.filter(refreshing_since__isnull=False).exists()
