"""The feed commands (add_feed, refresh_feeds, feeds_info), the Celery tasks and the
embedded runner that refresh due sources."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.service.feedserver import fixture
from urlguard.feeds import runner, tasks
from urlguard.models import AdminJob, Source, SpamRule
from urlguard.writepath import changes

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("quiet")]


def run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_add_feed_then_refresh_feeds(server):
    url = server.serve("/urlhaus.csv", fixture("urlhaus.csv"))
    out = run("add_feed", "urlhaus", url, "--interval", "300", "--category", "malware")
    assert "Added feed 'urlhaus'" in out and "refresh_feeds urlhaus" in out
    source = Source.objects.get(name="urlhaus")
    assert (source.kind, source.format, source.interval, source.category) == (
        "feed",
        "auto",
        300,
        "malware",
    )
    out = run("refresh_feeds", "urlhaus")
    assert (
        "urlhaus: ok: 6 entries (urlhaus-csv): 6 added, none removed, none unchanged, 1 refused"
        in out
    )
    assert "refused line 15" in out
    assert SpamRule.objects.count() == 6
    assert "not modified" not in run("refresh_feeds", "urlhaus")  # no validators served


def test_add_feed_options_and_refusals(server):
    run("add_feed", "allow", server.url("/a"), "--allowlist", "--format", "hosts")
    assert Source.objects.get(name="allow").is_allowlist
    with pytest.raises(CommandError, match="already exists"):
        run("add_feed", "allow", server.url("/a"))
    with pytest.raises(CommandError, match="http://, https:// or file"):
        run("add_feed", "x", "ftp://example.org/list")
    with pytest.raises(CommandError, match="at least 60"):
        run("add_feed", "x", "https://example.org/list", "--interval", "5")
    with pytest.raises(CommandError):
        run("add_feed", "x", "https://example.org/list", "--format", "csv-of-sorts")


def test_add_feed_with_refresh(server):
    url = server.serve("/p.json", fixture("phishtank.json"))
    out = run("add_feed", "phishtank", url, "--format", "phishtank-json", "--refresh")
    assert "phishtank: ok: 3 entries" in out
    assert set(SpamRule.objects.values_list("category", flat=True)) == {"phishing"}


def test_refresh_feeds_dry_run_and_accept_shrink(server):
    hosts = [f"h{i}.example" for i in range(10)]
    server.serve("/l", "".join(f"{h}\n" for h in hosts).encode())
    run("add_feed", "f", server.url("/l"))
    out = run("refresh_feeds", "--dry-run")
    assert "dry run (nothing applied)" in out and not SpamRule.objects.exists()
    run("refresh_feeds")
    server.serve("/l", b"h0.example\n")
    out = run("refresh_feeds", "f")
    assert "HELD" in out and "--accept-shrink" in out and SpamRule.objects.count() == 10
    out = run("refresh_feeds", "f", "--accept-shrink")
    assert "f: ok" in out and SpamRule.objects.count() == 1


def test_refresh_feeds_failure_is_an_error_exit_and_keeps_rules(server):
    server.serve("/l", b"a.example\n")
    run("add_feed", "f", server.url("/l"))
    run("refresh_feeds", "f")
    server.routes["/l"] = (503, {}, b"")
    with pytest.raises(CommandError, match="1 of 1 refresh"):
        run("refresh_feeds", "f")
    assert SpamRule.objects.count() == 1


def test_refresh_feeds_unknown_or_manual_names():
    with pytest.raises(CommandError, match="no source named 'nope'"):
        run("refresh_feeds", "nope")
    with pytest.raises(CommandError, match="manual source"):
        run("refresh_feeds", "admin")
    assert "No enabled feeds" in run("refresh_feeds")


def test_feeds_info(server):
    server.serve("/l", b"a.example\nb.example\n")
    run("add_feed", "f", server.url("/l"))
    assert "never refreshed" in run("feeds_info")
    run("refresh_feeds", "f")
    changes.add_rule("c.example/", category="spam")
    rows = {r["name"]: r for r in json.loads(run("feeds_info", "--json"))}
    assert rows["f"]["health"] == "ok" and rows["f"]["rules_listed"] == 2
    assert rows["admin"]["rules_listed"] == 1 and rows["admin"]["health"] == "manual"
    server.routes["/l"] = (500, {}, b"")
    for _ in range(3):
        with pytest.raises(CommandError):
            run("refresh_feeds", "f")
    text = run("feeds_info")
    assert "failing" in text and "3 in a row" in text and "HTTP 500" in text


def test_due_sources_are_refreshed_by_the_task_and_the_runner(server):
    server.serve("/l", b"a.example\n")
    run("add_feed", "f", server.url("/l"))
    run("add_feed", "off", server.url("/l"))
    Source.objects.filter(name="off").update(enabled=False)
    assert tasks.refresh_due_feeds.apply().get() == ["f"]
    assert SpamRule.objects.count() == 1
    assert tasks.refresh_due_feeds.apply().get() == []  # not due again for an hour
    Source.objects.filter(name="f").update(last_refresh_at=None)
    assert runner.run_once() == ["f"]


def test_refresh_task_reports_to_an_admin_job(server):
    server.serve("/l", b"a.example\nb.example\n")
    run("add_feed", "f", server.url("/l"))
    job = AdminJob.objects.create(kind=AdminJob.Kind.REFRESH)
    tasks.refresh_feed.apply(args=[Source.objects.get(name="f").pk], kwargs={"job_id": job.pk})
    job.refresh_from_db()
    assert job.state == "done" and "f: ok" in job.message and job.result["added"] == 2
