"""The admin's long jobs on real services: with a broker, an import commit and the
rescan after it are handed to a real Celery worker (not run in the request), and the
page follows their progress. Run by `make test-live`."""

from __future__ import annotations

from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from tests.support.services import LIVE, wait_for
from urlguard.models import AdminJob, ShortLink, SpamRule
from urlguard.nodesync import sync

pytestmark = LIVE


def test_import_and_rescan_run_on_the_worker(start_worker, filter_path, make_staff):
    sync.rebuild(str(filter_path))
    ShortLink.objects.create(slug="bad", destination="https://www.worker-spam.example.com/x")
    worker = start_worker()
    editor = make_staff("view_spamrule", "add_spamrule", "view_shortlink")
    lines = "\n".join(["worker-spam.example.com"] + [f"w{i}.example.net" for i in range(300)])
    editor.post(
        reverse("admin:urlguard_spamrule_import"),
        {"file": SimpleUploadedFile("feed.txt", lines.encode()), "default_category": "spam"},
    )
    job = AdminJob.objects.get(kind="import")
    # The dry run is a job on the worker too.
    wait_for(
        lambda: AdminJob.objects.get(pk=job.pk).state == "previewed",
        timeout=60,
        what="the dry run",
        log=worker.log,
    )
    response = editor.post(
        reverse("admin:urlguard_spamrule_import_commit", args=[job.pk]), follow=True
    )
    # The request only queued it: a worker does the work.
    assert "is queued" in response.content.decode()
    status = reverse("admin:urlguard_spamrule_job_status", args=[job.pk])

    def finished() -> bool:
        return editor.get(status).json()["finished"]

    wait_for(finished, timeout=60, what="the import job", log=worker.log)
    job.refresh_from_db()
    assert job.state == "done", job.message
    assert SpamRule.objects.count() == 301
    rescan = AdminJob.objects.get(pk=job.result["rescan_job"])
    wait_for(
        lambda: AdminJob.objects.get(pk=rescan.pk).state == "done",
        timeout=60,
        what="the rescan job",
        log=worker.log,
    )
    rescan.refresh_from_db()
    assert [h["slug"] for h in rescan.result["hits"]] == ["bad"]
    page = editor.get(reverse("admin:urlguard_spamrule_import_job", args=[job.pk]))
    assert "1 link points to spam" in page.content.decode()


def test_refresh_now_runs_on_the_worker(start_worker, filter_path, make_staff):
    from tests.support.feedserver import feed_server
    from urlguard.models import Source

    sync.rebuild(str(filter_path))
    worker = start_worker()
    editor = make_staff("view_source", "change_source")
    with feed_server() as feeds:
        url = feeds.serve("/l", b"one.worker-feed.example\ntwo.worker-feed.example\n")
        source = Source.objects.create(name="worker-feed", kind="feed", url=url)
        response = editor.post(reverse("admin:urlguard_source_refresh", args=[source.pk]))
        job = AdminJob.objects.get(kind="refresh")
        assert response.status_code == 302 and response["Location"].endswith(f"/{job.pk}/")
        status = reverse("admin:urlguard_source_refresh_status", args=[job.pk])
        wait_for(
            lambda: editor.get(status).json()["finished"],
            timeout=60,
            what="the refresh job",
            log=worker.log,
        )
    job.refresh_from_db()
    assert job.state == "done", job.message
    assert SpamRule.objects.filter(listings__source=source).count() == 2


def test_parallel_rescan_matches_the_single_process_one(filter_path, monkeypatch):
    from urlguard.shortlinks import rescan
    from urlguard.writepath import changes

    changes.add_rules(["par-spam.example.com", "other-spam.example.net/x/"], source="test")
    sync.rebuild(str(filter_path))
    ShortLink.objects.bulk_create(
        [
            ShortLink(
                slug=f"p{i}",
                destination=(
                    f"https://www.par-spam.example.com/{i}"
                    if i % 50 == 0
                    else f"http://other-spam.example.net/x/{i}"
                    if i % 77 == 0
                    else f"https://clean{i}.example.org/a?b={i}"
                ),
            )
            for i in range(2000)
        ]
    )
    monkeypatch.setattr(rescan, "RANGE_SIZE", 300)  # several pool tasks
    seen = []
    parallel = rescan.rescan_links(
        processes=2, chunk_size=128, progress=lambda done, total: seen.append((done, total))
    )
    single = rescan.rescan_links(processes=1)
    assert parallel.processes == 2 and parallel.scanned == single.scanned == 2000
    assert parallel.hits == single.hits and len(single.hits) == 65
    assert seen[-1] == (2000, 2000) and len(seen) > 2


def test_dashboard_sync_and_rebuild_go_to_the_worker(
    start_worker,
    filter_path,
    make_staff,
):
    sync.rebuild(str(filter_path))
    worker = start_worker()
    boss = make_staff(superuser=True)
    from urlguard.models import NodeStatus
    from urlguard.writepath import changes

    changes.add_rule("dash-worker.example.com", category="spam")  # nudges the worker too
    head = sync.log_head()  # PostgreSQL sequences run on across tests
    page = boss.post(reverse("admin:urlguard_spamrule_dashboard_sync"), follow=True)
    assert "sent to every node" in page.content.decode()
    wait_for(
        lambda: NodeStatus.objects.filter(node=worker.node, applied_seq=head).exists(),
        timeout=45,
        what="the worker's report",
        log=worker.log,
    )
    page = boss.post(reverse("admin:urlguard_spamrule_dashboard_rebuild"), follow=True)
    assert "sent to every node" in page.content.decode()
    wait_for(
        lambda: NodeStatus.objects.filter(
            node=worker.node, last_rebuild_seconds__isnull=False
        ).exists(),
        timeout=45,
        what="the worker's rebuild report",
        log=worker.log,
    )
    status = boss.get(reverse("admin:urlguard_spamrule_dashboard_status")).json()
    assert {n["node"]: n["lag"] for n in status["nodes"]}[worker.node] == 0


def test_the_hit_log_merges_on_postgresql(db):
    from django.utils import timezone

    from urlguard.hotpath import hitlog
    from urlguard.models import RuleHitDay, RuleHitTotal
    from urlguard.runtime import stats
    from urlguard.writepath import changes

    rule = changes.add_rule("pg-hits.example", category="spam")
    earlier = timezone.now() - timezone.timedelta(minutes=5)
    hitlog.warned(rule.pk, "pg-hits.example")
    stats.flush()
    hitlog.EVENTS.append((hitlog.WARNED, rule.pk, "pg-hits.example", earlier))
    hitlog.continued(rule.pk)
    stats.flush()
    total = RuleHitTotal.objects.get(rule=rule)
    assert (total.hits, total.continued) == (2, 1) and total.last_at > earlier
    assert RuleHitDay.objects.get(rule_id=rule.pk).hits == 2
