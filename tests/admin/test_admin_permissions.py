"""Every page the urlguard admin adds, as each kind of visitor: anonymous (to the
login page), staff without urlguard permissions and staff who may only view rules
(403 for whatever they may not do, nothing written), CSRF on every POST, and
malformed ids in query strings and forms (never a traceback page)."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from urlguard import jobs
from urlguard.models import AdminJob, ChangeEvent, NodeStatus, ShortLink, SpamRule
from urlguard.writepath import changes

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_guard")]


@pytest.fixture
def world(db):
    """A rule, a link, a previewed import and a finished rescan, so that every page
    has something to show (and something a forbidden request could change)."""
    rule = changes.add_rule("perm-spam.example.com", category="spam")
    link = ShortLink.objects.create(slug="p1", destination="https://perm-spam.example.com/x")
    imported = jobs.preview_import(
        "new-one.example.org\n", default_category="spam", filename="f.txt", actor=None
    )
    rescan = AdminJob.objects.create(
        kind=AdminJob.Kind.RESCAN,
        state=AdminJob.State.DONE,
        result={
            "hits": [
                {
                    "link_id": link.pk,
                    "slug": "p1",
                    "destination": link.destination,
                    "expression": rule.expression,
                    "category": "spam",
                    "disabled": False,
                }
            ]
        },
    )
    deleting = jobs.create_delete([rule.pk], actor=None)
    return {"rule": rule, "link": link, "import": imported, "rescan": rescan, "delete": deleting}


def _pages(world) -> list[tuple[str, str, dict]]:
    """(method, url, data) for every view the urlguard admin adds."""
    imp, rescan, link = world["import"].pk, world["rescan"].pk, world["link"].pk
    deleting = world["delete"].pk
    return [
        ("get", reverse("admin:urlguard_spamrule_import_refused", args=[imp]), {}),
        ("get", reverse("admin:urlguard_spamrule_delete_job", args=[deleting]), {}),
        ("post", reverse("admin:urlguard_spamrule_delete_commit", args=[deleting]), {}),
        ("get", reverse("admin:urlguard_spamrule_job_status", args=[deleting]), {}),
        ("get", reverse("admin:urlguard_spamrule_add"), {}),
        (
            "post",
            reverse("admin:urlguard_spamrule_add"),
            {
                "url": "x.example.org",
                "expression": "x.example.org/",
                "category": "spam",
                "_save": "Save",
            },
        ),
        ("get", reverse("admin:urlguard_spamrule_preview"), {"url": "x.example.org"}),
        ("get", reverse("admin:urlguard_spamrule_import"), {}),
        ("get", reverse("admin:urlguard_spamrule_import_job", args=[imp]), {}),
        ("post", reverse("admin:urlguard_spamrule_import_commit", args=[imp]), {}),
        ("get", reverse("admin:urlguard_spamrule_job_status", args=[imp]), {}),
        ("get", reverse("admin:urlguard_spamrule_check"), {"url": "http://x.example.org/"}),
        ("get", reverse("admin:urlguard_spamrule_dashboard"), {}),
        ("get", reverse("admin:urlguard_spamrule_dashboard_status"), {}),
        ("post", reverse("admin:urlguard_spamrule_dashboard_sync"), {}),
        ("post", reverse("admin:urlguard_spamrule_dashboard_rebuild"), {}),
        ("get", reverse("admin:urlguard_shortlink_rescan"), {}),
        ("post", reverse("admin:urlguard_shortlink_rescan"), {}),
        (
            "post",
            reverse("admin:urlguard_shortlink_rescan_disable"),
            {"job": rescan, "link": [link]},
        ),
    ]


def _nothing_changed(world) -> None:
    assert list(SpamRule.objects.values_list("expression", flat=True)) == [world["rule"].expression]
    assert ChangeEvent.objects.count() == 1
    assert AdminJob.objects.count() == 3
    assert not NodeStatus.objects.exists()  # no sync or rebuild ran
    assert not ShortLink.objects.get().disabled


def test_anonymous_visitors_are_sent_to_the_login_page(client, world):
    for method, url, data in _pages(world):
        response = getattr(client, method)(url, data)
        assert response.status_code == 302, (method, url)
        assert response["Location"].startswith(reverse("admin:login")), (method, url)
    _nothing_changed(world)


def test_staff_without_urlguard_permissions_get_403_everywhere(make_staff, world):
    nobody = make_staff()
    for method, url, data in _pages(world):
        assert getattr(nobody, method)(url, data).status_code == 403, (method, url)
    _nothing_changed(world)


def test_view_only_staff_may_look_but_not_write(viewer, world):
    may_see = {
        reverse("admin:urlguard_spamrule_check"),
        reverse("admin:urlguard_spamrule_dashboard"),
        reverse("admin:urlguard_spamrule_dashboard_status"),
    }
    for method, url, data in _pages(world):
        expected = 200 if (method, url) in {("get", u) for u in may_see} else 403
        assert getattr(viewer, method)(url, data).status_code == expected, (method, url)
    _nothing_changed(world)
    page = viewer.get(reverse("admin:urlguard_spamrule_dashboard")).content.decode()
    assert 'name="sync"' not in page and 'name="rebuild"' not in page
    assert "Syncing needs permission" in page


def test_sync_is_for_those_who_may_change_the_rules(make_staff, world):
    adder = make_staff("add_spamrule")
    assert adder.post(reverse("admin:urlguard_spamrule_dashboard_sync")).status_code == 302
    rebuilder = make_staff("rebuild_filter")
    assert rebuilder.post(reverse("admin:urlguard_spamrule_dashboard_sync")).status_code == 302


def test_the_index_offers_only_the_tools_a_user_may_open(make_staff):
    links_only = make_staff("view_shortlink")
    html = links_only.get(reverse("admin:index")).content.decode()
    assert reverse("admin:urlguard_shortlink_rescan") in html
    for name in ("add", "import", "check", "dashboard"):
        assert reverse(f"admin:urlguard_spamrule_{name}") not in html


def test_every_post_needs_the_csrf_token(superuser, world):
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(superuser.user)
    posts = [(url, data) for method, url, data in _pages(world) if method == "post"]
    posts.append(
        (
            reverse("admin:urlguard_spamrule_changelist"),
            {"action": "delete_selected_rules", "_selected_action": [world["rule"].pk]},
        )
    )
    for url, data in posts:
        response = strict.post(url, data)
        assert response.status_code == 403 and b"CSRF" in response.content, url
    _nothing_changed(world)


@pytest.mark.parametrize("job", ["\u00b2", "99999999999999999999999", "-1", "abc", ""])
def test_malformed_job_ids_never_make_a_traceback(superuser, world, job):
    rescan = reverse("admin:urlguard_shortlink_rescan")
    page = superuser.get(rescan, {"job": job})
    assert page.status_code == 200
    assert page.context["job"] == world["rescan"]  # falls back to the latest rescan
    response = superuser.post(
        reverse("admin:urlguard_shortlink_rescan_disable"),
        {"job": job, "link": [job, "\u0663"]},
        follow=True,
    )
    assert response.status_code == 200
    assert "Select the links to disable first" in response.content.decode()
    assert not ShortLink.objects.get().disabled
