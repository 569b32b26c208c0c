"""The sources admin (health, add/edit, refresh now with its job page, accepting a
held shrink, history, allowlisted hosts), a rule's sources on its page and as a list
filter, the dashboard's feed panel, and the allowlist warning on a rule added by hand."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.service.feedserver import admit_loopback, feed_server
from urlguard import changes
from urlguard.models import AdminJob, AllowedHost, Source, SpamRule

pytestmark = pytest.mark.django_db

SOURCE_EDITOR = ("view_source", "change_source", "add_source", "view_spamrule")


@pytest.fixture(autouse=True)
def _quiet(quiet):
    pass


@pytest.fixture
def server(settings):
    admit_loopback(settings)
    with feed_server() as feeds:
        yield feeds


@pytest.fixture
def feed(server):
    url = server.serve("/l", b"a.example\nb.example\nc.example\n")
    return Source.objects.create(name="feed-a", kind="feed", url=url)


def refresh(client, source, committed, **data):
    with committed():
        response = client.post(reverse("admin:urlguard_source_refresh", args=[source.pk]), data)
    assert response.status_code == 302, response.content[:300]
    return client.get(response["Location"])


def test_sources_list_shows_health_and_counts(make_staff, feed, committed):
    client = make_staff(*SOURCE_EDITOR)
    html = client.get(reverse("admin:urlguard_source_changelist")).content.decode()
    assert "feed-a" in html and "never refreshed" in html and "feed-never" in html
    refresh(client, feed, committed)
    html = client.get(reverse("admin:urlguard_source_changelist")).content.decode()
    assert "feed-ok" in html and "?listed_by=" in html
    assert ">3<" in html  # rules listed


def test_refresh_now_runs_a_job_with_its_page(make_staff, feed, committed):
    client = make_staff(*SOURCE_EDITOR)
    page = refresh(client, feed, committed)
    html = page.content.decode()
    assert page.status_code == 200 and "feed-a: ok: 3 entries" in html
    job = AdminJob.objects.get(kind="refresh")
    assert job.state == "done" and job.params["name"] == "feed-a"
    assert SpamRule.objects.count() == 3
    status = client.get(reverse("admin:urlguard_source_refresh_status", args=[job.pk])).json()
    assert status["finished"] and status["state"] == "done"
    # The source page: history and the refresh button.
    html = client.get(reverse("admin:urlguard_source_change", args=[feed.pk])).content.decode()
    assert 'id="refresh-now"' in html and "feed-history" in html and "+3" in html


def test_a_held_shrink_is_shown_and_accepted(make_staff, server, committed):
    hosts = "".join(f"h{i}.example\n" for i in range(10)).encode()
    feed = Source.objects.create(name="f", kind="feed", url=server.serve("/l", hosts))
    client = make_staff(*SOURCE_EDITOR)
    refresh(client, feed, committed)
    server.serve("/l", b"h0.example\n")
    html = refresh(client, feed, committed).content.decode()
    assert "Nothing was applied" in html and "Accept the shrink" in html
    assert SpamRule.objects.count() == 10
    listing = client.get(reverse("admin:urlguard_source_changelist")).content.decode()
    assert "would remove 9" in listing and "feed-held" in listing
    page = client.get(reverse("admin:urlguard_source_change", args=[feed.pk])).content.decode()
    assert 'id="accept-shrink"' in page
    refresh(client, feed, committed, accept_shrink="1")
    assert SpamRule.objects.count() == 1


def test_accept_held_shrink_action(make_staff, server, committed):
    hosts = "".join(f"h{i}.example\n" for i in range(10)).encode()
    feed = Source.objects.create(name="f", kind="feed", url=server.serve("/l", hosts))
    client = make_staff(*SOURCE_EDITOR)
    refresh(client, feed, committed)
    server.serve("/l", b"h0.example\n")
    refresh(client, feed, committed)
    with committed():
        response = client.post(
            reverse("admin:urlguard_source_changelist"),
            {"action": "accept_held_shrink", "_selected_action": [feed.pk]},
        )
    assert response.status_code == 302
    assert SpamRule.objects.count() == 1


def test_view_only_staff_cannot_refresh(make_staff, feed):
    client = make_staff("view_source")
    response = client.post(reverse("admin:urlguard_source_refresh", args=[feed.pk]))
    assert response.status_code == 403 and not AdminJob.objects.exists()
    html = client.get(reverse("admin:urlguard_source_change", args=[feed.pk])).content.decode()
    assert 'id="refresh-now"' not in html


def test_add_feed_form_validates(make_staff):
    client = make_staff(*SOURCE_EDITOR)
    url = reverse("admin:urlguard_source_add")
    data = {"name": "x", "kind": "feed", "url": "", "format": "auto", "category": "spam"}
    data.update(interval=3600, enabled="on")
    html = client.post(url, data).content.decode()
    assert "A feed needs an http://" in html and not Source.objects.filter(name="x").exists()
    data["url"] = "https://lists.example.org/feed.txt"
    assert client.post(url, data).status_code == 302
    assert Source.objects.get(name="x").url == "https://lists.example.org/feed.txt"


def test_disable_action_keeps_rules(make_staff, feed, committed):
    client = make_staff(*SOURCE_EDITOR)
    refresh(client, feed, committed)
    client.post(
        reverse("admin:urlguard_source_changelist"),
        {"action": "disable", "_selected_action": [feed.pk]},
    )
    feed.refresh_from_db()
    assert not feed.enabled and SpamRule.objects.count() == 3


def test_allowlist_hosts_edited_inline(make_staff):
    allow = Source.objects.create(name="allowlist", kind="manual", is_allowlist=True)
    client = make_staff(*SOURCE_EDITOR, "add_allowedhost", "change_allowedhost", "view_allowedhost")
    url = reverse("admin:urlguard_source_change", args=[allow.pk])
    assert "Allowlisted hosts" in client.get(url).content.decode()
    prefix = "allowed_hosts"
    data = {
        "name": "allowlist",
        "kind": "manual",
        "url": "",
        "format": "auto",
        "category": "spam",
        "interval": 3600,
        "enabled": "on",
        "is_allowlist": "on",
        f"{prefix}-TOTAL_FORMS": 1,
        f"{prefix}-INITIAL_FORMS": 0,
        f"{prefix}-0-host": "HTTPS://WWW.Example.COM/",
        f"{prefix}-0-note": "ours",
    }
    response = client.post(url, data)
    assert response.status_code == 302, response.content.decode()[-2000:]
    assert AllowedHost.objects.get().host == "www.example.com"
    data[f"{prefix}-0-host"] = "example.org/some/path"
    data[f"{prefix}-INITIAL_FORMS"] = 0
    AllowedHost.objects.all().delete()
    html = client.post(url, data).content.decode()
    assert "names hosts" in html and not AllowedHost.objects.exists()


def test_rule_page_lists_its_sources_and_the_list_filters_by_source(make_staff, feed, committed):
    client = make_staff(*SOURCE_EDITOR)
    refresh(client, feed, committed)
    changes.add_rules(["a.example", "hand.example"], source="admin")
    rule = SpamRule.objects.get(expression="a.example/")
    html = client.get(reverse("admin:urlguard_spamrule_change", args=[rule.pk])).content.decode()
    assert "feed-a</a>" in html and "admin</a>" in html and "Listed by" in html
    listing = client.get(
        reverse("admin:urlguard_spamrule_changelist") + f"?listed_by={feed.pk}"
    ).content.decode()
    assert "b.example/" in listing and "hand.example/" not in listing


def test_dashboard_shows_feed_health(make_staff, feed, committed):
    client = make_staff(*SOURCE_EDITOR)
    refresh(client, feed, committed)
    html = client.get(reverse("admin:urlguard_spamrule_dashboard")).content.decode()
    assert 'id="feeds"' in html and "feed-a" in html and "feed-ok" in html


def test_a_rule_added_by_hand_on_an_allowlisted_host_is_warned_not_refused(superuser):
    allow = Source.objects.create(name="allowlist", kind="manual", is_allowlist=True)
    AllowedHost.objects.create(source=allow, host="www.partner.example")
    response = superuser.post(
        reverse("admin:urlguard_spamrule_add"),
        {
            "url": "https://partner.example/",
            "expression": "partner.example/",
            "category": "spam",
            "note": "",
            "confirm": "on",
        },
        follow=True,
    )
    assert SpamRule.objects.filter(expression="partner.example/").exists(), (
        response.content.decode()[-3000:]
    )
    assert "allowlisted" in response.content.decode()


def test_the_refresh_page_shows_the_body_lines_to_superusers_only(make_staff, server, committed):
    body = b"a.example\nDJANGO_SECRET_KEY = 'xyz-secret'\n"
    feed = Source.objects.create(name="f", kind="feed", url=server.serve("/l", body))
    html = refresh(client := make_staff(*SOURCE_EDITOR), feed, committed).content.decode()
    assert "feed-refusals" in html and "items on one line" in html
    assert "xyz-secret" not in html and "<th>Entry</th>" not in html
    job = AdminJob.objects.get()
    page = reverse("admin:urlguard_source_refresh_job", args=[feed.pk, job.pk])
    assert "xyz-secret" not in client.get(page).content.decode()
    html = make_staff(superuser=True).get(page).content.decode()
    assert "xyz-secret" in html and "<th>Entry</th>" in html
