"""The filter management commands: rebuild_filter, sync_filter, filter_info,
verify_filter, import_rules."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command, load_command_class
from django.core.management.base import SystemCheckError

from filterengine import ScalingCountingBloomFilter
from urlguard.models import ChangeEvent, SpamRule
from urlguard.nodesync import registry, sync
from urlguard.writepath import changes

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("quiet")]

COMMANDS = [
    "rebuild_filter",
    "restore_filter",
    "sync_filter",
    "filter_info",
    "verify_filter",
    "import_rules",
]


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def run(*args, **kwargs) -> tuple[str, str]:
    out, err = kwargs.pop("stdout", io.StringIO()), io.StringIO()
    call_command(*args, stdout=out, stderr=err, **kwargs)
    return out.getvalue(), err.getvalue()


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_help(name):
    command = load_command_class("urlguard", name)
    text = command.create_parser("manage.py", name).format_help()
    assert len(command.help) > 80 and command.help.split()[0] in text


def test_rebuild_filter(filter_path):
    changes.add_rules(["a.example.org", "b.example.org"], source="test")
    out, _ = run("rebuild_filter")
    assert "Rebuilt" in out and "2 rules" in out
    filt = registry.get_filter()
    assert "a.example.org/" in filt and filt.applied_seq == sync.log_head()


def test_rebuild_filter_shows_progress_on_a_terminal(filter_path):
    changes.add_rules([f"h{i}.example.org" for i in range(10)], source="test")
    tty = Tty()
    run("rebuild_filter", stdout=tty)
    assert "\rrules: 10 / 10 (100%)" in tty.getvalue()
    plain, _ = run("rebuild_filter")
    assert "\r" not in plain


def test_sync_filter_applies_pending_changes(filter_path, sync_filter):
    sync_filter()
    changes.add_rule("a.example.org", category="spam")
    out, _ = run("sync_filter")
    assert "applied 1 change(s)" in out
    assert "a.example.org/" in registry.get_filter()


def test_sync_filter_says_when_it_rebuilds(filter_path):
    changes.add_rule("a.example.org", category="spam")
    out, _ = run("sync_filter")
    assert "Rebuilt" in out and "missing" in out


def test_sync_filter_that_cannot_write_says_so(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    path = blocker / "filter.bin"
    with pytest.raises(CommandError, match=f"could not write {path}"):
        run("sync_filter", "--path", str(path))


def test_filter_info(filter_path, sync_filter):
    changes.add_rules(["a.example.org", "b.example.org"], source="test")
    sync_filter()
    changes.add_rule("c.example.org", category="spam")  # pending: lag 1
    out, _ = run("filter_info")
    assert str(filter_path) in out and "clean" in out
    assert f"#{sync.log_head() - 1} of log head #{sync.log_head()}" in out
    assert "1 change(s) pending" in out and "stage" in out
    stage_header = next(line for line in out.splitlines() if line.startswith("stage"))
    assert {"count", "capacity", "fill", "estimated_fpr", "saturated"} <= set(stage_header.split())
    data = json.loads(run("filter_info", "--json")[0])
    assert data["pending_changes"] == 1 and data["rules_in_table"] == 3
    assert data["info"]["stages"][0]["count"] == 2


def test_filter_info_missing_file(filter_path):
    with pytest.raises(CommandError, match="rebuild_filter"):
        run("filter_info")


def test_verify_filter_ok(filter_path, sync_filter):
    changes.add_rules([f"h{i}.example.org" for i in range(50)], source="test")
    sync_filter()
    out, _ = run("verify_filter")
    assert out.startswith("OK: all 50 rules")


def test_verify_filter_reports_missing_rules(filter_path):
    a = changes.add_rule("a.example.org", category="spam")
    b = changes.add_rule("b.example.org", category="spam")
    ScalingCountingBloomFilter.build(
        str(filter_path),
        [(b.expression, b.added_at)],
        capacity=100_000,
        error_rate=0.01,
        applied_seq=sync.log_head(),
    )
    err = io.StringIO()
    with pytest.raises(CommandError, match="1 rule\\(s\\) of the table are not in the filter"):
        call_command("verify_filter", stdout=io.StringIO(), stderr=err)
    assert f"missing: {a.expression}" in err.getvalue()


def test_verify_filter_reports_listings_that_dangle(filter_path, sync_filter):
    from django.db import connection

    from urlguard.models import RuleSource

    changes.add_rules(["a.example.org"], source="test")
    sync_filter()
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {RuleSource._meta.db_table} SET rule_id = rule_id + 1000")
    with pytest.raises(CommandError, match="1 listings of a missing rule \\(a write-path bug"):
        run("verify_filter")


def test_verify_filter_reports_unapplied_removals(filter_path, sync_filter):
    rules = [changes.add_rule(f"h{i}.example.org", category="spam") for i in range(3)]
    sync_filter()
    changes.remove_rule(rules[0])
    with pytest.raises(CommandError, match="removals not applied.*sync_filter"):
        run("verify_filter")
    out, _ = run("verify_filter", "--sync")
    assert out.startswith("OK: all 2 rules")


def test_import_rules(filter_path, tmp_path):
    changes.add_rule("present.example.org", category="spam")
    source = tmp_path / "list.txt"
    source.write_text(
        "# a blocklist\nhttps://evil.example.net/login\npresent.example.org\n"
        "co.uk\n0.0.0.0 ads.example.com\nhttps://evil.example.net/login\n",
        encoding="utf-8",
    )
    out, err = run("import_rules", str(source), "--category", "phishing")
    assert "2 added, 2 skipped (already listed), 1 refused" in out
    assert "co.uk" in err and "line 4" in err
    assert SpamRule.objects.get(expression="ads.example.com/").category == "phishing"
    assert SpamRule.objects.get(expression="ads.example.com/").source == "import:list.txt"
    # The filter follows the import (nudges applied here by hand).
    sync.sync(path=str(filter_path))
    assert "ads.example.com/" in registry.get_filter()


def test_import_rules_dry_run_writes_nothing(tmp_path):
    source = tmp_path / "list.txt"
    source.write_text("a.example.org\nb.example.org\n", encoding="utf-8")
    out, _ = run("import_rules", str(source), "--dry-run")
    assert out.startswith("Dry run: 2 would be added")
    assert not SpamRule.objects.exists() and not ChangeEvent.objects.exists()


def test_import_rules_bad_input(tmp_path):
    with pytest.raises(CommandError, match="no such file"):
        run("import_rules", str(tmp_path / "absent.txt"))
    with pytest.raises(CommandError, match="is a directory"):
        run("import_rules", str(tmp_path))
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9.example.org\n".encode("latin-1"))
    with pytest.raises(CommandError, match="not UTF-8"):
        run("import_rules", str(latin))


@pytest.mark.parametrize("args", [["rebuild_filter"], ["sync_filter"], ["verify_filter", "--sync"]])
def test_a_busy_writer_lock_is_a_command_error(filter_path, monkeypatch, args):
    def busy(*a, **k):
        raise registry.WriterBusy(f"{filter_path} is locked by another writer (waited 30 s)")

    monkeypatch.setattr(sync, "sync", busy)
    with pytest.raises(CommandError, match="locked by another writer"):
        run(*args)


def test_import_rules_reads_standard_input_as_strict_utf8(monkeypatch):
    data = "\ufeffurl,category\nevil.example,phishing\n".encode() + b"caf\xe9.example,spam\n"
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), errors="surrogateescape"))
    with pytest.raises(CommandError, match="stdin is not UTF-8"):
        run("import_rules", "-", "--dry-run")
    good = "\ufeffurl,category\nevil.example,phishing\n".encode()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(good)))
    out, _ = run("import_rules", "-", "--dry-run")
    assert out.startswith("Dry run: 1 would be added")


@pytest.fixture
def unwritable_filter_dir(settings, tmp_path):
    """FILTER_PATH in a directory that cannot be created (its parent is a file): the
    system check urlguard.E001 fails, even for root."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    settings.URLGUARD = {**settings.URLGUARD, "FILTER_PATH": str(blocker / "filter.bin")}


@pytest.mark.parametrize(
    "args", [["filter_info"], ["verify_filter"], ["check_url", "http://a.example/"]]
)
def test_read_only_diagnostics_run_where_the_filter_cannot_be_written(unwritable_filter_dir, args):
    try:
        run(*args, skip_checks=False)
    except SystemCheckError:  # a CommandError, so first
        raise
    except CommandError as exc:  # the diagnostic ran and says what it found
        assert "does not exist" in str(exc)


@pytest.mark.parametrize("args", [["sync_filter"], ["rebuild_filter"], ["verify_filter", "--sync"]])
def test_commands_that_write_still_refuse_to_run_there(unwritable_filter_dir, args):
    with pytest.raises(SystemCheckError, match="urlguard.E001"):
        run(*args, skip_checks=False)
