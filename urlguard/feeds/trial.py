"""A test fetch of a feed before subscribing: fetched and read exactly as a refresh
would (the same bounded fetch, parsers, rule policy and allowlist), and reported as
the format detected, the entries it would list, the entries refused with their
reasons, and the short links it would block. Nothing is written, no source exists."""

from __future__ import annotations

from typing import Any

import numpy as np

from urlguard.feeds.decoding import FeedError
from urlguard.feeds.fetching import fetch
from urlguard.feeds.outcome import RefreshResult
from urlguard.feeds.refresh import fetch_settings
from urlguard.feeds.staging import stage
from urlguard.models import Category, Source
from urlguard.writepath import allowlist
from urlguard.writepath.impact import impact_of_listing

__all__ = ["test_fetch"]


def test_fetch(url: str, *, format: str = "auto", category: str = Category.SPAM) -> dict[str, Any]:
    """What subscribing to `url` would list and block; {"error": ...} for a feed
    that cannot be read (a refresh would change nothing then either)."""
    result = RefreshResult(source=url)
    draft = Source(name="(test fetch)", kind=Source.Kind.FEED, url=url, format=format)
    draft.category = category
    try:
        fetched = fetch(url, etag="", last_modified="", settings=fetch_settings())
        result.http_status, result.bytes = fetched.status, fetched.size
        if fetched.body is None:
            raise FeedError("the server answered 304 Not Modified to a plain GET")
        with fetched.body:
            staged = stage(fetched.body, draft, result)
    except FeedError as exc:
        return {"error": str(exc), "http_status": result.http_status, "bytes": result.bytes}
    try:
        staged.resolve(allowlist.load(), result)
        entries = staged.count()
        everything = np.ones(len(staged.keys), dtype=bool)
        samples: list[str] = []
        for expression, _category in staged.lines(everything):
            if len(samples) >= 10:
                break
            samples.append(expression)
        impact = impact_of_listing(expression for expression, _ in staged.lines(everything))
    finally:
        staged.close()
    return {
        "error": "" if entries else "no entries in the body: a refresh would refuse it",
        "http_status": result.http_status,
        "bytes": result.bytes,
        "format": result.format,
        "format_name": dict(Source.Format.choices).get(result.format, result.format),
        "entries": entries,
        "samples": samples,
        "refused": result.refused,
        "refusals": [list(r) for r in result.refusals],
        "impact": impact.as_dict(),
    }
