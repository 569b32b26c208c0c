"""The exports are rendered ahead of their pollers: a node that applies changes (the
worker's task, the embedded default's nudge, a catch-up) asks its pre-render thread,
which renders each export of EXPORTS_PRERENDER at the new position; a poll after it
is served that file without a render in its request."""

from __future__ import annotations

import logging

import pytest
from django.test import Client

from urlguard.exports import prerender, render
from urlguard.exports.catalog import EXPORTS
from urlguard.exports.projection import current_position
from urlguard.nodesync import sync
from urlguard.writepath import changes
from urlguard_service.celery import app as celery_app

# The autouse `prerender_requests` fixture replaces it; a test here may want it back.
REAL_REQUEST = prerender.request


def add(text: str) -> None:
    changes.add_rule(text, category="spam", source="test")


def rendered_now(name: str) -> bool:
    return render.rendered_path(name, current_position().key).exists()


@pytest.mark.django_db
def test_applying_changes_asks_for_a_prerender_and_a_no_op_does_not(
    prerender_requests, filter_path
):
    add("one.example/")
    sync.sync_and_report(sync.log_head())
    assert len(prerender_requests) == 1
    # A late duplicate nudge: nothing applied, nothing to render.
    sync.sync_and_report(sync.log_head())
    assert len(prerender_requests) == 1
    # The worker's task is the same call.
    add("two.example/")
    celery_app.tasks["urlguard.tasks.apply_changes"].apply(kwargs={"up_to_seq": None}).get()
    assert len(prerender_requests) == 2
    # A periodic catch-up asks too (a node just booted, or a render lost to a kill).
    sync.sync_and_report(periodic=True)
    assert len(prerender_requests) == 3


@pytest.mark.django_db
def test_render_all_renders_the_configured_exports_at_the_current_position(settings):
    add("one.example/")
    settings.URLGUARD = {**settings.URLGUARD, "EXPORTS_PRERENDER": ["hosts.txt", "abp.txt"]}
    done = prerender.render_all()
    assert [r.path.parent.name for r in done] == ["hosts.txt", "abp.txt"]
    assert rendered_now("hosts.txt") and rendered_now("abp.txt")
    assert not rendered_now("domains.txt")
    # Rendered already: a second round renders nothing again.
    before = {r.path: r.path.stat().st_mtime_ns for r in done}
    prerender.render_all()
    assert {r.path: r.path.stat().st_mtime_ns for r in done} == before


@pytest.mark.django_db(transaction=True)
def test_the_thread_renders_after_a_nudge_and_the_poll_renders_nothing(
    monkeypatch, settings, filter_path, django_capture_on_commit_callbacks
):
    settings.URLGUARD = {**settings.URLGUARD, "EXPORTS_OPEN": True}
    monkeypatch.setattr(prerender, "request", REAL_REQUEST)
    client = Client()
    with django_capture_on_commit_callbacks(execute=True):
        add("old.example/")
    assert prerender.wait(30)
    assert all(rendered_now(name) for name in EXPORTS)
    with django_capture_on_commit_callbacks(execute=True):
        add("new.example/")  # the embedded default: the nudge applies it, in-process
    assert prerender.wait(30)
    monkeypatch.setattr(render, "render", lambda *a: pytest.fail("rendered in a request"))
    response = client.get("/lists/hosts.txt")
    text = b"".join(response.streaming_content).decode()
    assert "0.0.0.0 new.example" in text
    assert response["X-URLGuard-Position"] == str(sync.log_head())


@pytest.mark.django_db
def test_a_node_with_no_render_yet_answers_503_without_rendering_in_the_request(
    prerender_requests, monkeypatch, settings
):
    settings.URLGUARD = {**settings.URLGUARD, "EXPORTS_OPEN": True}
    add("one.example/")
    monkeypatch.setattr(render, "COLD_WAIT", 0.2)
    monkeypatch.setattr(render, "render", lambda *a: pytest.fail("rendered in a request"))
    response = Client().get("/lists/hosts.txt")
    assert response.status_code == 503 and response["Retry-After"] == "30"
    assert "first render of hosts.txt" in response.content.decode()
    assert prerender_requests  # the pre-render was asked for it


@pytest.mark.django_db
def test_a_list_left_out_of_the_prerender_is_rendered_by_its_first_poll(
    prerender_requests, settings
):
    settings.URLGUARD = {
        **settings.URLGUARD,
        "EXPORTS_OPEN": True,
        "EXPORTS_PRERENDER": ["abp.txt"],
    }
    client = Client()
    add("one.example/")
    assert "one.example" in b"".join(client.get("/lists/hosts.txt").streaming_content).decode()
    add("two.example/")
    assert "two.example" in b"".join(client.get("/lists/hosts.txt").streaming_content).decode()
    assert not prerender_requests


def test_the_settings_name_every_export_of_the_catalog():
    from urlguard.conf import EXPORT_NAMES

    assert tuple(EXPORTS) == EXPORT_NAMES


def test_the_app_hooks_the_prerender_to_the_node_sync_once():
    assert sync.AFTER_CHANGES.count(prerender.after_changes) == 1


def test_rounds_failing_alike_are_logged_once_then_their_recovery(monkeypatch, caplog):
    """A full disk or the database away fails every round: one ERROR with its
    traceback, not one per round; then one line when a round works again."""
    monkeypatch.setattr(prerender, "request", REAL_REQUEST)
    failing = [True]

    def round_():
        if failing[0]:
            raise prerender.PrerenderFailed("rpz.zone: OSError: [Errno 28] No space left")
        return []

    monkeypatch.setattr(prerender, "render_all", round_)
    with caplog.at_level(logging.INFO, "urlguard.exports.prerender"):
        for _ in range(5):
            prerender.request()
            assert prerender.wait(30)
        failing[0] = False
        prerender.request()
        assert prerender.wait(30)
    lines = [r for r in caplog.records if r.name == "urlguard.exports.prerender"]
    assert [r.levelno for r in lines] == [logging.ERROR, logging.WARNING]
    assert "No space left" in lines[0].getMessage() and lines[0].exc_info
    assert (
        lines[1].getMessage() == "pre-rendering the exports works again after 0 s and 5 failure(s)"
    )


@pytest.mark.django_db
def test_one_export_failing_leaves_the_others_rendered(monkeypatch):
    add("one.example/")
    real = render.render
    monkeypatch.setattr(
        render,
        "render",
        lambda e, d: real(e, d) if e.name != "rpz.zone" else (_ for _ in ()).throw(OSError("full")),
    )
    with pytest.raises(prerender.PrerenderFailed, match="rpz.zone: OSError: full"):
        prerender.render_all()
    assert all(rendered_now(name) for name in EXPORTS if name != "rpz.zone")
    assert not rendered_now("rpz.zone")
