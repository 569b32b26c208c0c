"""The feed commands (add_feed, refresh_feeds, feeds_info), the Celery tasks and the
embedded runner that refresh due sources."""

from __future__ import annotations

import contextlib
import io
import json
import re

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import OperationalError, connection
from django.urls import reverse
from django.utils import timezone

from tests.support.faults import fail_on_call
from tests.support.feedserver import fixture
from urlguard.feeds import runner, tasks
from urlguard.feeds.interval import human_interval
from urlguard.feeds.outcome import RefreshResult, RefreshStatus, rules_left
from urlguard.models import AdminJob, ChangeSet, Source, SpamRule
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
    with pytest.raises(CommandError, match="At least 1 min"):
        run("add_feed", "x", "https://example.org/list", "--interval", "5")
    with pytest.raises(CommandError):
        run("add_feed", "x", "https://example.org/list", "--format", "csv-of-sorts")


@pytest.mark.parametrize(
    ("typed", "seconds"),
    [("90s", 90), ("15 min", 900), ("2h", 7200), ("1d", 86400), ("600", 600), ("1.5 h", 5400)],
)
def test_add_feed_takes_an_interval_as_a_person_types_it(typed, seconds):
    out = run("add_feed", "f", "https://feeds.example/f.txt", "--interval", typed)
    assert Source.objects.get(name="f").interval == seconds
    assert f"every {human_interval(seconds)}" in out


@pytest.mark.parametrize(
    ("typed", "words"),
    [
        ("10s", "At least 1 min and at most 30 d: '10s' is 10 s"),
        ("31 d", "at most 30 d"),
        ("0", "At least 1 min"),
        ("soon", "'soon' is no interval: give a number and a unit: 90 s, 15 min, 1 h or 1 d"),
        ("-1 h", "is no interval"),
        ("1 week", "is no interval"),
        ("9" * 100, "is no interval"),
    ],
)
def test_add_feed_refuses_a_bad_interval_saying_what_is_accepted(typed, words):
    with pytest.raises(CommandError, match=re.escape(words)):
        run("add_feed", "f", "https://feeds.example/f.txt", "--interval", typed)
    assert not Source.objects.filter(name="f").exists()


@pytest.mark.parametrize("typed", ["10s", "59 s", "60", "15 min", "2h", "1d", "30 d", "31d", "x"])
def test_add_feed_and_the_admin_form_agree_on_every_interval(typed, make_staff):
    with contextlib.suppress(CommandError):
        run("add_feed", "cli", "https://feeds.example/f.txt", "--interval", typed)
    data = {"name": "form", "kind": "feed", "url": "https://feeds.example/f.txt"}
    data |= {"format": "auto", "category": "spam", "interval": typed, "enabled": "on"}
    make_staff(superuser=True).post(reverse("admin:urlguard_source_add"), data)
    cli = Source.objects.filter(name="cli").values_list("interval", flat=True).first()
    form = Source.objects.filter(name="form").values_list("interval", flat=True).first()
    assert cli == form


def test_add_feed_refuses_a_file_url_outside_the_feed_file_root(settings, tmp_path):
    with pytest.raises(CommandError, match=re.escape("URLGUARD['FEED_FILE_ROOT'] names no folder")):
        run("add_feed", "x", "file:///etc/passwd")
    root = tmp_path / "feeds"
    root.mkdir()
    (root / "link").symlink_to("/etc/passwd")
    settings.URLGUARD = {**settings.URLGUARD, "FEED_FILE_ROOT": str(root)}
    for url in ("file:///etc/passwd", f"file://{root}/../x.txt", f"file://{root}/link"):
        with pytest.raises(CommandError, match="not beneath FEED_FILE_ROOT"):
            run("add_feed", "x", url)
    with pytest.raises(CommandError, match="a file on this server, not on example.org"):
        run("add_feed", "x", "file://example.org/list.txt")
    with pytest.raises(CommandError, match="cannot read"):
        run("add_feed", "x", f"file://{root}/a%00b")  # a NUL: no file name holds one
    assert not Source.objects.filter(name="x").exists()
    # Beneath the root, even before the file is there (a job may write it later).
    run("add_feed", "x", f"file://{root}/later.txt")
    assert Source.objects.get(name="x").url == f"file://{root}/later.txt"


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
    with pytest.raises(CommandError, match="1 of 1 refresh.*: f: its rules are unchanged$"):
        run("refresh_feeds", "f")
    assert SpamRule.objects.count() == 1


def test_refresh_feeds_failing_mid_load_says_what_it_committed(server, monkeypatch):
    # The database goes away after the first chunk committed (PostgreSQL restarting).
    server.serve("/l", "".join(f"h{i}.example\n" for i in range(7)).encode())
    run("add_feed", "f", server.url("/l"))
    add_listed = changes.add_listed
    monkeypatch.setattr(
        changes, "add_listed", lambda *args, **kw: add_listed(*args, **{**kw, "chunk_size": 3})
    )
    chunk = "_add_listed_chunk" if connection.vendor == "postgresql" else "_add_chunk"
    lost = OperationalError("server closed the connection unexpectedly")
    fail_on_call(monkeypatch, changes, chunk, 2, lost)
    out = io.StringIO()
    with pytest.raises(CommandError) as failed:
        call_command("refresh_feeds", "f", stdout=out, stderr=io.StringIO())
    assert SpamRule.objects.count() == 3
    cs = ChangeSet.objects.get()
    assert str(failed.value) == (
        f"1 of 1 refresh(es) failed: f: partial: rules 3 added, none removed committed in "
        f"change set #{cs.pk}; `manage.py refresh_feeds f` again finishes it"
    )
    assert (
        f"\n  partial: rules 3 added, none removed committed in change set #{cs.pk}; "
        "`manage.py refresh_feeds f` again finishes it\n"
    ) in out.getvalue()
    assert "partial: 3 rules of a refresh interrupted" in run("feeds_info")
    out = run("refresh_feeds", "f")
    assert "f: ok" in out and SpamRule.objects.count() == 7
    cs.refresh_from_db()
    assert cs.finished is not None and cs.added == 7  # finished in the same set


def test_what_a_failed_refresh_left_is_read_from_its_change_set(monkeypatch):
    failed = RefreshResult(source="f", status=RefreshStatus.FAILED)
    assert rules_left(failed) == "its rules are unchanged"  # it failed before it wrote
    cs = ChangeSet.objects.create(kind=ChangeSet.Kind.REFRESH, finished=None)
    failed.change_set = cs.pk
    assert rules_left(failed) == "its rules are unchanged"  # nothing committed yet
    # It failed after its writes ended (recording what it refused, say).
    ChangeSet.objects.filter(pk=cs.pk).update(added=5, removed=2, finished=timezone.now())
    assert rules_left(failed) == (
        f"its rules changed all the same: rules 5 added, 2 removed in change set #{cs.pk}"
    )

    def unreachable(*args, **kwargs):
        raise OperationalError("connection refused")

    monkeypatch.setattr(ChangeSet.objects, "filter", unreachable)
    assert rules_left(failed) == (
        f"perhaps partial: change set #{cs.pk} may hold some of its rules (the database did "
        "not answer); `manage.py refresh_feeds f` again finishes it"
    )


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


def test_feeds_info_name_shows_that_source_only(server):
    server.serve("/l", b"a.example\n")
    run("add_feed", "one", server.url("/l"))
    run("add_feed", "two", server.url("/l"))
    text = run("feeds_info", "two")
    assert text.startswith("two ") and "one " not in text and "admin " not in text
    rows = json.loads(run("feeds_info", "one", "two", "--json"))
    assert [r["name"] for r in rows] == ["one", "two"]
    with pytest.raises(CommandError, match=r"no source named 'nope' \(sources: admin, .*one, two"):
        run("feeds_info", "nope", "one")


def test_the_readmes_alert_table_names_commands_that_take_what_it_gives(server):
    """Every `manage.py feeds_info ...` README suggests runs as written."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    server.serve("/l", b"a.example\n")
    run("add_feed", "NAME", server.url("/l"))
    suggested = re.findall(r"`manage\.py (feeds_info[^`]*)`", readme)
    assert "feeds_info NAME" in suggested
    for command in suggested:
        assert "NAME" in run(*command.split()), command


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
