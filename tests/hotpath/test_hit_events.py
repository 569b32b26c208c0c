"""The hit log of events: each warning and each "continue anyway" with where it came
from, the destination, the rule and its expression (kept once the rule is gone),
written by the statistics flush, bounded by HIT_EVENTS_KEPT; the admin's list filters
by rule, link and host and leads on to the rule, its removal, narrowing, allowlisting."""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.urls import reverse

from urlguard.hotpath import hitlog
from urlguard.models import HitEvent, ShortLink
from urlguard.runtime import stats
from urlguard.writepath import changes

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_guard", "quiet")]

HITS = reverse("admin:urlguard_hitevent_changelist")


@pytest.fixture
def blocked(db, build_filter):
    rule = changes.add_rule("hit-spam.example/", category="phishing")
    ShortLink.objects.create(slug="hs", destination="https://www.hit-spam.example/a")
    ShortLink.objects.create(slug="other", destination="https://hit-spam.example/b")
    build_filter()
    return rule


def test_each_warning_and_continue_is_an_event(client, blocked):
    html = unescape(client.get("/hs").content.decode())
    follow = re.search(r'href="(/continue\?token=[^"]+)"', html).group(1)
    client.get(follow)
    client.get("/other")
    stats.flush()
    events = list(
        HitEvent.objects.order_by("pk").values_list(
            "action", "where", "host", "rule_id", "expression", "category"
        )
    )
    assert events == [
        ("warned", "/hs", "www.hit-spam.example", blocked.pk, "hit-spam.example/", "phishing"),
        ("continued", "", "www.hit-spam.example", blocked.pk, "hit-spam.example/", "phishing"),
        ("warned", "/other", "hit-spam.example", blocked.pk, "hit-spam.example/", "phishing"),
    ]
    assert HitEvent.objects.first().destination == "https://hit-spam.example/b"


def test_the_log_keeps_the_newest_hit_events_kept(blocked, settings):
    settings.URLGUARD = {**settings.URLGUARD, "HIT_EVENTS_KEPT": 3}
    for i in range(5):
        hitlog.warned(blocked.pk, f"h{i}.example", where=f"/l{i}")
    stats.flush()
    hitlog.warned(blocked.pk, "h5.example", where="/l5")
    stats.flush()
    assert list(HitEvent.objects.order_by("pk").values_list("where", flat=True)) == [
        "/l3",
        "/l4",
        "/l5",
    ]


def test_a_removed_rule_keeps_its_expression_in_the_log_and_dashboard(blocked, superuser):
    hitlog.warned(blocked.pk, "www.hit-spam.example", where="/hs")
    stats.flush()
    changes.remove_rule(blocked)
    html = superuser.get(HITS).content.decode()
    assert "hit-spam.example/</code></a> (removed)" in html
    dashboard = superuser.get(reverse("admin:urlguard_spamrule_dashboard")).content.decode()
    assert "<code>hit-spam.example/</code> (removed)" in dashboard
    assert f"rule #{blocked.pk} (removed)" not in dashboard


def test_the_admin_list_filters_and_leads_on(client, blocked, make_staff):
    client.get("/hs")
    client.get("/other")
    stats.flush()
    staff = make_staff("view_hitevent", "view_spamrule")
    html = staff.get(HITS).content.decode()
    assert html.count('class="button hit-remove"') == 2
    assert f"?rule_id={blocked.pk}" in html and "?where=%2Fhs" in html
    assert "?host=www.hit-spam.example" in html
    assert reverse("admin:urlguard_allowedhost_add") + "?host=hit-spam.example" in html
    assert "replace=" in html and reverse("admin:urlguard_spamrule_add") in html
    only_hs = staff.get(HITS + "?where=/hs").content.decode()
    assert "/other</a>" not in only_hs and "/hs</a>" in only_hs
    by_host = staff.get(HITS + "?host=hit-spam.example").content.decode()
    assert "/hs</a>" not in by_host and "/other</a>" in by_host
    assert staff.get(HITS + f"?rule_id={blocked.pk}").status_code == 200
    assert make_staff("view_spamrule").get(HITS).status_code == 403


def test_a_blocked_api_answer_is_an_event_but_no_warning(client, blocked):
    import json

    from urlguard.models import RuleHitDay
    from urlguard.operations import apikeys

    assert client.get("/api/check", {"url": "https://hit-spam.example/q"}).json()["blocked"]
    client.get("/api/check", {"url": "https://fine.example/"})
    key = apikeys.create_api_key("gateway")[1]
    client.post(
        "/api/check",
        json.dumps({"urls": ["https://x.hit-spam.example/", "https://fine.example/"]}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )
    stats.flush()
    assert list(HitEvent.objects.order_by("pk").values_list("action", "where", "host")) == [
        ("api", "API", "hit-spam.example"),
        ("api", "API key gateway", "x.hit-spam.example"),
    ]
    assert not RuleHitDay.objects.exists()
