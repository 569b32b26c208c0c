"""Undo: change sets in the admin (who, when, what, note, reason, counts; their rules)
and "revert this change set": a summary, then a job that applies the inverse through
urlguard.writepath.changes (removed rules come back with category and note), once; bulk deletes
and imports are change sets. View-only staff cannot revert."""

from __future__ import annotations

import re

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from tests.support.faults import fail_on_call
from urlguard import jobs
from urlguard.jobs import deletes
from urlguard.models import AdminJob, ChangeEvent, ChangeSet, ShortLink, SpamRule
from urlguard.writepath import changes, revert

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_guard", "quiet")]


def _import(client, body: bytes) -> AdminJob:
    client.post(
        reverse("admin:urlguard_spamrule_import"),
        {"file": SimpleUploadedFile("feed.txt", body), "default_category": "malware"},
    )
    job = AdminJob.objects.filter(kind="import").latest("pk")
    client.post(reverse("admin:urlguard_spamrule_import_commit", args=[job.pk]))
    job.refresh_from_db()
    return job


def _revert(client, change_set: ChangeSet, reason: str = "oops") -> AdminJob:
    start = client.post(reverse("admin:urlguard_changeset_revert", args=[change_set.pk]))
    assert start.status_code == 302
    job = AdminJob.objects.filter(kind="revert").latest("pk")
    summary = client.get(start["Location"])
    assert summary.status_code == 200 and "Nothing has changed yet" in summary.content.decode()
    client.post(
        reverse("admin:urlguard_changeset_revert_commit", args=[job.pk]), {"reason": reason}
    )
    job.refresh_from_db()
    return job


def test_an_import_is_a_change_set_and_its_revert_removes_what_it_added(editor):
    changes.add_rule("kept.example.org", category="spam")
    ShortLink.objects.create(slug="s", destination="https://imp-one.example.com/x")
    job = _import(editor, b"imp-one.example.com\nimp-two.example.com\nkept.example.org\n")
    change_set = ChangeSet.objects.get(pk=job.result["change_set"])
    assert (change_set.kind, change_set.added, change_set.actor) == ("import", 2, editor.user)
    page = editor.get(reverse("admin:urlguard_changeset_change", args=[change_set.pk]))
    html = page.content.decode()
    assert "imp-one.example.com/" in html and "Revert this change set" in html
    listing = editor.get(reverse("admin:urlguard_changeset_changelist")).content.decode()
    assert "+2 added" in listing
    start = editor.post(reverse("admin:urlguard_changeset_revert", args=[change_set.pk]))
    summary = editor.get(start["Location"]).content.decode()
    assert "Would unblock 1 of the 1 short link" in summary
    job = AdminJob.objects.filter(kind="revert").latest("pk")
    editor.post(
        reverse("admin:urlguard_changeset_revert_commit", args=[job.pk]), {"reason": "bad feed"}
    )
    job.refresh_from_db()
    assert job.state == "done", job.message
    assert set(SpamRule.objects.values_list("expression", flat=True)) == {"kept.example.org/"}
    undo = ChangeSet.objects.get(pk=job.result["revert_change_set"])
    assert (undo.kind, undo.reverts, undo.removed, undo.reason) == (
        "revert",
        change_set,
        2,
        "bad feed",
    )
    # Once only.
    again = editor.post(
        reverse("admin:urlguard_changeset_revert", args=[change_set.pk]), follow=True
    )
    assert "already reverted" in again.content.decode()


def test_a_bulk_delete_is_reverted_with_categories_and_notes(editor):
    a = changes.add_rule("del-a.example.net", category="phishing", note="reported by CERT")
    b = changes.add_rule("del-b.example.net", category="malware")
    deleting = jobs.create_delete(SpamRule.objects.filter(pk__in=[a.pk, b.pk]), actor=editor.user)
    jobs.start_delete(AdminJob.objects.get(pk=deleting.pk), reason="false positives?")
    deleting.refresh_from_db()
    change_set = ChangeSet.objects.get(pk=deleting.result["change_set"])
    assert (change_set.kind, change_set.removed, change_set.reason) == (
        "bulk-delete",
        2,
        "false positives?",
    )
    assert not SpamRule.objects.exists()
    job = _revert(editor, change_set)
    assert job.state == "done", job.message
    back = {r.expression: (r.category, r.note) for r in SpamRule.objects.all()}
    assert back == {
        "del-a.example.net/": ("phishing", "reported by CERT"),
        "del-b.example.net/": ("malware", ""),
    }
    assert (
        ChangeEvent.objects.filter(action="add", change_set=job.result["revert_change_set"]).count()
        == 2
    )


def test_a_revert_leaves_what_changed_since(editor):
    rule = changes.add_rule("since.example.net", category="spam")
    first = ChangeEvent.objects.get(expression="since.example.net/").change_set
    changes.remove_rule(rule)
    changes.add_rule("since.example.net", category="malware")  # listed again, another rule
    plan = revert.plan_revert(first)
    assert (plan.to_remove, plan.unchanged) == (0, 1)


def test_view_only_staff_cannot_revert(viewer, editor, make_staff):
    changes.add_rule("v.example.net", category="spam")
    change_set = ChangeSet.objects.latest("pk")
    page = make_staff("view_changeset", "view_spamrule").get(
        reverse("admin:urlguard_changeset_change", args=[change_set.pk])
    )
    assert page.status_code == 200 and "Revert this change set" not in page.content.decode()
    looker = make_staff("view_changeset", "view_spamrule")
    assert (
        looker.post(reverse("admin:urlguard_changeset_revert", args=[change_set.pk])).status_code
        == 403
    )
    job = jobs.create_revert(change_set, actor=editor.user)
    for method, name in (("get", "revert_job"), ("post", "revert_commit")):
        url = reverse(f"admin:urlguard_changeset_{name}", args=[job.pk])
        assert getattr(looker, method)(url).status_code == 403
    assert (
        looker.get(reverse("admin:urlguard_spamrule_job_status", args=[job.pk])).status_code == 403
    )
    assert SpamRule.objects.count() == 1


def _interrupted_revert(owner: str = "") -> tuple[ChangeSet, ChangeSet]:
    """An import of three rules, and a revert of it that stopped after removing one
    (its change set unfinished, of `owner`)."""
    imported = changes.add_rules(
        ["r1.example.net", "r2.example.net", "r3.example.net"], source="import:list.txt"
    ).change_set
    assert imported is not None
    partial = ChangeSet.objects.create(
        kind="revert", reverts=imported, source=imported.source, finished=None, owner=owner
    )
    changes.withdraw_rules(
        imported.source,
        SpamRule.objects.filter(expression="r1.example.net/"),
        change_set=partial,
    )
    return imported, partial


def test_a_revert_that_was_interrupted_is_finished_by_reverting_again(editor):
    imported, partial = _interrupted_revert()
    plan = revert.plan_revert(imported)
    assert (plan.resumes, plan.to_remove, plan.unchanged) == (partial, 2, 1)
    listing = editor.get(reverse("admin:urlguard_changeset_changelist")).content.decode()
    assert "being reverted by" in listing
    assert "partial (interrupted): running it again finishes it" in listing
    # From the admin: the change set offers the revert again, and it finishes the same set.
    page = editor.get(reverse("admin:urlguard_changeset_change", args=[imported.pk]))
    assert "Revert this change set" in page.content.decode()
    job = _revert(editor, imported)
    assert job.state == "done", job.message
    assert job.result["revert_change_set"] == partial.pk
    partial.refresh_from_db()
    assert (partial.removed, partial.owner) == (3, "") and partial.finished is not None
    assert not SpamRule.objects.exists()
    with pytest.raises(
        revert.RevertError,
        match=re.escape(f"already reverted by Change set #{partial.pk} (revert)"),
    ):
        revert.plan_revert(imported)


def test_a_revert_whose_owner_still_runs_is_refused():
    from urlguard.runtime import ownership

    imported, partial = _interrupted_revert(owner=str(ownership.me()))
    for attempt in (revert.plan_revert, revert.revert_change_set):
        with pytest.raises(
            revert.RevertError,
            match=re.escape(f"is being reverted by Change set #{partial.pk} (revert)"),
        ):
            attempt(imported)
    assert SpamRule.objects.count() == 2


def test_the_revert_command_prints_the_plan_and_its_impact_then_reverts():
    from io import StringIO

    from django.core.management import CommandError, call_command

    imported, partial = _interrupted_revert()
    ShortLink.objects.create(slug="x", destination="https://r2.example.net/page")
    out = StringIO()
    call_command("revert_change_set", str(imported.pk), "--dry-run", stdout=out)
    text = out.getvalue()
    assert f"Change set #{partial.pk} (revert) of it was interrupted after 1 removed" in text
    assert "removes 2 rule(s) and restores 0" in text and "  remove r2.example.net/" in text
    assert "Removing: Would unblock 1 of the 1 short link" in text
    assert "Dry run: nothing was changed." in text and SpamRule.objects.count() == 2
    out = StringIO()
    call_command("revert_change_set", str(imported.pk), "--reason", "bad list", stdout=out)
    assert f"in Change set #{partial.pk} (revert): 3 rule(s) removed" in out.getvalue()
    assert not SpamRule.objects.exists()
    with pytest.raises(CommandError, match="already reverted"):
        call_command("revert_change_set", str(imported.pk))
    with pytest.raises(CommandError, match="there is no change set #999999"):
        call_command("revert_change_set", "999999")


def test_a_failed_revert_job_offers_to_run_it_again(editor):
    imported, _ = _interrupted_revert()
    job = AdminJob.objects.create(
        kind="revert",
        state="failed",
        params={"phase": "commit", "change_set": imported.pk},
        message="The worker stopped; run it again to finish.",
    )
    page = editor.get(reverse("admin:urlguard_changeset_revert_job", args=[job.pk]))
    html = page.content.decode()
    assert "The worker stopped; run it again to finish." in html
    action = reverse("admin:urlguard_changeset_revert", args=[imported.pk])
    assert f'action="{action}"' in html and "Run it again" in html


@pytest.mark.django_db(transaction=True)
def test_a_revert_survives_another_connection_writing_between_its_batches(monkeypatch):
    """On SQLite a cursor left open across the revert's writes made the first write
    after another connection's fail at once ("database is locked"); a heartbeat or a
    node's status report is such a write."""
    import sqlite3

    from django.db import connection

    if connection.vendor != "sqlite":
        pytest.skip("the read snapshot held by an open cursor is SQLite's")
    imported = changes.add_rules(
        [f"busy{i}.example.net" for i in range(6)], source="import:list.txt"
    ).change_set
    monkeypatch.setattr(revert, "BATCH", 2)
    other = sqlite3.connect(connection.settings_dict["NAME"], timeout=5)
    real = changes.withdraw_rules

    def another_writer_first(*args, **kwargs):
        other.execute("UPDATE urlguard_source SET interval = interval + 1")
        other.commit()
        return real(*args, **kwargs)

    monkeypatch.setattr(changes, "withdraw_rules", another_writer_first)
    try:
        done = revert.revert_change_set(imported)
    finally:
        other.close()
    assert done.removed == 6 and not SpamRule.objects.exists()


def test_a_bulk_delete_that_stopped_runs_again_to_the_end_in_one_change_set(editor, monkeypatch):
    rules = [changes.add_rule(f"bulk{i}.example.net", category="spam") for i in range(5)]
    job = jobs.create_delete(SpamRule.objects.filter(pk__in=[r.pk for r in rules]), actor=None)
    monkeypatch.setattr(deletes, "DELETE_CHUNK", 2)
    fail_on_call(monkeypatch, changes, "remove_rules", 2, OSError("the worker's disk went away"))
    jobs.start_delete(AdminJob.objects.get(pk=job.pk), reason="cleanup")
    job.refresh_from_db()
    assert job.state == "failed" and SpamRule.objects.count() == 3
    commit = reverse("admin:urlguard_spamrule_delete_commit", args=[job.pk])
    page = editor.get(reverse("admin:urlguard_spamrule_delete_job", args=[job.pk]))
    assert f'action="{commit}"' in page.content.decode() and "Run it again" in page.content.decode()
    editor.post(commit)
    job.refresh_from_db()
    assert job.state == "done", job.message
    assert not SpamRule.objects.exists()
    (change_set,) = ChangeSet.objects.filter(kind="bulk-delete")
    assert change_set.removed == 5 and change_set.finished is not None
    assert job.result == {**job.result, "removed": 5, "change_set": change_set.pk}


def test_a_change_set_still_being_written_is_not_reverted_yet():
    from urlguard.runtime import ownership

    writing = ChangeSet.objects.create(kind="import", finished=None, owner=str(ownership.me()))
    changes.add_rules(["writing.example.net"], source="import:x", change_set=writing)
    with pytest.raises(revert.RevertError, match="is still being written"):
        revert.plan_revert(writing)
    ChangeSet.objects.filter(pk=writing.pk).update(owner="")  # its writer stopped
    writing.refresh_from_db()
    assert revert.plan_revert(writing).to_remove == 1


# -- the change-set list's undo column ---------------------------------------------------
def _undo_cell(listing: str, change_set: ChangeSet) -> str:
    """The undo column's cell of `change_set`'s row in the change-set list."""
    link = reverse("admin:urlguard_changeset_change", args=[change_set.pk])
    row = re.search(
        rf'<tr>(?:(?!</tr>).)*?<th class="field-number"><a href="{re.escape(link)}".*?</tr>',
        listing,
        re.DOTALL,
    )
    assert row is not None, f"no row for #{change_set.pk}"
    cell = re.search(r'<td class="field-undo">(.*?)</td>', row.group(0), re.DOTALL)
    assert cell is not None
    return cell.group(1)


def test_each_revertable_change_set_has_an_undo_button_to_its_revert_summary(editor):
    ShortLink.objects.create(slug="s", destination="https://imp-one.example.com/x")
    job = _import(editor, b"imp-one.example.com\nimp-two.example.com\n")
    imported = ChangeSet.objects.get(pk=job.result["change_set"])
    listing = editor.get(reverse("admin:urlguard_changeset_changelist")).content.decode()
    cell = _undo_cell(listing, imported)
    action = reverse("admin:urlguard_changeset_revert", args=[imported.pk])
    assert f'formaction="{action}"' in cell and 'formmethod="post"' in cell and "Undo…" in cell
    # The button submits the list's own form, which carries the CSRF token.
    form = listing.index('<form id="changelist-form" method="post"')
    assert form < listing.index(f'formaction="{action}"') < listing.index("</form>", form)
    assert "csrfmiddlewaretoken" in listing[form : listing.index("</form>", form)]
    # What the button posts: the revert's summary, impact first, nothing changed yet.
    start = editor.post(action)
    summary = editor.get(start["Location"]).content.decode()
    assert "Would unblock 1 of the 1 short link" in summary and "Nothing has changed yet" in summary
    assert SpamRule.objects.count() == 2
    done = _revert(editor, imported)
    assert done.state == "done", done.message
    undo = ChangeSet.objects.get(pk=done.result["revert_change_set"])
    listing = editor.get(reverse("admin:urlguard_changeset_changelist")).content.decode()
    # Reverted: says by what, and offers no second undo.
    assert "reverted by" in _undo_cell(listing, imported)
    assert "Undo…" not in _undo_cell(listing, imported)
    # The revert itself may be undone in turn (the rules listed again).
    assert "reverts" in _undo_cell(listing, undo) and "Undo…" in _undo_cell(listing, undo)


def test_a_change_set_that_cannot_be_undone_says_why(editor, make_staff):
    from urlguard.runtime import ownership

    changes.add_rule("v.example.net", category="spam")
    finished = ChangeSet.objects.latest("pk")
    writing = ChangeSet.objects.create(kind="import", finished=None, owner=str(ownership.me()))
    listing = editor.get(reverse("admin:urlguard_changeset_changelist")).content.decode()
    cell = _undo_cell(listing, writing)
    assert "still being written" in cell and "revert it when it is done" in cell
    assert "<button" not in cell
    looker = make_staff("view_changeset", "view_spamrule")
    listing = looker.get(reverse("admin:urlguard_changeset_changelist")).content.decode()
    cell = _undo_cell(listing, finished)
    assert "undo needs the permissions to add and delete spam rules" in cell
    assert "<button" not in cell
