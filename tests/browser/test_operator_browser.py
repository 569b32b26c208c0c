"""The operator's side in a real browser: the confirmation a popular or own host needs,
the impact numbers in the add and import previews against seeded short links, the
layout at 1280 px (columns in sight, verdict whole, the product's title and icon,
formatted times), and host names on the warning page that wrap only between labels.
Screenshots go to tests/artifacts/."""

from __future__ import annotations

import pytest
from playwright.sync_api import Error as PlaywrightError

from tests.browser.conftest import PASSWORD, login
from urlguard.hotpath.guard import reset_guard
from urlguard.models import NodeStatus, ShortLink, SpamRule
from urlguard.nodesync import sync
from urlguard.writepath import changes

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LONG_SOURCE = "import:phishing-feed-2026-11-23-openphish-community-edition.txt"


@pytest.fixture
def site(live_server, django_user_model, filter_path):
    django_user_model.objects.create_superuser("boss", "boss@example.com", PASSWORD)
    for i in range(6):
        ShortLink.objects.create(
            slug=f"form{i}", destination=f"https://docs.google.com/forms/d/{i}/viewform"
        )
    for i in range(3):
        ShortLink.objects.create(
            slug=f"shop{i}",
            destination=f"https://www.cheap-pills-online-pharmacy.example/offer/{i}?utm_campaign=black-friday-{i}",
        )
    sync.rebuild(str(filter_path))
    reset_guard()
    yield live_server.url
    reset_guard()


def _table_fits(page) -> None:
    hidden = page.evaluate(
        "() => { const r = document.querySelector('#changelist .results');"
        " return r.scrollWidth - r.clientWidth; }"
    )
    assert hidden <= 0, f"the change list is {hidden}px too wide"


def test_a_popular_host_needs_a_confirmation_and_the_preview_shows_the_impact(page, site, shot):
    login(page, site)
    page.goto(f"{site}/admin/urlguard/spamrule/add/")
    page.fill("#id_url", "https://docs.google.com/forms/d/3/viewform")
    # Proposed: the one form, not google.com; its impact is one link.
    page.wait_for_selector(
        'input[name="expression"][value="docs.google.com/forms/d/3/viewform"]:checked'
    )
    page.wait_for_selector(".impact-text")
    assert (
        page.inner_text(".impact-text")
        == "Would block 1 short link (0 clicks in the last 30 days)."
    )
    assert page.locator("#confirm-row").is_hidden()
    shot("operator-add-narrow")
    page.check('input[name="expression"][value="google.com/"]')
    page.wait_for_function(
        "document.querySelector('.impact-text') && "
        "document.querySelector('.impact-text').textContent.startsWith('Would block 6 short links')"
    )
    assert page.locator("#confirm-row").is_visible()
    assert "popular site" in page.inner_text("#confirm-reasons")
    shot("operator-add-popular")
    page.click('input[name="_save"]')
    page.wait_for_selector("#confirm-row .errorlist")
    assert not SpamRule.objects.exists()
    shot("operator-add-popular-refused")
    page.check("#id_confirm")
    page.click('input[name="_save"]')
    page.wait_for_selector(".messagelist .success")
    assert SpamRule.objects.filter(expression="google.com/").exists()


def test_own_host_needs_a_confirmation(page, site, shot, settings):
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "go.short.example"]
    login(page, site)
    page.goto(f"{site}/admin/urlguard/spamrule/add/")
    page.fill("#id_url", "https://go.short.example/abc")
    page.wait_for_selector('input[name="expression"][value="go.short.example/"]:checked')
    page.wait_for_selector("#confirm-reasons li[data-code=own-host]")
    assert "this service's own host" in page.inner_text("#confirm-reasons")
    shot("operator-add-own-host")
    page.click('input[name="_save"]')
    page.wait_for_selector("#confirm-row .errorlist")
    assert not SpamRule.objects.exists()


def test_import_preview_shows_the_impact(page, site, shot, tmp_path):
    changes.add_rule("www.cheap-pills-online-pharmacy.example/offer/", category="spam")
    feed = tmp_path / "feed.txt"
    feed.write_text(
        "cheap-pills-online-pharmacy.example\nforms-spam.example.org\nbad_host!.example\n"
    )
    login(page, site)
    page.goto(f"{site}/admin/urlguard/spamrule/import/")
    page.set_input_files("#id_file", str(feed))
    page.click('input[type="submit"]')
    page.wait_for_selector(".impact-text")
    assert page.inner_text(".impact-text") == (
        "Would block 3 short links (0 clicks in the last 30 days); "
        "3 of them already blocked by another rule."
    )
    assert page.locator(".impact-other").count() == 3
    assert page.locator("#download-refused").is_visible()
    shot("operator-import-impact")


def test_layout_at_1280(page, site, shot):
    changes.add_rules(
        [
            f"paypal.com.login.secure-verify{i}.account-update-center.example{i}.com/signin/verify/index.php?session=abcdef{i}"
            for i in range(30)
        ],
        source=LONG_SOURCE,
        category="phishing",
    )
    changes.add_rule("cheap-pills-online-pharmacy.example/", category="spam")
    NodeStatus.objects.create(
        node="node-a", filter_path="/x", applied_seq=1, last_rebuild_seconds=0.009877661000246007
    )
    login(page, site)
    assert "URL guard" in page.title() and "Django" not in page.content()
    icon = page.get_attribute('link[rel="icon"]', "href")
    assert icon and page.request.get(f"{site}{icon}").status == 200
    assert page.request.get(f"{site}/favicon.ico").status == 200
    for path, name in [
        ("/admin/urlguard/spamrule/", "operator-rules-1280"),
        ("/admin/urlguard/shortlink/", "operator-links-1280"),
        ("/admin/urlguard/changeevent/", "operator-changelog-1280"),
    ]:
        page.goto(f"{site}{path}")
        _table_fits(page)
        shot(name)
    # The verdict is whole: the rule's expression, not cut mid-word.
    page.goto(f"{site}/admin/urlguard/shortlink/?q=shop0")
    verdict = page.inner_text("td.field-verdict")
    assert "blocked (Spam)" in verdict and "cheap-pills-online-pharmacy.example/" in verdict
    page.goto(f"{site}/admin/urlguard/nodestatus/")
    assert page.inner_text("td.field-rebuild_took") == "9.9 ms"
    rule = SpamRule.objects.get(expression="cheap-pills-online-pharmacy.example/")
    page.goto(f"{site}/admin/urlguard/spamrule/{rule.pk}/change/")
    added = page.inner_text(".field-added_at_text .readonly")
    assert added.startswith(f"{rule.created:%Y-%m-%d}") and "UTC" in added
    shot("operator-rule-change")


def test_warning_page_host_wraps_only_between_labels(page, site, shot):
    changes.add_rule("cheap-pills-online-pharmacy.example/", category="spam")
    page.set_viewport_size({"width": 320, "height": 800})
    page.goto(f"{site}/shop1")
    host = page.locator(".lead .host").first
    assert host.inner_text() == "www.cheap-pills-online-pharmacy.example"
    # Each label stays on one line (one line box per label).
    heights = page.evaluate(
        "() => [...document.querySelectorAll('.lead .host .label')].map("
        "s => s.getClientRects().length)"
    )
    assert heights and all(n == 1 for n in heights)
    shot("operator-warning-narrow")


@pytest.fixture
def threaded_jobs(monkeypatch):
    """Jobs on the runner thread as in the embedded default (the browser run's test
    database is a file, so the thread opens a connection of its own)."""
    from urlguard.jobs import dispatch, imports

    assert not dispatch._memory_database()
    runner = dispatch._Runner()
    monkeypatch.setattr(dispatch, "runner", runner)
    monkeypatch.setattr(dispatch, "PROGRESS_EVERY_SECONDS", 0.0)
    monkeypatch.setattr(imports, "IMPORT_CHUNK", 200)
    yield runner
    runner.join()


def test_a_big_import_runs_as_a_job_with_progress(page, site, shot, tmp_path, threaded_jobs):
    feed = tmp_path / "big.txt"
    feed.write_text("".join(f"bulk-{i}.spam-feed.example\n" for i in range(12_000)))
    login(page, site)
    page.goto(f"{site}/admin/urlguard/spamrule/import/")
    page.set_input_files("#id_file", str(feed))
    page.click('input[type="submit"]')
    # The upload returns at once; the dry run reports its progress, then its result.
    page.wait_for_selector(".count-new", timeout=90_000)
    assert page.inner_text(".count-new") == "12,000"
    page.click('input[type="submit"][value^="Commit"]')
    page.wait_for_selector(".job-progress progress")
    values = set()
    for _ in range(600):
        if page.locator(".import-done").count():
            break
        # Read without waiting: the page may swap the bar for the result between a
        # check that it is there and a read that would then wait for it.
        try:
            texts = page.locator(".job-progress-text").all_inner_texts()
        except PlaywrightError as error:
            # The progress page reloads itself: a read may meet the page between two loads.
            if "context was destroyed" not in str(error):
                raise
            texts = []
        if texts:
            values.add(texts[0])
            if len(values) == 2:
                shot("operator-import-progress")
        page.wait_for_timeout(100)
    page.wait_for_selector(".import-done", timeout=120_000)
    assert "Added 12,000 rules" in page.inner_text(".import-done")
    assert len(values) >= 2, values  # the bar moved while the job ran
    shot("operator-import-job-done")
    assert SpamRule.objects.count() == 12_000


def test_report_form_queue_and_remove(page, site, shot, filter_path):
    changes.add_rule("docs.google.com/forms/", category="phishing")
    sync.rebuild(str(filter_path))
    reset_guard()
    page.goto(f"{site}/form2")
    page.click("text=Report a mistake")
    page.wait_for_selector(".report-form")
    shot("operator-report-form")
    page.fill("#id_email", "owner@example.org")
    page.fill("#id_comment", "This is our customer survey.")
    page.click("button[type=submit]")
    page.wait_for_selector("#report-sent")
    shot("operator-report-sent")
    login(page, site)
    page.goto(f"{site}/admin/urlguard/mistakereport/")
    row = page.locator("#result_list tbody tr").first
    assert "docs.google.com/forms/d/2/viewform" in row.inner_text()
    assert "docs.google.com/forms/" in row.locator("td.field-blocked_by").inner_text()
    _table_fits(page)
    shot("operator-report-queue")
    row.locator("a.report-remove").click()
    page.wait_for_selector("#report-remove .impact-text")
    shot("operator-report-remove-confirm")
    page.click("#confirm-remove")
    page.wait_for_selector(".messagelist .success")
    assert "Removed the rule docs.google.com/forms/" in page.inner_text(".messagelist")
    assert "Would unblock 6 of the 6 short links" in page.inner_text(".messagelist")
    assert not SpamRule.objects.exists()
    assert "Rule removed" in page.inner_text("#result_list")
    shot("operator-report-removed")


def _revert_from_change_set(page, site, change_set_id: int) -> None:
    page.goto(f"{site}/admin/urlguard/changeset/{change_set_id}/change/")
    page.click("text=Revert this change set")
    page.wait_for_selector("#revert-summary")
    page.fill("#id_reason", "undo from the browser")
    page.click('input[value="Yes, revert it"]')
    page.wait_for_selector(".revert-done", timeout=60_000)


def test_revert_an_import(page, site, shot, tmp_path):
    from urlguard.models import ChangeSet

    feed = tmp_path / "feed.txt"
    feed.write_text("docs.google.com/forms/d/1/\nrevert-me.example.net\n")
    login(page, site)
    page.goto(f"{site}/admin/urlguard/spamrule/import/")
    page.set_input_files("#id_file", str(feed))
    page.click('input[type="submit"]')
    page.click('input[type="submit"][value^="Commit"]')
    page.wait_for_selector(".import-done")
    assert SpamRule.objects.count() == 2
    change_set = ChangeSet.objects.get(kind="import")
    page.goto(f"{site}/admin/urlguard/changeset/")
    assert "+2 added" in page.inner_text("#result_list")
    _table_fits(page)
    shot("operator-change-sets")
    page.goto(f"{site}/admin/urlguard/changeset/{change_set.pk}/change/")
    page.click("text=Revert this change set")
    page.wait_for_selector("#revert-summary .impact-text")
    assert "Would unblock 1 of the 1 short link" in page.inner_text("#revert-summary")
    shot("operator-revert-import-summary")
    page.click('input[value="Yes, revert it"]')
    page.wait_for_selector(".revert-done", timeout=60_000)
    assert "2 rules removed" in page.inner_text(".revert-done")
    shot("operator-revert-import-done")
    assert not SpamRule.objects.exists()


def test_undo_from_the_change_set_list_shows_the_impact_first(page, site, shot):
    from urlguard.models import ChangeSet

    imported = changes.add_rules(
        ["docs.google.com/forms/d/1/", "undo-me.example.net"], source="import:list.txt"
    ).change_set
    assert imported is not None
    login(page, site)
    page.goto(f"{site}/admin/urlguard/changeset/")
    _table_fits(page)
    number = page.locator(f'th.field-number a[href$="/changeset/{imported.pk}/change/"]')
    row = page.locator("#result_list tbody tr", has=number)
    undo = row.locator("button.changeset-undo")
    assert undo.inner_text() == "Undo…" and undo.is_visible()
    shot("operator-change-sets-undo")
    undo.click()
    page.wait_for_selector("#revert-summary .impact-text")
    assert "Would unblock 1 of the 1 short link" in page.inner_text("#revert-summary")
    assert SpamRule.objects.count() == 2  # nothing changed before the confirmation
    page.click('input[value="Yes, revert it"]')
    page.wait_for_selector(".revert-done", timeout=60_000)
    assert not SpamRule.objects.exists()
    page.goto(f"{site}/admin/urlguard/changeset/")
    assert row.locator("td.field-undo").inner_text().startswith("reverted by #")
    assert row.locator("button.changeset-undo").count() == 0
    assert ChangeSet.objects.filter(reverts=imported, finished__isnull=False).exists()


def test_revert_a_bulk_delete(page, site, shot):
    changes.add_rule("bulk-a.example.net", category="phishing", note="from a CERT report")
    changes.add_rule("bulk-b.example.net", category="malware")
    login(page, site)
    page.goto(f"{site}/admin/urlguard/spamrule/")
    page.check("#action-toggle")
    page.select_option('select[name="action"]', "delete_selected_rules")
    page.click('button[name="index"]')
    # The summary is a job on the runner thread; the page shows it when it is done.
    page.wait_for_selector("#delete-summary h2:has-text('Delete 2 rules?')")
    assert "Delete 2 rules?" in page.inner_text("#delete-summary")
    shot("operator-bulk-delete-summary")
    page.fill("#id_reason", "cleaning up")
    page.click('input[type="submit"][value^="Yes, delete"]')
    page.wait_for_selector(".delete-done")
    assert not SpamRule.objects.exists()
    from urlguard.models import ChangeSet

    change_set = ChangeSet.objects.get(kind="bulk-delete")
    _revert_from_change_set(page, site, change_set.pk)
    shot("operator-revert-delete-done")
    back = {r.expression: (r.category, r.note) for r in SpamRule.objects.all()}
    assert back == {
        "bulk-a.example.net/": ("phishing", "from a CERT report"),
        "bulk-b.example.net/": ("malware", ""),
    }


def test_hit_columns_and_the_week_panel(page, site, shot, filter_path):
    from urlguard.runtime import stats

    changes.add_rule("cheap-pills-online-pharmacy.example/", category="spam")
    changes.add_rule("quiet-rule.example/", category="spam")
    sync.rebuild(str(filter_path))
    reset_guard()
    for slug in ("shop0", "shop1", "shop2", "shop0"):
        page.goto(f"{site}/{slug}")
    page.click("summary")
    page.click("text=continue anyway")
    stats.flush()
    login(page, site)
    page.goto(f"{site}/admin/urlguard/spamrule/?o=-6")  # most hits first
    first = page.locator("#result_list tbody tr").first
    assert "cheap-pills-online-pharmacy.example/" in first.inner_text()
    assert first.locator("td.field-hits").inner_text() == "4"
    assert first.locator("td.field-continued").inner_text() == "1"
    assert first.locator("td.field-last_hit").inner_text() != "never"
    _table_fits(page)
    shot("operator-hit-columns")
    page.goto(f"{site}/admin/urlguard/spamrule/dashboard/")
    assert "cheap-pills-online-pharmacy.example/" in page.inner_text("#top-rules")
    assert "www.cheap-pills-online-pharmacy.example" in page.inner_text("#top-hosts")
    assert page.locator("svg.hits-chart rect.day-bar").count() == 7
    shot("operator-dashboard-hits")
    assert ShortLink.objects.get(slug="shop0").click_count == 0  # warnings are not clicks


def test_a_revert_whose_worker_died_is_failed_on_its_page_and_runs_again(page, site, shot):
    """The revert's runner was killed: its page, polling, learns the job failed, says
    so, and "Run it again" finishes the revert in the interrupted revert's change set."""
    import subprocess
    import sys

    from urlguard.models import AdminJob, ChangeSet
    from urlguard.runtime import ownership

    imported = changes.add_rules(
        ["died-a.example.net", "died-b.example.net", "died-c.example.net"],
        source="import:list.txt",
    ).change_set
    assert imported is not None
    pid = int(
        subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
        ).stdout
    )
    dead = f"{ownership.this_host()}:{pid}:1"
    partial = ChangeSet.objects.create(
        kind="revert", reverts=imported, source=imported.source, finished=None, owner=dead
    )
    changes.withdraw_rules(
        imported.source,
        SpamRule.objects.filter(expression="died-a.example.net/"),
        change_set=partial,
    )
    job = AdminJob.objects.create(
        kind="revert",
        state="running",
        owner=dead,
        params={"phase": "commit", "change_set": imported.pk},
        total=3,
        done=1,
    )
    login(page, site)
    page.goto(f"{site}/admin/urlguard/changeset/revert/{job.pk}/")
    page.wait_for_selector("p.errornote", timeout=30_000)
    assert "The worker stopped; run it again to finish." in page.inner_text("p.errornote")
    shot("operator-revert-worker-died")
    page.click('input[value^="Run it again"]')
    page.wait_for_selector("#revert-summary .revert-counts")
    assert "2" in page.inner_text("#revert-summary .count-remove")
    page.click('input[value="Yes, revert it"]')
    page.wait_for_selector(".revert-done", timeout=60_000)
    assert not SpamRule.objects.exists()
    partial.refresh_from_db()
    assert partial.finished is not None and partial.removed == 3
