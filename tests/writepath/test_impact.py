"""urlguard.writepath.impact: the short links a change to the spam table would block or unblock,
found through the link index (or directly for a small table) and matched exactly."""

from __future__ import annotations

import pytest
from django.utils import timezone

from urlguard.models import Click, ShortLink
from urlguard.writepath import changes, impact

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("quiet")]


@pytest.fixture(autouse=True)
def _fresh_index():
    impact.reset()
    yield
    impact.reset()


@pytest.fixture
def links(db):
    made = [
        ShortLink.objects.create(slug=f"g{i}", destination=f"https://docs.google.com/forms/d/{i}")
        for i in range(5)
    ]
    made += [
        ShortLink.objects.create(slug=f"e{i}", destination=f"https://www.evil.example/p/{i}?x=1")
        for i in range(3)
    ]
    made.append(
        ShortLink.objects.create(
            slug="off", destination="https://www.evil.example/off", disabled=True
        )
    )
    made.append(ShortLink.objects.create(slug="clean", destination="https://clean.example/"))
    for link in made[:2]:
        Click.objects.create(link=link, visitor="v1")
        Click.objects.create(link=link, visitor="v2")
    old = Click.objects.create(link=made[0], visitor="v3")
    Click.objects.filter(pk=old.pk).update(at=timezone.now() - impact.CLICK_WINDOW * 2)
    return made


@pytest.mark.parametrize("indexed", [False, True])
def test_adding(links, indexed):
    if indexed:
        assert impact.build_link_index().link_count == len(links)
    added = impact.impact_of_adding(["google.com/"])
    assert (added.links, added.clicks, added.covered) == (5, 4, 0)
    assert added.text() == "Would block 5 short links (4 clicks in the last 30 days)."
    evil = impact.impact_of_adding(["evil.example/", "www.evil.example/p/1?x=1"])
    assert (evil.links, evil.disabled, evil.per_rule) == (
        3,
        1,
        {"evil.example/": 4, "www.evil.example/p/1?x=1": 1},
    )
    assert impact.impact_of_adding(["evil.example/nothing/"]).links == 0


def test_already_and_still_blocked(links):
    impact.build_link_index()
    changes.add_rule("www.evil.example/p/", category="spam")
    added = impact.impact_of_adding(["evil.example/"])
    assert (added.links, added.covered, added.changed) == (3, 3, 0)
    assert "3 of them already blocked by another rule" in added.text()
    assert {s["other_rule"] for s in added.samples} == {"www.evil.example/p/"}
    changes.add_rule("evil.example/", category="spam")
    removed = impact.impact_of_removing(["www.evil.example/p/"])
    assert (removed.links, removed.covered, removed.changed) == (3, 3, 0)
    assert "3 stay blocked by another rule" in removed.text()
    both = impact.impact_of_removing(["www.evil.example/p/", "evil.example/"])
    assert (both.links, both.covered, both.changed) == (3, 0, 3)
    assert both.text().startswith("Would unblock 3 of the 3 short links")


def test_a_stale_index_is_corrected_by_the_exact_match(links):
    impact.build_link_index()
    # Edited away from the spam host, deleted, and created after the index.
    ShortLink.objects.filter(slug="g0").update(destination="https://clean.example/x")
    ShortLink.objects.filter(slug="g1").delete()
    ShortLink.objects.create(slug="new", destination="https://docs.google.com/forms/d/new")
    assert impact.impact_of_adding(["google.com/"]).links == 4  # g2, g3, g4, new


def test_a_large_unindexed_table_says_so(links, monkeypatch):
    monkeypatch.setattr(impact, "DIRECT_LIMIT", 3)
    started = []
    monkeypatch.setattr(impact, "build_in_background", lambda: started.append(1) or True)
    unknown = impact.impact_of_adding(["google.com/"])
    assert not unknown.exact and started
    assert "being indexed" in unknown.text()


def test_index_lookup_finds_every_entry_of_a_hash():
    index = impact.LinkIndex.__new__(impact.LinkIndex)
    import numpy as np

    index.row_bits = 2
    hashes = np.array([8, 8, 12, 2**64 - 4], dtype=np.uint64)
    index.keys = np.sort(
        (hashes >> np.uint64(2) << np.uint64(2)) | np.array([0, 1, 2, 3], dtype=np.uint64)
    )
    index.links = np.array([10, 11, 12, 13])
    assert list(index.candidates(np.array([9, 2**64 - 1], dtype=np.uint64))) == [10, 11, 13]
    assert list(index.candidates(np.array([4], dtype=np.uint64))) == []


def test_a_background_build_writes_where_it_was_asked_from(db, settings, tmp_path, monkeypatch):
    # The thread may run after the test (or request) that asked has ended and its
    # settings are undone: a test run once rebuilt the checkout's var/link-index so.
    from django.db import connections

    started = []
    monkeypatch.setattr(
        impact.threading,
        "Thread",
        lambda target, **kwargs: type("T", (), {"start": lambda self: started.append(target)})(),
    )
    monkeypatch.setattr(connections, "close_all", lambda: None)  # the test's connection
    ShortLink.objects.create(slug="a", destination="https://a.example/x")
    settings.URLGUARD = {**settings.URLGUARD, "DATA_DIR": str(tmp_path / "asked")}
    assert impact.build_in_background()
    settings.URLGUARD = {**settings.URLGUARD, "DATA_DIR": str(tmp_path / "later")}
    started[0]()
    assert (tmp_path / "asked" / "link-index" / "meta.json").exists()
    assert not (tmp_path / "later").exists()
