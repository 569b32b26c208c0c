"""The report queue knows where a rule came from: who listed it and since when, a
warning that a feed will list a removed rule again, "allowlist the host" for a feed's
rule on a whole host; the change set an action makes carries the report as its reason
and the report links it; and a new report mails the managers, throttled."""

from __future__ import annotations

import pytest
from django.core import mail
from django.core.cache import cache
from django.urls import reverse

from urlguard.models import AllowedHost, ChangeSet, MistakeReport, Source, SpamRule
from urlguard.reports.mail import report_arrived
from urlguard.writepath import changes

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("quiet")]

QUEUE = reverse("admin:urlguard_mistakereport_changelist")
RESOLVER = (
    "view_mistakereport",
    "change_mistakereport",
    "view_spamrule",
    "add_spamrule",
    "delete_spamrule",
    "add_allowedhost",
)


@pytest.fixture(autouse=True)
def _empty_cache():
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def feed() -> Source:
    return Source.objects.create(name="hosts", kind="feed", url="https://feeds.example/hosts")


@pytest.fixture
def report(feed) -> MistakeReport:
    changes.add_rules(["github.com"], source=feed)
    rule = SpamRule.objects.get()
    return MistakeReport.objects.create(
        destination="https://github.com/django/django",
        expression=rule.expression,
        rule=rule,
        comment="it is a code host",
    )


def test_the_queue_shows_who_listed_the_rule_and_the_choices(report, make_staff):
    html = make_staff(*RESOLVER).get(QUEUE).content.decode()
    assert "the feed" in html and ">hosts</a>" in html and "since 20" in html
    for label in ("Remove…", "Allowlist github.com", "Narrow…", "Dismiss"):
        assert label in html


def test_remove_warns_that_the_feed_will_list_it_again(report, make_staff):
    client = make_staff(*RESOLVER)
    url = reverse("admin:urlguard_mistakereport_remove", args=[report.pk])
    page = client.get(url).content.decode()
    assert 'id="relist-warning"' in page and "hosts still lists this rule" in page
    assert "allowlist github.com instead" in page and 'id="allowlist-instead"' in page
    html = client.post(url, {"confirm": "1"}, follow=True).content.decode()
    assert "Still listed by the feed hosts: github.com/ comes back" in html
    report.refresh_from_db()
    cs = report.change_set
    assert (report.status, cs.kind, cs.removed) == ("removed", "admin", 1)
    assert cs.reason.startswith(f"mistake report #{report.pk} about https://github.com/django")
    assert "it is a code host" in cs.reason
    assert f"change set #{cs.pk}" in client.get(QUEUE + "?status__exact=removed").content.decode()
    page = client.get(reverse("admin:urlguard_changeset_change", args=[cs.pk])).content.decode()
    assert f"report #{report.pk}</a>" in page


def test_a_hand_rule_has_no_relist_warning_and_no_allowlist(make_staff):
    changes.add_rule("spam.example", category="spam")
    rule = SpamRule.objects.get()
    report = MistakeReport.objects.create(
        destination="https://spam.example/", expression=rule.expression, rule=rule
    )
    client = make_staff(*RESOLVER)
    page = client.get(reverse("admin:urlguard_mistakereport_remove", args=[report.pk]))
    html = page.content.decode()
    assert "by hand:" in html and "relist-warning" not in html and "allowlist-instead" not in html
    assert "Allowlist spam.example" not in client.get(QUEUE).content.decode()
    response = client.post(reverse("admin:urlguard_mistakereport_allowlist", args=[report.pk]))
    assert response.status_code == 302 and not AllowedHost.objects.exists()


def test_allowlisting_the_host_from_a_report(report, make_staff):
    client = make_staff(*RESOLVER)
    url = reverse("admin:urlguard_mistakereport_allowlist", args=[report.pk])
    html = client.post(url, follow=True).content.decode()
    assert "Allowlisted github.com: 1 feed listing withdrawn (hosts): github.com/" in html
    assert not SpamRule.objects.exists()
    entry = AllowedHost.objects.get()
    assert entry.host == "github.com" and f"mistake report #{report.pk}" in entry.note
    report.refresh_from_db()
    assert report.status == "allowlisted" and report.change_set.kind == "allowlist"
    assert f"mistake report #{report.pk}" in report.change_set.reason


def test_allowlisting_needs_the_allowlist_permission(report, make_staff):
    client = make_staff(*RESOLVER[:-1])
    url = reverse("admin:urlguard_mistakereport_allowlist", args=[report.pk])
    assert client.post(url).status_code == 403
    assert (
        "Allowlist github.com"
        not in client.get(
            reverse("admin:urlguard_mistakereport_remove", args=[report.pk])
        ).content.decode()
    )


def test_narrowing_makes_one_change_set_that_names_the_report(report, make_staff):
    client = make_staff(*RESOLVER)
    saved = client.post(
        reverse("admin:urlguard_spamrule_add"),
        {
            "url": "https://github.com/evil/",
            "expression": "github.com/evil/",
            "category": "spam",
            "replace": report.rule.pk,
            "report": report.pk,
            "_save": "1",
        },
    )
    assert saved.status_code == 302
    report.refresh_from_db()
    cs = report.change_set
    assert report.status == "narrowed" and (cs.added, cs.removed) == (1, 1)
    assert cs.reason.startswith(f"mistake report #{report.pk}")
    assert ChangeSet.objects.filter(reason__startswith="mistake report").count() == 1


def test_a_new_report_mails_the_managers_at_most_once_per_interval(report, settings, rf):
    settings.MANAGERS = [("Ops", "ops@example.com")]
    settings.URLGUARD = {**settings.URLGUARD, "REPORT_MAIL_INTERVAL": 600}
    request = rf.get("/report-mistake/")
    assert report_arrived(report, request)
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["ops@example.com"]
    assert "1 open mistake report" in message.subject and "github.com" in message.subject
    assert "it is a code host" in message.body and "status__exact=open" in message.body
    second = MistakeReport.objects.create(destination="https://github.com/x", rule=report.rule)
    assert not report_arrived(second, request) and len(mail.outbox) == 1


def test_no_mail_without_managers_or_with_interval_zero(report, settings, rf):
    settings.MANAGERS = []
    assert not report_arrived(report, rf.get("/"))
    settings.MANAGERS = [("Ops", "ops@example.com")]
    settings.URLGUARD = {**settings.URLGUARD, "REPORT_MAIL_INTERVAL": 0}
    assert not report_arrived(report, rf.get("/"))
    assert mail.outbox == []


def test_the_report_form_mails_on_a_new_report_only(report, settings, client):
    from django.test import RequestFactory

    from urlguard.hotpath.warning import report_form_url
    from urlguard.runtime.visitors import visitor_id

    settings.MANAGERS = [("Ops", "ops@example.com")]
    settings.URLGUARD = {**settings.URLGUARD, "REPORT_MAIL_INTERVAL": 1}
    # The token names the warned visitor: the test client, as the request factory is.
    url = report_form_url(
        "https://github.com/other", report.rule, visitor_id(RequestFactory().get("/"))
    )
    token = client.get(url).context["token"]
    client.post(url, {"token": token, "comment": "mine"})
    assert len(mail.outbox) == 1 and "2 open mistake reports" in mail.outbox[0].subject
    cache.clear()  # the interval has passed
    client.post(url, {"token": token, "comment": "again"})  # the same open report
    assert len(mail.outbox) == 1
