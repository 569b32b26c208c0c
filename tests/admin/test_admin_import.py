"""The import pages: upload, dry-run preview (new / present / repeated / refused with
reasons), commit through changes.add_rules, the rescan that follows, progress JSON,
form errors and permissions."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from tests.support.faults import fail_on_call
from tests.support.fixtures import RULE_EDITOR
from urlguard.models import AdminJob, ChangeEvent, ShortLink, SpamRule
from urlguard.writepath import changes

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_guard")]

UPLOAD = reverse("admin:urlguard_spamrule_import")

FILE = b"""# a feed
https://Spam-One.example.com/
0.0.0.0 spam-two.example.net
spam-three.example.org/path/
co.uk
HTTP://spam-one.example.com

already.example.com
"""


def _upload(client, content: bytes, name: str = "feed.txt", category: str = "spam"):
    return client.post(
        UPLOAD, {"file": SimpleUploadedFile(name, content), "default_category": category}
    )


def _job_page(job: AdminJob) -> str:
    return reverse("admin:urlguard_spamrule_import_job", args=[job.pk])


def test_upload_page(editor):
    page = editor.get(UPLOAD)
    assert page.status_code == 200 and 'type="file"' in page.content.decode()


def test_preview_counts_and_refusals_and_changes_nothing(editor):
    changes.add_rule("already.example.com", category="spam")
    before = (SpamRule.objects.count(), ChangeEvent.objects.count())
    response = _upload(editor, FILE)
    assert response.status_code == 302
    job = AdminJob.objects.get(kind="import")
    assert response["Location"] == _job_page(job)
    result = job.result
    assert (result["new"], result["present"], result["repeated"], result["refused"]) == (3, 1, 1, 1)
    assert result["lines"] == 6  # the comment and the blank line are no entries
    assert [(line["lineno"], line["raw"]) for line in result["refused_lines"]] == [(5, "co.uk")]
    assert "public suffix" in result["refused_lines"][0]["error"]
    # The dry run wrote no rule and no change event.
    assert (SpamRule.objects.count(), ChangeEvent.objects.count()) == before
    html = editor.get(_job_page(job)).content.decode()
    assert "Dry run: nothing has changed yet" in html
    assert "public suffix" in html and "co.uk" in html
    assert "Commit: add 3 rules" in html


def test_commit_adds_through_the_change_log_then_rescans(editor, committed, filter_path):
    changes.add_rule("already.example.com", category="spam")
    hit = ShortLink.objects.create(slug="bad", destination="http://www.spam-two.example.net/a")
    ShortLink.objects.create(slug="good", destination="https://fine.example.org/")
    _upload(editor, FILE, category="malware")
    job = AdminJob.objects.get(kind="import")
    with committed():
        response = editor.post(reverse("admin:urlguard_spamrule_import_commit", args=[job.pk]))
    assert response.status_code == 302 and response["Location"] == _job_page(job)
    job.refresh_from_db()
    assert job.state == "done" and job.result["added"] == 3, job.message
    imported = SpamRule.objects.filter(source="import:feed.txt")
    assert set(imported.values_list("expression", flat=True)) == {
        "spam-one.example.com/",
        "spam-two.example.net/",
        "spam-three.example.org/path/",
    }
    assert set(imported.values_list("category", flat=True)) == {"malware"}
    assert ChangeEvent.objects.filter(action="add").count() == 4
    assert job.payload == ""  # served its purpose
    rescan = AdminJob.objects.get(pk=job.result["rescan_job"])
    assert rescan.state == "done" and rescan.result["scanned"] == 2
    assert [h["slug"] for h in rescan.result["hits"]] == ["bad"]
    assert rescan.result["hits"][0]["link_id"] == hit.pk
    html = editor.get(_job_page(job)).content.decode()
    assert "Rescan after the import" in html and "1 link points to spam" in html
    assert f"rescan/?job={rescan.pk}" in html  # the way to disable it


def test_the_import_is_recorded_under_who_commits_it(make_staff, committed):
    uploader, committer = make_staff(*RULE_EDITOR), make_staff(*RULE_EDITOR)
    _upload(uploader, b"one.example.com\ntwo.example.com\n")
    job = AdminJob.objects.get(kind="import")
    with committed():
        committer.post(reverse("admin:urlguard_spamrule_import_commit", args=[job.pk]))
    job.refresh_from_db()
    assert job.state == "done", job.message
    assert set(ChangeEvent.objects.values_list("actor", flat=True)) == {committer.user.pk}
    assert job.created_by == committer.user
    assert job.params["uploaded_by"] == uploader.user.get_username()
    rescan = AdminJob.objects.get(pk=job.result["rescan_job"])
    assert rescan.created_by == committer.user


def test_commit_twice_imports_once(editor, committed):
    _upload(editor, b"one.example.com\n")
    job = AdminJob.objects.get(kind="import")
    commit = reverse("admin:urlguard_spamrule_import_commit", args=[job.pk])
    with committed():
        editor.post(commit)
        second = editor.post(commit, follow=True)
    assert "already committed" in second.content.decode()
    assert ChangeEvent.objects.count() == 1


def test_commit_needs_post(editor):
    _upload(editor, b"one.example.com\n")
    job = AdminJob.objects.get(kind="import")
    assert (
        editor.get(reverse("admin:urlguard_spamrule_import_commit", args=[job.pk])).status_code
        == 405
    )


def test_csv_with_category_column(editor, committed):
    _upload(
        editor,
        b"url,category\nhttps://a.example.com/,phishing\nb.example.com,malware\n",
        name="feed.csv",
    )
    job = AdminJob.objects.get(kind="import")
    assert job.result["new"] == 2
    with committed():
        editor.post(reverse("admin:urlguard_spamrule_import_commit", args=[job.pk]))
    assert dict(SpamRule.objects.values_list("expression", "category")) == {
        "a.example.com/": "phishing",
        "b.example.com/": "malware",
    }


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty"),
        (b"\xff\xfe\x00bad", "not UTF-8"),
        (b"abc\x00def\n", "binary"),
    ],
)
def test_bad_files_are_form_errors(editor, content, message):
    page = _upload(editor, content)
    assert page.status_code == 200
    assert message in " ".join(page.context["form"].errors["file"])
    assert not AdminJob.objects.exists()


def test_missing_file_is_a_form_error(editor):
    page = editor.post(UPLOAD, {"default_category": "spam"})
    assert page.status_code == 200
    assert page.context["form"].errors["file"] == ["Choose the rule file to upload."]


def test_unknown_job_is_404(editor):
    assert editor.get(reverse("admin:urlguard_spamrule_import_job", args=[999])).status_code == 404
    assert editor.get(reverse("admin:urlguard_spamrule_job_status", args=[999])).status_code == 404


def test_status_json(editor):
    changes.add_rule("already.example.com", category="spam")
    _upload(editor, FILE)
    job = AdminJob.objects.get(kind="import")
    data = editor.get(reverse("admin:urlguard_spamrule_job_status", args=[job.pk])).json()
    assert data == {
        "id": job.pk,
        "kind": "import",
        "state": "previewed",
        "done": 3,
        "total": 3,
        "message": "",
        # The dry run is a job too: the page stops polling and shows its result.
        "finished": True,
        "rescan_job": None,
    }


def test_import_needs_add_permission(viewer, editor):
    assert viewer.get(UPLOAD).status_code == 403
    assert _upload(viewer, FILE).status_code == 403
    _upload(editor, FILE)
    job = AdminJob.objects.get(kind="import")
    assert viewer.get(_job_page(job)).status_code == 403
    assert (
        viewer.post(reverse("admin:urlguard_spamrule_import_commit", args=[job.pk])).status_code
        == 403
    )
    assert (
        viewer.get(reverse("admin:urlguard_spamrule_job_status", args=[job.pk])).status_code == 403
    )
    assert not SpamRule.objects.exists()


def test_a_failing_commit_is_reported_not_a_traceback(editor, committed, monkeypatch):
    _upload(editor, b"one.example.com\ntwo.example.com\n")
    job = AdminJob.objects.get(kind="import")

    def broken(*args, **kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr(changes, "add_rules", broken)
    with committed():
        editor.post(reverse("admin:urlguard_spamrule_import_commit", args=[job.pk]))
    page = editor.get(_job_page(job))
    assert page.status_code == 200
    job.refresh_from_db()
    assert job.state == "failed" and "database went away" in job.message
    assert "database went away" in page.content.decode()


def test_running_import_and_its_rescan_show_progress_bars(editor):
    _upload(editor, b"one.example.com\n")
    job = AdminJob.objects.get(kind="import")
    rescan = AdminJob.objects.create(
        kind="rescan", state="queued", total=0, message="Waiting for a worker."
    )
    AdminJob.objects.filter(pk=job.pk).update(
        state="running", done=1, result={**job.result, "rescan_job": rescan.pk}
    )
    html = editor.get(_job_page(job)).content.decode()
    for watched in (job, rescan):
        status = reverse("admin:urlguard_spamrule_job_status", args=[watched.pk])
        assert f'data-status-url="{status}"' in html
    assert '<progress max="1" value="1">' in html and "Waiting for a worker." in html


ADVERSARIAL = "\n".join(
    [
        "# every line below but the last two is refused",
        "bad_host!.example/",
        "a" * 300 + ".example.com",
        "xn--zz.example",
        "-leading-hyphen.example.com",
        "1.2.3.4.5",
        "192.168.0.1/admin",
        "http://127.0.0.1/",
        "[::1]",
        "169.254.1.1",
        "0x7f000001",
        "*.com",
        "||com^",
        "||co.uk^$third-party",
        ".github.io",
        "*.рф",
        "COM.",
        "javascript:alert(1)",
        "two words.example",
        "ok-one.example.com",
        "||ok-two.example.net^",
    ]
).encode()


def test_an_adversarial_file_is_refused_line_by_line(editor):
    _upload(editor, ADVERSARIAL)
    job = AdminJob.objects.get()
    result = job.result
    assert (result["new"], result["refused"]) == (2, 18)
    reasons = {line["raw"][:20]: line["error"] for line in result["refused_lines"]}
    assert "not a valid host name label" in reasons["bad_host!.example/"]
    assert "at most 253" in reasons["a" * 20]
    assert "not valid IDNA" in reasons["xn--zz.example"]
    assert "private address" in reasons["192.168.0.1/admin"]
    assert "loopback address" in reasons["0x7f000001"]
    assert "link-local" in reasons["169.254.1.1"]
    assert "ends in a number" in reasons["1.2.3.4.5"]
    for bare in ("*.com", "||com^", "||co.uk^$third-party", ".github.io", "*.рф", "COM."):
        assert "would block every site under it" in reasons[bare[:20]], bare
    assert result["sample_new"] == ["ok-one.example.com/", "ok-two.example.net/"]
    # Every refused line downloads as a file, each under its reason.
    download = editor.get(reverse("admin:urlguard_spamrule_import_refused", args=[job.pk]))
    assert download.status_code == 200
    assert download["Content-Disposition"] == f'attachment; filename="import-{job.pk}-refused.txt"'
    text = download.content.decode()
    assert text.count("\n# line ") + text.startswith("# line ") == 18
    assert "# line 2: 'bad_host!.example/': the host label" in text
    assert "\nbad_host!.example/\n" in text and "ok-one" not in text


def test_private_addresses_are_allowed_by_the_setting(editor, settings):
    settings.URLGUARD = {**settings.URLGUARD, "ALLOW_PRIVATE_ADDRESS_RULES": True}
    _upload(editor, b"192.168.0.1/admin\n10.0.0.1\n")
    assert AdminJob.objects.get().result["new"] == 2


def test_refused_download_needs_add_permission(viewer, editor):
    _upload(editor, b"bad_host!.example\n")
    job = AdminJob.objects.get()
    assert (
        viewer.get(reverse("admin:urlguard_spamrule_import_refused", args=[job.pk])).status_code
        == 403
    )


def test_an_import_that_stopped_runs_again_to_the_end_in_one_change_set(
    editor, committed, monkeypatch
):
    from urlguard.jobs import imports
    from urlguard.models import ChangeSet

    _upload(editor, b"".join(b"again%d.example.com\n" % i for i in range(5)))
    job = AdminJob.objects.get(kind="import")
    commit = reverse("admin:urlguard_spamrule_import_commit", args=[job.pk])
    monkeypatch.setattr(imports, "IMPORT_CHUNK", 2)
    fail_on_call(monkeypatch, changes, "_add_chunk", 2, OSError("the worker's disk went away"))
    with committed():
        editor.post(commit)
    job.refresh_from_db()
    assert job.state == "failed" and SpamRule.objects.count() == 2
    page = editor.get(_job_page(job)).content.decode()
    assert "Run it again" in page and f'action="{commit}"' in page
    with committed():
        editor.post(commit)
    job.refresh_from_db()
    assert job.state == "done", job.message
    assert job.message == "Added 5 rules (0 already present)."
    assert SpamRule.objects.count() == 5
    (change_set,) = ChangeSet.objects.filter(kind="import")
    assert change_set.added == 5 and change_set.finished is not None
    assert job.result["change_set"] == change_set.pk


@pytest.mark.django_db(transaction=True)
def test_an_import_survives_another_connection_writing_between_its_chunks(monkeypatch):
    """The job's input is read a chunk per query: an open cursor across its writes
    would hold an SQLite read snapshot (see test_revert)."""
    import sqlite3

    from django.db import connection

    from urlguard import jobs
    from urlguard.jobs import dispatch, imports

    if connection.vendor != "sqlite":
        pytest.skip("the read snapshot held by an open cursor is SQLite's")
    monkeypatch.setattr(dispatch, "CHUNK_CHARS", 40)
    monkeypatch.setattr(imports, "IMPORT_CHUNK", 2)
    lines = [f"chunked{i}.example.com\n" for i in range(8)]
    job = jobs.create_import(lines, default_category="spam", filename="x.txt", actor=None)
    assert job.chunks.count() > 2
    imports.preview_import_job(job.pk)
    other = sqlite3.connect(connection.settings_dict["NAME"], timeout=5)
    real = changes.add_rules

    def another_writer_between(items, **kwargs):
        def each():
            for n, item in enumerate(items):
                if n % 2 == 0:
                    other.execute("UPDATE urlguard_source SET interval = interval + 1")
                    other.commit()
                yield item

        return real(each(), **kwargs)

    monkeypatch.setattr(changes, "add_rules", another_writer_between)
    try:
        assert jobs.start_import(AdminJob.objects.get(pk=job.pk), actor=None)
    finally:
        other.close()
    job.refresh_from_db()
    assert job.state == "done", job.message
    assert SpamRule.objects.count() == 8
