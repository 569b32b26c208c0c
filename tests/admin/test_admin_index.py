"""The admin's first page leads with the operator's work: the day's summary (open
reports, failing and held feeds, node lag, warnings today), the tools, the entries by
their everyday names, and Django's own apps below; the dashboard has the summary too."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from urlguard.models import ChangeEvent, MistakeReport, NodeStatus, RuleHitDay, Source
from urlguard.writepath import changes

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("quiet")]

INDEX = reverse("admin:index")


def test_the_index_leads_with_the_summary_tools_and_entries(superuser):
    html = superuser.get(INDEX).content.decode()
    order = [
        html.index('id="operator-summary"'),
        html.index('id="urlguard-tools"'),
        html.index('id="urlguard-entries"'),
        html.index("Authentication and Authorization"),
    ]
    assert order == sorted(order)
    entries = html[html.index('id="urlguard-entries"') : html.index("Authentication and")]
    for name in ("Feeds", "Allowlist", "Rules", "Change sets", "Reports", "Hit log"):
        assert f">{name}</a>" in entries
    assert "app-urlguard" not in html  # not listed twice


def test_the_summary_counts_what_needs_attention(superuser, settings):
    changes.add_rule("spam.example", category="spam")
    MistakeReport.objects.create(destination="https://spam.example/a")
    MistakeReport.objects.create(destination="https://spam.example/b")
    MistakeReport.objects.create(destination="https://spam.example/c", status="dismissed")
    Source.objects.create(name="broken", kind="feed", url="https://x.example/a", failures=5)
    Source.objects.create(
        name="held", kind="feed", url="https://x.example/b", held_at=timezone.now()
    )
    Source.objects.create(name="fine", kind="feed", url="https://x.example/c")
    head = ChangeEvent.objects.head()  # not 1 on PostgreSQL, whose sequences carry on
    NodeStatus.objects.create(node="web-1", filter_path="/f", applied_seq=head - 1)
    RuleHitDay.objects.create(rule_id=1, day=timezone.localdate(), hits=42)
    html = superuser.get(INDEX).content.decode()
    summary = html[html.index('id="operator-summary"') : html.index('id="urlguard-tools"')]
    assert "<strong>2</strong> open mistake reports" in summary
    assert "<strong>1</strong> failing feed, <strong>1</strong> held" in summary
    assert "<strong>1</strong> change behind on web-1" in summary
    assert "<strong>42</strong> warnings shown today" in summary
    assert 'id="index-open-reports">2 open<' in html
    dashboard = superuser.get(reverse("admin:urlguard_spamrule_dashboard")).content.decode()
    assert "<strong>2</strong> open mistake reports" in dashboard


def test_a_quiet_day(superuser):
    html = superuser.get(INDEX).content.decode()
    assert "summary-attention" not in html and "No node has reported yet" in html


def test_staff_see_only_what_they_may_open(make_staff):
    html = make_staff("view_shortlink").get(INDEX).content.decode()
    assert 'id="operator-summary"' not in html and ">Feeds</a>" not in html
    assert ">Short links</a>" in html
