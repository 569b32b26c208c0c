"""GET /metrics: Prometheus text from the multiprocess files, the counts of checks,
warnings, continues, applied changes and rebuilds, the filter's figures as scraped,
and access only from allowed networks or with the token. (Two gunicorn workers
summed: tests/service/test_e2e_gunicorn.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from urllib.parse import urlsplit

import pytest
from django.db import OperationalError

from tests.support.metrics import scrape, value
from tests.support.webfakes import SetFilter
from urlguard.hotpath.guard import Guard
from urlguard.models import ShortLink, SpamRule
from urlguard.nodesync import nodestatus, registry
from urlguard.runtime import metrics
from urlguard.runtime.metrics import VERDICTS
from urlguard.writepath.changes import add_rule, remove_rule
from urlguard_service import gunicornconf

pytestmark = pytest.mark.django_db


@pytest.fixture
def rules(build_filter, fresh_guard):
    add_rule("evil.example/", category="phishing", source="test")
    add_rule("gone.example/", category="spam", source="test")
    build_filter()


def test_checks_are_counted_by_verdict(client, rules, quiet):
    remove_rule(
        SpamRule.objects.get(expression="gone.example/")
    )  # still in the file, no longer in the table
    before = scrape(client)
    for url in ("https://clean.example/", "https://clean.example/2", "http://a.evil.example/"):
        assert client.get("/api/check", {"url": url}).status_code == 200
    assert client.get("/api/check", {"url": "http://gone.example/"}).json()["blocked"] is False
    assert client.get("/api/check", {"url": "javascript:alert(1)"}).status_code == 400
    after = scrape(client)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("urlguard_checks_total", verdict="clean") == 2
    assert delta("urlguard_checks_total", verdict="blocked") == 1
    assert delta("urlguard_checks_total", verdict="false_positive") == 1
    assert delta("urlguard_checks_total", verdict="invalid") == 1
    assert delta("urlguard_checks_total", verdict="degraded") == 0
    assert delta("urlguard_check_seconds_count") == 5
    assert delta("urlguard_check_seconds_bucket", le="+Inf") == 5
    assert delta("urlguard_check_seconds_sum") > 0


def test_degraded_checks_and_batches(client, db, use_guard):
    before = scrape(client)
    use_guard(Guard(lambda: None, on_filter_error="open"))
    client.get("/api/check", {"url": "http://evil.example/"})
    guard = Guard(lambda: SetFilter(["evil.example/"]))
    verdicts = guard.check_many(
        ["https://a.example/", "http://evil.example/x", "ftp://x", "http://"]
    )
    assert [VERDICTS[metrics._verdict_index(v)] for v in verdicts] == [
        metrics.verdict_label(v) for v in verdicts
    ]
    assert [metrics.verdict_label(v) for v in verdicts] == [
        "clean",
        "false_positive",
        "invalid",
        "invalid",
    ]
    after = scrape(client)
    checks = {
        v: value(after, "urlguard_checks_total", verdict=v)
        - value(before, "urlguard_checks_total", verdict=v)
        for v in metrics.VERDICTS
    }
    # evil.example/ is in the fake filter but not in the table: a false positive.
    assert checks == {"clean": 1, "blocked": 0, "false_positive": 1, "degraded": 1, "invalid": 2}


def test_warnings_and_continues(client, rules):
    ShortLink.objects.create(slug="bad", destination="http://login.evil.example/")
    before = scrape(client)
    response = client.get("/bad")
    assert response.status_code == 403
    continue_url = response.context["continue_url"]
    path = urlsplit(continue_url)
    assert client.get(f"{path.path}?{path.query}").status_code == 302
    after = scrape(client)
    assert (
        value(after, "urlguard_warnings_total", category="phishing")
        - value(before, "urlguard_warnings_total", category="phishing")
        == 1
    )
    assert value(after, "urlguard_continue_total") - value(before, "urlguard_continue_total") == 1


def test_changes_applied_and_rebuilds(client, db, filter_path, sync_filter):
    before = scrape(client)
    add_rule("one.example/", category="spam", source="test")
    sync_filter()  # no file yet: a rebuild
    for i in range(3):
        add_rule(f"more{i}.example/", category="spam", source="test")
    sync_filter()  # three changes applied
    after = scrape(client)
    assert (
        value(after, "urlguard_changes_applied_total")
        - value(before, "urlguard_changes_applied_total")
        == 3
    )
    assert (
        value(after, "urlguard_rebuilds_total", reason="missing")
        - value(before, "urlguard_rebuilds_total", reason="missing")
        == 1
    )


def test_filter_figures(client, rules, quiet):
    add_rule("later.example/", category="spam", source="test")  # not applied: lag 1
    samples = scrape(client)
    assert value(samples, "urlguard_filter_readable") == 1
    assert value(samples, "urlguard_filter_rules") == 2
    assert value(samples, "urlguard_filter_stages") == 1
    assert value(samples, "urlguard_filter_applied_seq") == 2
    assert value(samples, "urlguard_filter_lag_changes") == 1
    assert ("urlguard_filter_estimated_fpr", ()) not in samples  # no full report yet
    nodestatus.report_status(full=True)
    samples = scrape(client)
    # Two rules in a filter for 100,000: the measured rate rounds to 0.
    assert samples[("urlguard_filter_estimated_fpr", ())] == 0.0


def test_an_unreadable_filter_is_a_zero(client, db, monkeypatch):
    monkeypatch.setattr(registry, "get_filter", lambda path=None: None)
    samples = scrape(client)
    assert value(samples, "urlguard_filter_readable") == 0
    assert ("urlguard_filter_rules", ()) not in samples


def test_an_outside_address_is_refused(client, db, settings):
    outside = {"REMOTE_ADDR": "203.0.113.5"}
    response = client.get("/metrics", **outside)
    assert response.status_code == 403
    assert "METRICS_ALLOWED_NETWORKS" in response.json()["error"]
    settings.URLGUARD = {**settings.URLGUARD, "METRICS_TOKEN": "s3cret"}
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer nope", **outside).status_code == 403
    scrape(client, HTTP_AUTHORIZATION="Bearer s3cret", **outside)
    settings.URLGUARD = {**settings.URLGUARD, "METRICS_ALLOWED_NETWORKS": ["203.0.113.0/24"]}
    scrape(client, **outside)
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 403


def test_a_scraper_may_send_any_host(client, db):
    scrape(client, HTTP_HOST="10.0.0.7:8000")


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("the file is missing", "missing"),
        ("the file is unreadable: bad magic", "unreadable"),
        ("the file is dirty (a writer died in the middle of a change)", "dirty"),
        ("the file was built with capacity=1, error_rate=0.1, but settings say", "settings"),
        ("the file has applied_seq 9 but the change log ends at 3 (a file from", "ahead"),
        (
            "the log removes a rule the file does not hold (x): the file disagrees with the log",
            "disagrees",
        ),
        ("compacting 5 stages into one (more than FILTER_MAX_STAGES=4 slow", "compact"),
        ("the full verify found 3 of 10 rule(s) missing from the file", "verify"),
        ("the spot check found 1 of 200 rule(s) missing from the file", "verify"),
        ("requested by manage.py rebuild_filter", "requested"),
        ("rebuild requested", "requested"),
        ("something new", "other"),
    ],
)
def test_rebuild_reasons_are_few_labels(reason, kind):
    assert metrics.rebuild_kind(reason) == kind


def test_gunicorn_start_clears_only_dead_processes(tmp_path):
    tmp_path = tmp_path / "metrics"
    tmp_path.mkdir()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead_pid = int(dead.stdout)
    for name in (f"counter_{dead_pid}.db", f"histogram_{dead_pid}.db", f"counter_{os.getpid()}.db"):
        (tmp_path / name).write_bytes(b"")
    removed = gunicornconf.clear_dead_processes(str(tmp_path))
    assert sorted(os.path.basename(p) for p in removed) == [
        f"counter_{dead_pid}.db",
        f"histogram_{dead_pid}.db",
    ]
    assert os.listdir(tmp_path) == [f"counter_{os.getpid()}.db"]


def test_feed_figures(client, db):
    from datetime import UTC, datetime

    from urlguard.models import Source

    done = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    Source.objects.create(
        name="phish-feed",
        kind=Source.Kind.FEED,
        url="https://feeds.example/phish.txt",
        last_refresh_at=done,
        last_success_at=done,
        last_status=Source.Status.OK,
        last_entries=1234,
        last_duration=2.5,
    )
    Source.objects.create(
        name="broken-feed",
        kind=Source.Kind.FEED,
        url="https://feeds.example/broken.txt",
        last_status=Source.Status.FAILED,
        failures=3,
    )
    samples = scrape(client)
    assert value(samples, "urlguard_feed_last_success_timestamp_seconds", feed="phish-feed") == (
        done.timestamp()
    )
    assert value(samples, "urlguard_feed_entries", feed="phish-feed") == 1234
    assert value(samples, "urlguard_feed_last_refresh_seconds", feed="phish-feed") == 2.5
    assert value(samples, "urlguard_feed_status", feed="phish-feed", status="ok") == 1
    assert value(samples, "urlguard_feed_failures", feed="broken-feed") == 3
    assert value(samples, "urlguard_feed_status", feed="broken-feed", status="failed") == 1
    assert value(samples, "urlguard_feed_held", feed="broken-feed") == 0
    assert value(samples, "urlguard_feed_enabled", feed="broken-feed") == 1
    # Manual sources (the admin, imports) are no feeds.
    assert not [
        k for k in samples if k[0].startswith("urlguard_feed") and ("feed", "admin") in k[1]
    ]


def test_statistics_flushes_and_losses(client, db, monkeypatch):
    from urlguard.models import Click, StatsLoss
    from urlguard.runtime import stats

    link = ShortLink.objects.create(slug="s", destination="https://example.com/")
    rows = stats.rows("test.metrics", Click)
    before = scrape(client)
    for i in range(3):
        rows.append(Click(link_id=link.pk, visitor=f"v{i}"))
    stats.flush()

    def refuse(items):
        raise OperationalError("the database is gone")

    monkeypatch.setattr(rows, "write", refuse)
    rows.append(Click(link_id=link.pk, visitor="late"))
    stats.flush()
    StatsLoss.objects.create(kind="clicks", node="web-9", lost=42)
    after = scrape(client)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("urlguard_stats_written_total", kind="test.metrics") == 3
    assert delta("urlguard_stats_flush_failures_total", kind="test.metrics") == 1
    assert value(after, "urlguard_stats_lost", kind="clicks", node="web-9") == 42


def test_readiness_is_a_figure(client, rules, settings):
    samples = scrape(client)
    assert value(samples, "urlguard_ready") == 1
    for check in ("filter", "database", "lag"):
        assert value(samples, "urlguard_ready_check", check=check) == 1
    settings.URLGUARD = {**settings.URLGUARD, "READY_MAX_LAG_CHANGES": 0}
    add_rule("later.example/", category="spam", source="test")  # not applied: lag 1
    samples = scrape(client)
    assert value(samples, "urlguard_ready") == 0
    assert value(samples, "urlguard_ready_check", check="lag") == 0
    assert value(samples, "urlguard_ready_check", check="filter") == 1


def test_gunicorn_counts_responses_by_status_class(client, db):
    class Sent:
        def __init__(self, status_code):
            self.status_code = status_code

    before = scrape(client)
    for status in (200, 302, 503, 500, 404):
        gunicornconf.post_request(None, None, {}, Sent(status))
    gunicornconf.post_request(None, None, {}, Sent(None))  # nothing sent: not counted
    after = scrape(client)

    def counted(code):
        name = "urlguard_http_responses_total"
        return value(after, name, code=code) - value(before, name, code=code)

    assert [counted(c) for c in ("2xx", "3xx", "4xx", "5xx")] == [1, 1, 1, 2]
