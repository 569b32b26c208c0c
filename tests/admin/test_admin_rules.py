"""SpamRule admin: change list, the add form (paste, pick a level, preview, save),
the live-preview endpoint, editing, deleting (single and bulk) and permissions.
Every write must leave a ChangeEvent."""

from __future__ import annotations

import pytest
from django.urls import reverse

from urlguard.hotpath.guard import get_guard
from urlguard.models import ChangeEvent, SpamRule
from urlguard.writepath import changes
from urlguard.writepath.rules import rule_candidates

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_guard")]

ADD = reverse("admin:urlguard_spamrule_add")
PREVIEW = reverse("admin:urlguard_spamrule_preview")
CHANGELIST = reverse("admin:urlguard_spamrule_changelist")
PASTED = "  https://WWW.Evil-Example.com/promo/win.html?id=7#top "


def _domain(text: str) -> str:
    return next(c.expression for c in rule_candidates(text) if c.level == "domain")


def test_changelist_columns_search_and_filters(editor):
    changes.add_rule("evil-example.com/", category="phishing", actor=editor.user)
    changes.add_rule("other.org/path/", category="spam", source="feed")
    page = editor.get(CHANGELIST)
    assert page.status_code == 200
    html = page.content.decode()
    for text in (
        "evil-example.com/",
        "domain",
        "Phishing",
        "other.org/path/",
        "path",
        editor.user.username,
        "Import",
        "Check a URL",
        "Filter dashboard",
    ):
        assert text in html
    found = editor.get(CHANGELIST, {"q": "evil"}).content.decode()
    assert "evil-example.com/" in found and "other.org/path/" not in found
    # A pasted URL finds the rule that blocks it, though no expression contains it.
    found = editor.get(CHANGELIST, {"q": "http://a.b.evil-example.com/x?y=1"}).content.decode()
    assert "evil-example.com/" in found and "other.org/path/" not in found
    filtered = editor.get(CHANGELIST, {"source": "feed"}).content.decode()
    assert "other.org/path/" in filtered and "evil-example.com/" not in filtered
    filtered = editor.get(CHANGELIST, {"category": "phishing"}).content.decode()
    assert "evil-example.com/" in filtered and "other.org/path/" not in filtered


def test_add_page_get_shows_the_form(editor):
    page = editor.get(ADD, {"url": PASTED.strip()})
    assert page.status_code == 200
    html = page.content.decode()
    assert 'name="url"' in html and "rule_preview.js" in html
    # With ?url= the preview is there on first load.
    assert _domain(PASTED) in html


def test_preview_without_javascript_lists_every_level_and_saves_nothing(editor):
    page = editor.post(ADD, {"url": PASTED, "category": "spam", "_preview": "Preview"})
    assert page.status_code == 200
    html = page.content.decode()
    candidates = rule_candidates(PASTED)
    assert {c.level for c in candidates} >= {"domain", "page"}
    for candidate in candidates:
        assert f'value="{candidate.expression}"' in html
    # The narrowest level that covers the pasted URL is proposed (its host; for www.
    # before a registrable domain, that domain), and its preview sorts the samples.
    assert page.context["preview"]["expression"] == "evil-example.com/"
    assert "Would block" in html and "Would not block" in html
    assert "http://evil-example.com.example.net/" in html  # a look-alike, not blocked
    assert not SpamRule.objects.exists() and not ChangeEvent.objects.exists()


def test_save_adds_the_chosen_level_through_the_change_log(editor, committed, filter_path):
    expression = _domain(PASTED)
    with committed():
        response = editor.post(
            ADD,
            {
                "url": PASTED,
                "expression": expression,
                "category": "phishing",
                "note": "from a report",
                "_save": "Save",
            },
        )
    assert response.status_code == 302 and response["Location"] == CHANGELIST
    rule = SpamRule.objects.get()
    assert (rule.expression, rule.category, rule.note, rule.added_by) == (
        expression,
        "phishing",
        "from a report",
        editor.user,
    )
    event = ChangeEvent.objects.get()
    assert (event.action, event.expression, event.actor) == ("add", expression, editor.user)
    # The nudge ran on commit (in-process Celery): the guard blocks the whole domain now.
    assert get_guard().check("http://deep.www.evil-example.com/anything").blocked


def test_save_and_add_another_returns_to_the_form(editor):
    response = editor.post(
        ADD,
        {
            "url": "spam.example.net",
            "expression": "spam.example.net/",
            "category": "spam",
            "_addanother": "1",
        },
    )
    assert response.status_code == 302 and response["Location"] == ADD
    assert SpamRule.objects.filter(expression="spam.example.net/").exists()


@pytest.mark.parametrize("pasted", ["com", "co.uk", "https://github.io/"])
def test_public_suffix_is_refused_with_a_form_error(editor, pasted):
    page = editor.post(ADD, {"url": pasted, "category": "spam", "_save": "Save"})
    assert page.status_code == 200
    errors = page.context["form"].errors
    assert "would block every site under it" in " ".join(errors["url"])
    assert not SpamRule.objects.exists() and not ChangeEvent.objects.exists()


@pytest.mark.parametrize("pasted", ["", "javascript:alert(1)", "http://"])
def test_unusable_input_is_a_form_error(editor, pasted):
    page = editor.post(ADD, {"url": pasted, "category": "spam", "_save": "Save"})
    assert page.status_code == 200 and page.context["form"].errors.get("url")
    assert not SpamRule.objects.exists()


def test_saving_without_choosing_a_level_asks_for_one(editor):
    page = editor.post(ADD, {"url": PASTED, "category": "spam", "_save": "Save"})
    assert "Pick what to block" in " ".join(page.context["form"].errors["expression"])
    assert not SpamRule.objects.exists()


def test_an_expression_not_offered_for_the_url_is_refused(editor):
    page = editor.post(
        ADD, {"url": PASTED, "expression": "innocent.org/", "category": "spam", "_save": "Save"}
    )
    assert page.context["form"].errors["expression"]
    assert not SpamRule.objects.exists()


def test_duplicate_is_a_form_error_naming_the_existing_rule(editor):
    changes.add_rule("evil-example.com/", category="malware")
    page = editor.post(
        ADD, {"url": PASTED, "expression": "evil-example.com/", "category": "spam", "_save": "Save"}
    )
    message = " ".join(page.context["form"].errors["expression"])
    assert "already blocked" in message and "Malware" in message
    assert SpamRule.objects.count() == 1 and ChangeEvent.objects.count() == 1


def test_preview_endpoint_json(editor):
    expression = _domain(PASTED)
    data = editor.get(
        PREVIEW,
        {
            "url": PASTED,
            "expression": expression,
            "sample": ["https://evil-example.com/other", "https://fine.org/"],
        },
    ).json()
    assert data["error"] is None and data["expression"] == expression
    assert [c["expression"] for c in data["candidates"]] == [
        c.expression for c in rule_candidates(PASTED)
    ]
    verdicts = {s["url"]: s["blocked"] for s in data["samples"]}
    assert verdicts["https://evil-example.com/other"] is True
    assert verdicts["https://fine.org/"] is False
    assert verdicts["http://evil-example.com.example.net/"] is False
    assert any(verdicts.values()) and not all(verdicts.values())


def test_preview_endpoint_for_a_page_rule_keeps_the_rest_of_the_site(editor):
    page_rule = next(c.expression for c in rule_candidates(PASTED) if c.level == "page")
    data = editor.get(PREVIEW, {"url": PASTED, "expression": page_rule}).json()
    verdicts = {s["url"]: s["blocked"] for s in data["samples"]}
    host = page_rule.split("/", 1)[0]
    assert verdicts[f"https://{host}/"] is False
    assert verdicts[f"http://{page_rule}"] is True


def test_preview_endpoint_reports_existing_cover_and_errors(editor):
    changes.add_rule("evil-example.com/", category="spam")
    data = editor.get(PREVIEW, {"url": PASTED}).json()
    assert [r["expression"] for r in data["existing"]] == ["evil-example.com/"]
    bad = editor.get(PREVIEW, {"url": "co.uk"})
    assert bad.status_code == 400 and "public suffix" in bad.json()["error"].lower()


def test_preview_endpoint_needs_add_permission(viewer, client):
    assert viewer.get(PREVIEW, {"url": PASTED}).status_code == 403
    anonymous = client.get(PREVIEW, {"url": PASTED})
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]


def test_view_permission_alone_cannot_add_change_or_delete(viewer):
    rule = changes.add_rule("evil-example.com/", category="spam")
    assert viewer.get(CHANGELIST).status_code == 200
    assert viewer.get(ADD).status_code == 403
    assert (
        viewer.post(ADD, {"url": "x.org", "expression": "x.org/", "category": "spam"}).status_code
        == 403
    )
    change_url = reverse("admin:urlguard_spamrule_change", args=[rule.pk])
    page = viewer.get(change_url)
    assert page.status_code == 200 and 'name="category"' not in page.content.decode()
    assert viewer.post(change_url, {"category": "malware", "note": "x"}).status_code == 403
    delete_url = reverse("admin:urlguard_spamrule_delete", args=[rule.pk])
    assert viewer.post(delete_url, {"post": "yes"}).status_code == 403
    assert SpamRule.objects.get().category == "spam"


def test_no_staff_no_admin(make_staff, django_user_model, client):
    user = django_user_model.objects.create_user("nostaff", password=None)
    client.force_login(user)
    assert client.get(CHANGELIST).status_code == 302


def test_change_edits_category_and_note_only(editor):
    rule = changes.add_rule("evil-example.com/", category="spam")
    change_url = reverse("admin:urlguard_spamrule_change", args=[rule.pk])
    page = editor.get(change_url).content.decode()
    assert 'name="category"' in page and 'name="expression"' not in page
    response = editor.post(
        change_url, {"category": "malware", "note": "confirmed", "expression": "innocent.org/"}
    )
    assert response.status_code == 302
    rule.refresh_from_db()
    assert (rule.expression, rule.category, rule.note) == (
        "evil-example.com/",
        "malware",
        "confirmed",
    )
    assert ChangeEvent.objects.count() == 1  # the add only: the filter is unaffected


def test_delete_goes_through_the_change_log(editor, committed, filter_path):
    with committed():
        rule = changes.add_rule("evil-example.com/", category="spam")
    assert get_guard().check("http://evil-example.com/").blocked
    delete_url = reverse("admin:urlguard_spamrule_delete", args=[rule.pk])
    assert "evil-example.com/" in editor.get(delete_url).content.decode()
    with committed():
        assert editor.post(delete_url, {"post": "yes"}).status_code == 302
    assert not SpamRule.objects.exists()
    removal = ChangeEvent.objects.get(action="remove")
    assert (removal.expression, removal.added_at, removal.actor) == (
        "evil-example.com/",
        rule.added_at,
        editor.user,
    )
    assert not get_guard().check("http://evil-example.com/").blocked


def test_bulk_delete_action_records_every_removal(editor):
    rules = [changes.add_rule(f"spam{i}.example.net/", category="spam") for i in range(3)]
    keep = changes.add_rule("keep.example.net/", category="spam")
    data = {"action": "delete_selected_rules", "_selected_action": [r.pk for r in rules]}
    # The action opens a summary (counts, a sample, the impact), not Django's page of
    # every object; nothing is removed yet.
    summary = editor.post(CHANGELIST, data, follow=True)
    assert summary.status_code == 200
    html = summary.content.decode()
    assert "Delete 3 rules?" in html and "spam0.example.net/" in html
    assert "Would unblock 0 of the 0 short links" in html
    assert SpamRule.objects.count() == 4
    job = summary.context["job"]
    done = editor.post(
        reverse("admin:urlguard_spamrule_delete_commit", args=[job.pk]), {"reason": "false alarm"}
    )
    assert done.status_code == 302
    assert list(SpamRule.objects.values_list("pk", flat=True)) == [keep.pk]
    removed = ChangeEvent.objects.filter(action="remove")
    assert sorted(removed.values_list("expression", flat=True)) == sorted(
        r.expression for r in rules
    )
    assert set(removed.values_list("actor", flat=True)) == {editor.user.pk}
    job.refresh_from_db()
    assert (job.state, job.result["removed"], job.params["reason"]) == ("done", 3, "false alarm")
    # A second click changes nothing.
    editor.post(reverse("admin:urlguard_spamrule_delete_commit", args=[job.pk]))
    assert ChangeEvent.objects.filter(action="remove").count() == 3


def test_djangos_delete_selected_is_not_offered(editor):
    changes.add_rule("spam.example.net/", category="spam")
    page = editor.get(CHANGELIST)
    choices = [value for value, _ in page.context["action_form"].fields["action"].choices]
    assert "delete_selected_rules" in choices and "delete_selected" not in choices


def test_single_delete_confirmation_shows_the_impact(editor):
    from urlguard.models import ShortLink

    rule = changes.add_rule("evil-example.com/", category="spam")
    changes.add_rule("www.evil-example.com/", category="spam")
    ShortLink.objects.create(slug="e1", destination="https://www.evil-example.com/x")
    page = editor.get(reverse("admin:urlguard_spamrule_delete", args=[rule.pk]))
    html = page.content.decode()
    assert (
        "Would unblock 0 of the 1 short link" in html and "1 stay blocked by another rule" in html
    )
    assert "still blocked by" in html and "www.evil-example.com/" in html


def test_admin_index_links_the_tools(superuser):
    html = superuser.get(reverse("admin:index")).content.decode()
    for name in ("add", "import", "check", "dashboard"):
        assert reverse(f"admin:urlguard_spamrule_{name}") in html
    assert reverse("admin:urlguard_shortlink_rescan") in html


def test_add_only_staff_lands_on_the_index(make_staff):
    adder = make_staff("add_spamrule")
    response = adder.post(
        ADD,
        {
            "url": "adder.example.com",
            "expression": "adder.example.com/",
            "category": "spam",
            "_save": "Save",
        },
    )
    assert response.status_code == 302 and response["Location"] == reverse("admin:index")
    assert SpamRule.objects.filter(expression="adder.example.com/").exists()


def test_form_errors_say_what_to_do(editor):
    empty = editor.post(ADD, {"url": "", "category": "spam", "_save": "Save"})
    assert empty.context["form"].errors["url"] == [
        "Paste the spam URL, a host or an expression to block."
    ]
    # A 3,000-letter paste is not echoed whole (twice) in the message.
    long = editor.post(ADD, {"url": "a" * 3000, "category": "spam", "_save": "Save"})
    [message] = long.context["form"].errors["url"]
    assert len(message) <= 400 and "would block every site under it" in message
