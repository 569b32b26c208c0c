"""urlguard.hotpath.hitlog: warnings and "continue anyway" per rule and day, blocked hosts per
day, per-rule totals: appended to the statistics buffer on the warning page (no
database write there) and written by its flush; a warning is not a click."""

from __future__ import annotations

import datetime as dt
import re
import time
from html import unescape

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from urlguard.hotpath import hitlog
from urlguard.models import Click, HostHitDay, RuleHitDay, RuleHitTotal, ShortLink
from urlguard.runtime import stats
from urlguard.writepath import changes
from urlguard_service.celery import app as celery_app

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_guard", "quiet")]


@pytest.fixture
def blocked(db, build_filter):
    rule = changes.add_rule("hit-spam.example/", category="spam")
    ShortLink.objects.create(slug="hs", destination="https://www.hit-spam.example/a")
    ShortLink.objects.create(slug="ok", destination="https://fine.example/")
    build_filter()
    return rule


def test_a_warning_is_a_hit_not_a_click_and_writes_nothing_on_the_request(client, blocked):
    with CaptureQueriesContext(connection) as queries:
        assert client.get("/hs").status_code == 403
    assert not any(
        q["sql"].lstrip().upper().startswith(("INSERT", "UPDATE")) for q in queries.captured_queries
    )
    assert client.get("/hs").status_code == 403
    stats.flush()
    today = timezone.now().date()
    day = RuleHitDay.objects.get()
    assert (day.rule_id, day.day, day.hits, day.continued) == (blocked.pk, today, 2, 0)
    assert RuleHitTotal.objects.get(rule=blocked).hits == 2
    assert list(HostHitDay.objects.values_list("host", "hits")) == [("www.hit-spam.example", 2)]
    link = ShortLink.objects.get(slug="hs")
    assert link.click_count == 0 and not Click.objects.filter(link=link).exists()
    # An allowed redirect still counts as a click.
    assert client.get("/ok").status_code == 302
    stats.flush()
    assert ShortLink.objects.get(slug="ok").click_count == 1


def test_continue_anyway_is_counted_per_rule(client, blocked):
    html = unescape(client.get("/hs").content.decode())
    follow = re.search(r'href="(/continue\?token=[^"]+)"', html).group(1)
    assert client.get(follow).status_code == 302
    stats.flush()
    day = RuleHitDay.objects.get()
    total = RuleHitTotal.objects.get(rule=blocked)
    assert (day.hits, day.continued, total.continued) == (1, 1, 1)
    assert total.last_at is not None


def test_merging_keeps_counts_and_the_latest_time(blocked):
    early = timezone.now() - dt.timedelta(hours=1)
    hitlog.EVENTS.append((hitlog.WARNED, blocked.pk, "a.example", timezone.now()))
    stats.flush()
    hitlog.EVENTS.append((hitlog.WARNED, blocked.pk, "a.example", early))
    hitlog.EVENTS.append((hitlog.CONTINUED, blocked.pk, "", early))
    stats.flush()
    total = RuleHitTotal.objects.get(rule=blocked)
    assert (total.hits, total.continued) == (2, 1)
    assert total.last_at > early


def test_prune_keeps_hit_log_days(blocked, settings):
    settings.URLGUARD = {**settings.URLGUARD, "HIT_LOG_DAYS": 7}
    old = timezone.now() - dt.timedelta(days=8)
    hitlog.EVENTS.append((hitlog.WARNED, blocked.pk, "a.example", old))
    hitlog.warned(blocked.pk, "a.example")
    stats.flush()
    assert hitlog.prune() == 2  # the old day of the rule and of the host
    assert RuleHitDay.objects.count() == 1 and RuleHitTotal.objects.get().hits == 2


def old_and_new_days(rule_id: int) -> None:
    """A day past the default HIT_LOG_DAYS (90) and today, per rule and per host."""
    today = timezone.now().date()
    for day in (today - dt.timedelta(days=91), today):
        RuleHitDay.objects.create(rule_id=rule_id, day=day, hits=1)
        HostHitDay.objects.create(host="a.example", day=day, hits=1)


def test_beat_prunes_the_hit_log_daily(blocked):
    entry = celery_app.conf.beat_schedule["urlguard-hit-log"]
    assert entry == {"task": "urlguard.prune_hit_log", "schedule": 24 * 3600.0}
    old_and_new_days(blocked.pk)
    assert celery_app.tasks[entry["task"]].apply().get() == 2
    today = timezone.now().date()
    assert list(RuleHitDay.objects.values_list("day", flat=True)) == [today]
    assert list(HostHitDay.objects.values_list("day", flat=True)) == [today]


@pytest.mark.django_db(transaction=True)
def test_without_a_broker_a_serving_process_prunes_from_its_first_request(client, blocked):
    old_and_new_days(blocked.pk)
    hitlog.install()
    try:
        assert hitlog.pruner.thread is None  # nothing runs before a request
        client.get("/healthz")
        thread = hitlog.pruner.thread
        assert thread is not None
        deadline = time.monotonic() + 10
        while RuleHitDay.objects.count() + HostHitDay.objects.count() > 2:
            assert time.monotonic() < deadline, "the hit log was never pruned"
            time.sleep(0.05)
        client.get("/healthz")
        assert hitlog.pruner.thread is thread
    finally:
        hitlog.stop()
    assert hitlog.pruner.thread is None and not thread.is_alive()


def test_top_rules_and_hosts_this_week(blocked):
    other = changes.add_rule("other-spam.example/", category="spam")
    for _ in range(3):
        hitlog.warned(blocked.pk, "www.hit-spam.example")
    hitlog.warned(other.pk, "other-spam.example")
    stats.flush()
    assert [(r["expression"], r["hits"]) for r in hitlog.top_rules()] == [
        ("hit-spam.example/", 3),
        ("other-spam.example/", 1),
    ]
    assert [(h["host"], h["hits"]) for h in hitlog.top_hosts()] == [
        ("www.hit-spam.example", 3),
        ("other-spam.example", 1),
    ]
    assert hitlog.daily_hits()[-1][1] == 4 and len(hitlog.daily_hits()) == 7
