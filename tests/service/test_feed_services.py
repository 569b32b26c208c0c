"""A feed refresh on real services: the refresh task runs on a Celery worker over
Redis, commits its change set in PostgreSQL, and the broadcast nudge brings both
nodes' filter files to it (additions, then a removal)."""

from __future__ import annotations

from tests.service.feedserver import feed_server
from tests.service.test_services import (  # noqa: F401  (fixtures)
    pytestmark,
    services_available,
    start_worker,
    wait_for,
)
from urlguard import registry
from urlguard.feeds.tasks import refresh_feed
from urlguard.models import Source, SpamRule


def test_a_refresh_through_a_worker_reaches_two_nodes(start_worker, tmp_path):  # noqa: F811
    paths = [tmp_path / "node-a" / "filter.bin", tmp_path / "node-b" / "filter.bin"]
    workers = [start_worker(path) for path in paths]
    for path, worker in zip(paths, workers, strict=True):
        wait_for(path.exists, what=f"{path} built at boot", log=worker.log)

    def everywhere(expression: str, present: bool) -> None:
        for path, worker in zip(paths, workers, strict=True):
            wait_for(
                lambda p=path: (expression in (registry.get_filter(str(p)) or ())) == present,
                timeout=30,
                what=f"{expression} {'in' if present else 'out of'} {path}",
                log=worker.log,
            )

    with feed_server() as feeds:
        url = feeds.serve("/l", b"one.feed.example\ntwo.feed.example\nthree.feed.example\n")
        source = Source.objects.create(name="svc-feed", kind="feed", url=url)
        refresh_feed.delay(source.pk)
        everywhere("three.feed.example/", True)
        assert SpamRule.objects.filter(listings__source=source).count() == 3
        feeds.serve("/l", b"one.feed.example\ntwo.feed.example\n")
        refresh_feed.delay(source.pk)
        everywhere("three.feed.example/", False)
        everywhere("one.feed.example/", True)
    source.refresh_from_db()
    assert source.last_status == "ok" and source.last_removed == 1
