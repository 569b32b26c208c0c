"""`manage.py add_feed NAME URL`: subscribe to a feed (or an allowlist)."""

from __future__ import annotations

from urllib.parse import urlsplit

from django.core.management.base import BaseCommand, CommandError

from urlguard.conf import conf
from urlguard.feeds.decoding import FeedError
from urlguard.feeds.fetching import file_feed_path
from urlguard.feeds.formats import NAMES
from urlguard.feeds.interval import (
    EXAMPLES,
    MAX_INTERVAL,
    MIN_INTERVAL,
    human_interval,
    parse_interval,
)
from urlguard.feeds.refresh import RefreshStatus, refresh_source
from urlguard.models import Category, Source


class Command(BaseCommand):
    help = (
        "Subscribe to a feed: NAME (unique) and URL (http, https, or file:///path on this "
        "server beneath FEED_FILE_ROOT). The format is detected unless --format names it; its "
        "entries become rules of --category (URLhaus and PhishTank name their own) and it is "
        "refreshed every --interval (by Celery beat, or the embedded runner without a broker). "
        "--allowlist makes it an allowlist: hosts that feeds may never block whole. "
        "Run `refresh_feeds NAME` to fetch it now."
    )

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("url")
        parser.add_argument(
            "--format", default="auto", choices=("auto", *NAMES), help="default: detect"
        )
        parser.add_argument(
            "--category", default=Category.SPAM, choices=Category.values, help="default: spam"
        )
        parser.add_argument(
            "--interval",
            default="1 h",
            help=(
                f"time between refreshes: {EXAMPLES}; at least {human_interval(MIN_INTERVAL)}, "
                f"at most {human_interval(MAX_INTERVAL)}, as in the admin (default 1 h)"
            ),
        )
        parser.add_argument("--allowlist", action="store_true", help="an allowlist source")
        parser.add_argument("--refresh", action="store_true", help="refresh it once now")

    def handle(self, *args, name, url, format, category, interval, allowlist, refresh, **opts):
        name = name.strip()
        if not name or len(name) > 100:
            raise CommandError("NAME must be 1 to 100 characters")
        scheme = urlsplit(url).scheme.lower()
        if scheme not in ("http", "https", "file"):
            raise CommandError(
                f"{url!r}: the URL must be http://, https:// or file:///path (got {scheme!r})"
            )
        try:
            interval = parse_interval(interval)
        except ValueError as exc:
            raise CommandError(f"--interval: {exc}") from None
        if scheme == "file":
            try:
                file_feed_path(url, conf.FEED_FILE_ROOT, must_exist=False)
            except FeedError as exc:
                raise CommandError(str(exc)) from None
        existing = Source.objects.filter(name=name).first()
        if existing is not None:
            raise CommandError(
                f"a source named {name!r} already exists ({existing.kind}, "
                f"{existing.url or 'no URL'}); edit it in the admin or pick another name"
            )
        source = Source.objects.create(
            name=name,
            kind=Source.Kind.FEED,
            url=url,
            format=format,
            category=category,
            interval=interval,
            is_allowlist=allowlist,
        )
        what = "allowlist" if allowlist else "feed"
        self.stdout.write(
            f"Added {what} {name!r}: {url} (format {format}, category {category}, "
            f"every {human_interval(interval)})."
        )
        if refresh:
            result = refresh_source(source)
            self.stdout.write(result.summary())
            if result.status == RefreshStatus.FAILED:
                raise CommandError(f"the first refresh of {name!r} failed: {result.error}")
        else:
            self.stdout.write(
                f"It is due now: `manage.py refresh_feeds {name}` fetches it at once; otherwise "
                "the next periodic check does."
            )
