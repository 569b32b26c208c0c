"""urlguard.jobs: job input streamed through chunks of whole lines, the upload
decoded a piece at a time, where a job runs (worker, runner thread, inline), and the
bulk-delete job from its summary to the removal."""

from __future__ import annotations

import threading

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from urlguard import jobs
from urlguard.admin.forms import decoded
from urlguard.jobs import deletes, dispatch, imports
from urlguard.models import AdminJob, AdminJobChunk, ChangeEvent, ShortLink, SpamRule
from urlguard.writepath import changes

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("quiet")]


def _job() -> AdminJob:
    return AdminJob.objects.create(kind=AdminJob.Kind.IMPORT)


@pytest.mark.parametrize("chunk_chars", [1, 7, 64, 1 << 20])
def test_chunks_hold_whole_lines_and_give_them_back(monkeypatch, chunk_chars):
    monkeypatch.setattr(dispatch, "CHUNK_CHARS", chunk_chars)
    lines = [f"line-{i}.example.com" for i in range(50)] + ["", "last without newline"]
    text = "\n".join(lines)
    pieces = [text[i : i + 5] for i in range(0, len(text), 5)]  # cut mid-line
    job = _job()
    assert dispatch.store_chunks(job, pieces) == len(lines)
    for chunk in AdminJobChunk.objects.filter(job=job).exclude(
        seq=AdminJobChunk.objects.filter(job=job).count() - 1
    ):
        assert chunk.text.endswith("\n")
    assert list(dispatch.iter_lines(job)) == lines


def test_decoded_streams_utf8_and_names_the_bad_byte():
    upload = SimpleUploadedFile("f.txt", ("\ufeff" + "Bücher.example\n" * 3).encode())
    assert "".join(decoded(upload, chunk_size=3)) == "Bücher.example\n" * 3
    bad = SimpleUploadedFile("f.txt", b"ok.example\n" * 10 + b"\xff\n")
    with pytest.raises(UnicodeDecodeError) as caught:
        list(decoded(bad, chunk_size=4))
    assert caught.value.start == 110


def test_dispatch_runs_on_the_runner_thread_without_a_broker(
    monkeypatch, django_capture_on_commit_callbacks
):
    monkeypatch.setattr(dispatch, "_memory_database", lambda: False)
    ran = []
    done = threading.Event()

    def task(job_id):
        ran.append((job_id, threading.current_thread().name))
        done.set()

    runner = dispatch._Runner()
    monkeypatch.setattr(dispatch, "runner", runner)
    with django_capture_on_commit_callbacks(execute=True):
        dispatch.dispatch(task, 7)
        assert ran == []  # not before the commit
    assert done.wait(5)
    runner.join()
    assert ran == [(7, "urlguard-admin-jobs")]


def test_dispatch_sends_to_a_worker_with_a_broker(monkeypatch, django_capture_on_commit_callbacks):
    from urlguard_service.celery import app

    monkeypatch.setitem(app.conf, "task_always_eager", False)
    monkeypatch.setitem(app.conf, "broker_url", "redis://127.0.0.1:1/0")
    sent = []

    class Task:
        def delay(self, job_id):
            sent.append(job_id)

    with django_capture_on_commit_callbacks(execute=True):
        dispatch.dispatch(Task(), 3)
        assert sent == []
    assert sent == [3]


def test_the_upload_request_only_stores_and_queues(editor, monkeypatch):
    queued = []
    monkeypatch.setattr(
        imports, "dispatch", lambda task, job_id: queued.append((task.name, job_id))
    )
    body = b"".join(f"spam{i}.example.com\n".encode() for i in range(5000))
    response = editor.post(
        reverse("admin:urlguard_spamrule_import"),
        {"file": SimpleUploadedFile("big.txt", body), "default_category": "spam"},
    )
    job = AdminJob.objects.get()
    assert response.status_code == 302
    assert queued == [("urlguard.admin.preview_import_job", job.pk)]
    assert (job.state, job.total, job.result) == ("queued", 5000, {})
    page = editor.get(response["Location"]).content.decode()
    assert "Dry run queued: nothing changes" in page and "<progress" in page
    imports.preview_import_job(job.pk)
    job.refresh_from_db()
    assert (job.state, job.result["new"]) == ("previewed", 5000)


def test_a_bulk_delete_of_many_rules_is_a_summary_then_a_job(editor):
    changes.add_rules([f"r{i}.example.net" for i in range(60)], source="test")
    ShortLink.objects.create(slug="s", destination="https://r3.example.net/x")
    job = jobs.create_delete(SpamRule.objects.all(), actor=editor.user)
    job.refresh_from_db()
    assert job.state == "previewed" and job.total == 60
    assert len(job.result["samples"]) == deletes.DELETE_SAMPLES
    assert job.result["impact"]["links"] == 1 and job.result["impact"]["changed"] == 1
    page = editor.get(reverse("admin:urlguard_spamrule_delete_job", args=[job.pk]))
    html = page.content.decode()
    assert "Delete 60 rules?" in html and "The first 20 of 60" in html
    assert html.count("<li><code>r") == 20  # a sample, never every rule
    assert "Would unblock 1 of the 1 short link" in html
    changes.remove_rule(SpamRule.objects.get(expression="r0.example.net/"))
    editor.post(reverse("admin:urlguard_spamrule_delete_commit", args=[job.pk]))
    job.refresh_from_db()
    assert job.state == "done" and job.message == "Removed 59 rules. 1 were already gone."
    assert (
        not SpamRule.objects.exists() and ChangeEvent.objects.filter(action="remove").count() == 60
    )
    assert not AdminJobChunk.objects.filter(job=job).exists()


def test_bulk_delete_needs_delete_permission(make_staff, editor):
    changes.add_rule("x.example.net", category="spam")
    job = jobs.create_delete(SpamRule.objects.all(), actor=editor.user)
    adder = make_staff("view_spamrule", "add_spamrule", "change_spamrule")
    for method, name in (("get", "delete_job"), ("post", "delete_commit"), ("get", "job_status")):
        url = reverse(f"admin:urlguard_spamrule_{name}", args=[job.pk])
        assert getattr(adder, method)(url).status_code == 403
    response = adder.post(
        reverse("admin:urlguard_spamrule_changelist"),
        {"action": "delete_selected_rules", "_selected_action": [SpamRule.objects.get().pk]},
    )
    assert AdminJob.objects.count() == 1 and response.status_code in (200, 302)
    assert SpamRule.objects.count() == 1
