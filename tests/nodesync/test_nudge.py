"""urlguard.nodesync.nudge: a rule write never waits more than a second for its nudge, and
the admin says what is true when the nodes could not be told."""

from __future__ import annotations

import time

import pytest
from django.urls import reverse

from tests.support.broker import broker
from urlguard.models import SpamRule
from urlguard.nodesync import embedded, nudge, registry, sync
from urlguard.writepath import changes

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("scheme", ["redis", "amqp"])
@pytest.mark.parametrize("socket_timeout", [nudge.SOCKET_TIMEOUT, 30.0], ids=["socket", "deadline"])
def test_a_hung_broker_holds_an_edit_at_most_a_second(
    silent_broker, scheme, socket_timeout, committed, filter_path, caplog, monkeypatch
):
    # The socket timeouts free the sending thread; the deadline frees the request
    # even where a transport would ignore them.
    monkeypatch.setattr(nudge, "SOCKET_TIMEOUT", socket_timeout)
    with broker(f"{scheme}://127.0.0.1:{silent_broker}/0"):
        started = time.monotonic()
        with committed():
            rule = changes.add_rule("a.example.org", category="spam", source="test")
        took = time.monotonic() - started
    assert took < nudge.NUDGE_TIMEOUT + 0.5
    assert SpamRule.objects.filter(pk=rule.pk).exists()  # the edit stands
    outcome = nudge.last_outcome()
    assert not outcome.delivered
    if socket_timeout > nudge.NUDGE_TIMEOUT:
        assert "did not answer within 1 s" in outcome.detail
    assert "nudge failed" in caplog.text
    words = nudge.when_applied()
    # The catch-up is a beat broadcast through the same broker: it waits too.
    assert "when the broker answers again" in words and "catch-up" not in words
    assert "`manage.py sync_filter` on each node applies it now" in words


def test_a_refused_connection_is_told_too(committed, filter_path):
    with broker("redis://127.0.0.1:1/0"), committed():
        changes.add_rule("a.example.org", category="spam", source="test")
    assert not nudge.last_outcome().delivered
    assert "the broker did not take the nudge" in nudge.when_applied()


# Real commits: the nudge runs when add_rule's transaction commits, before the
# admin words its message, as it does in production.
@pytest.mark.django_db(transaction=True)
def test_the_admin_says_what_is_true_when_the_nudge_failed(silent_broker, superuser, filter_path):
    with broker(f"redis://127.0.0.1:{silent_broker}/0"):
        page = superuser.post(
            reverse("admin:urlguard_spamrule_add"),
            {
                "url": "http://evil.example.org/",
                "expression": "evil.example.org/",
                "category": "spam",
            },
            follow=True,
        )
    html = page.content.decode()
    assert SpamRule.objects.filter(expression="evil.example.org/").exists()
    assert "the nodes apply it when the broker answers again" in html
    assert "`manage.py sync_filter` on each node applies it now" in html
    assert "Nodes apply it within seconds" not in html


@pytest.mark.django_db(transaction=True)
def test_the_admin_says_within_seconds_when_it_was_applied(superuser, filter_path):
    page = superuser.post(
        reverse("admin:urlguard_spamrule_add"),
        {
            "url": "http://evil.example.org/",
            "expression": "evil.example.org/",
            "category": "spam",
        },
        follow=True,
    )
    assert "Nodes apply it within seconds" in page.content.decode()
    assert nudge.last_outcome().delivered
    assert "evil.example.org/" in registry.get_filter()


def test_in_process_a_busy_file_hands_the_change_to_the_catch_up_thread(
    filter_path, committed, monkeypatch
):
    sync.sync(path=str(filter_path))
    assert registry.get_filter(str(filter_path)) is not None  # mapped before the change
    woken = []
    monkeypatch.setattr(embedded, "wake", lambda: woken.append(True))
    with registry.sync_lock(str(filter_path)):  # e.g. a rebuild in another process
        started = time.monotonic()
        with committed():
            changes.add_rule("a.example.org", category="spam", source="test")
        assert time.monotonic() - started < nudge.NUDGE_TIMEOUT + 0.5
    assert woken == [True] and not nudge.last_outcome().delivered
