"""The filter dashboard: the SVG stage chart, this node's file, every node's lag,
and the Sync / Rebuild buttons with their permissions."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from urlguard.admin.charts import StageBar, format_rate, render_stage_chart
from urlguard.models import NodeStatus
from urlguard.nodesync import nodestatus, sync
from urlguard.writepath import changes

DASHBOARD = reverse("admin:urlguard_spamrule_dashboard")
SYNC = reverse("admin:urlguard_spamrule_dashboard_sync")
REBUILD = reverse("admin:urlguard_spamrule_dashboard_rebuild")
STATUS = reverse("admin:urlguard_spamrule_dashboard_status")


def _bars(svg: str) -> list[str]:
    return re.findall(r'<rect class="bar"[^>]*width="([0-9.]+)"', svg)


def test_chart_has_one_bar_per_stage_sized_by_load():
    stages = [
        StageBar(0, 1, 99, 50, 100, 7, 0.25),
        StageBar(1, 100, None, 10, 200, 8, 0.95),
        StageBar(2, None, None, 0, 400, 9, 0.0),
    ]
    svg = str(render_stage_chart(stages))
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    widths = [float(w) for w in _bars(svg)]
    # Rules held against capacity: 50%, 5%, nothing.
    assert len(widths) == 3 and widths[1] == pytest.approx(widths[0] * 0.05 / 0.5, rel=1e-3)
    assert widths[2] == 0
    fills = [float(w) for w in re.findall(r'<rect class="fill"[^>]*width="([0-9.]+)"', svg)]
    assert fills[1] == pytest.approx(fills[0] * 0.95 / 0.25, rel=1e-3)
    assert "50 / 100 rules (50%)" in svg and "95.0% of counters set · k=8" in svg
    assert "no ids yet" not in svg and "empty" in svg


def test_a_full_stage_reads_as_full_not_as_its_low_fill_ratio():
    # A stage at capacity has well under half of its counters set, by design: the
    # chart must still show it full (it was drawn as an 11% bar before).
    full, open_ = (
        StageBar(0, 1, 999, 1000, 1000, 4, 0.116, 1.8e-4, error_rate=0.005),
        StageBar(1, 1000, None, 1501, 2000, 4, 0.091, 6.7e-5, error_rate=0.004),
    )
    svg = str(render_stage_chart([full, open_]))
    widths = [float(w) for w in _bars(svg)]
    assert widths[0] == pytest.approx(420) and widths[1] == pytest.approx(420 * 0.7505, abs=0.1)
    assert 'class="stage stage-closed"' in svg and 'class="stage stage-ok"' in svg
    nearly = StageBar(1, 1000, None, 1900, 2000, 4, 0.2, 1e-4, error_rate=0.004)
    assert "stage-nearly-full" in str(render_stage_chart([full, nearly]))


def test_a_stage_over_its_false_positive_target_is_red_and_says_rebuild():
    over = StageBar(0, 1, None, 900, 1000, 4, 0.6, estimated_fpr=0.13, error_rate=0.01)
    svg = str(render_stage_chart([over]))
    assert 'class="stage stage-over"' in svg and "#ba2121" in svg
    assert "above target: rebuild" in svg


def test_ids_read_as_times_and_rates_stay_readable():
    stage = StageBar(0, 1_700_000_000_000_000, None, 1, 10, 7, 0.1, estimated_fpr=3e-9)
    assert stage.time_range == "added 2023-11-14 22:13:20 → … UTC"
    assert stage.fpr_text == "0.0000003% (about 1 in 330,000,000)"
    assert format_rate(0.0123) == "1.23%" and format_rate(0) == "0%"
    assert format_rate(9.8e-6) == "0.00098% (about 1 in 100,000)"
    assert format_rate(6.7e-5) == "0.0067% (about 1 in 15,000)"
    assert "e-" not in format_rate(1e-15)
    assert format_rate(3.57e-26) == "<0.0000001% (fewer than 1 in a billion)"
    assert format_rate(3.3e-9) == "0.0000003% (about 1 in 300,000,000)"


def test_chart_without_stages_says_so():
    svg = str(render_stage_chart([]))
    assert "no stages" in svg.lower() and not _bars(svg)


@pytest.mark.django_db
def test_dashboard_shows_the_file_stages_and_nodes(editor, build_filter, settings):
    for i in range(30):
        changes.add_rule(f"spam{i}.example.com/", category="spam")
    filt = build_filter()
    nodestatus.report_status()
    page = editor.get(DASHBOARD)
    assert page.status_code == 200
    html = page.content.decode()
    stages = filt.info()["stages"]
    assert len(_bars(html)) == len(stages) >= 1
    assert 'id="fp-rate"' in html and 'id="file-size"' in html
    # Each stage's rate beside the rate it was sized for (the engine's error_rate).
    assert html.count("target ") >= len(stages) and "30 / " in html
    node = NodeStatus.objects.get()
    assert f'data-node="{node.node}"' in html
    assert 'name="sync"' in html
    assert 'name="rebuild"' not in html and "Rebuilding needs a superuser" in html


@pytest.mark.django_db
def test_superuser_gets_the_rebuild_button(superuser):
    assert 'name="rebuild"' in superuser.get(DASHBOARD).content.decode()


@pytest.mark.django_db
def test_dashboard_without_a_filter_file_explains(editor):
    html = editor.get(DASHBOARD).content.decode()
    assert "is missing" in html and "rebuild_filter" in html


@pytest.mark.django_db
def test_dashboard_reports_lag(editor, build_filter):
    changes.add_rule("one.example.com/", category="spam")
    build_filter()
    nodestatus.report_status()
    changes.add_rule("two.example.com/", category="spam")  # not applied (no commit hooks)
    data = editor.get(STATUS).json()
    assert data["head"] == 2 and [n["lag"] for n in data["nodes"]] == [1]


@pytest.mark.django_db
def test_sync_now_applies_pending_changes(editor, build_filter):
    changes.add_rule("one.example.com/", category="spam")
    build_filter()
    changes.add_rule("two.example.com/", category="spam")
    response = editor.post(SYNC, follow=True)
    assert response.status_code == 200
    assert "Sync finished" in response.content.decode()
    assert NodeStatus.objects.get().applied_seq == 2


@pytest.mark.django_db
def test_sync_needs_post_and_staff(editor, client):
    assert editor.get(SYNC).status_code == 405
    assert client.post(SYNC).status_code == 302  # to the login page


@pytest.mark.django_db
def test_rebuild_is_for_superusers_or_the_rebuild_permission(editor, make_staff, superuser):
    changes.add_rule("one.example.com/", category="spam")
    assert editor.post(REBUILD).status_code == 403
    assert not NodeStatus.objects.exists()
    done = superuser.post(REBUILD, follow=True)
    assert "Rebuild finished" in done.content.decode()
    status = NodeStatus.objects.get()
    assert status.applied_seq == 1 and status.last_rebuild_seconds is not None
    granted = make_staff("view_spamrule", "rebuild_filter")
    assert granted.post(REBUILD).status_code == 302
    assert Permission.objects.filter(codename="rebuild_filter").exists()


@pytest.mark.django_db
def test_a_failing_task_is_a_message_not_a_traceback(superuser, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(sync, "sync", broken)
    page = superuser.post(REBUILD, follow=True)
    assert page.status_code == 200 and "disk full" in page.content.decode()


@pytest.mark.django_db
def test_filter_and_table_counts_side_by_side(editor, build_filter):
    from django.db import connection

    from urlguard.models import SpamRule

    for i in range(3):
        changes.add_rule(f"c{i}.example.com/", category="spam")
    build_filter()
    html = editor.get(DASHBOARD).content.decode()
    assert "3 (spam table: 3)" in html and "disagree" not in html
    changes.add_rule("pending.example.com/", category="spam")  # not applied yet: lag 1
    assert "disagree" not in editor.get(DASHBOARD).content.decode()
    build_filter()
    # A row deleted around urlguard.writepath.changes (raw SQL, no ChangeEvent): the log says
    # "up to date", only the counts show that the filter holds a rule too many.
    from urlguard.models import RuleSource

    with connection.cursor() as cursor:
        # Its provenance row too, or the foreign key would dangle.
        cursor.execute(
            f"DELETE FROM {RuleSource._meta.db_table} WHERE rule_id IN (SELECT id FROM "
            f"{SpamRule._meta.db_table} WHERE expression = %s)",
            ["c0.example.com/"],
        )
        cursor.execute(
            f"DELETE FROM {SpamRule._meta.db_table} WHERE expression = %s", ["c0.example.com/"]
        )
    html = editor.get(DASHBOARD).content.decode()
    assert "4 (spam table: 3)" in html and "the filter and the table disagree" in html
