"""`manage.py seed_demo`: the demo data behind `make run` (idempotent).

A few rules, one at each roll-up level, added through the one write path; short
links to clean pages and to listed ones (with a clean neighbour beside each
listed one, so the demo shows what a rule does *not* block); the filter brought
up to date; a demo superuser admin/admin if there is none and the database is the
embedded SQLite demo (anywhere else a known password is a way in: it says how to
create one instead). Prints the links to click."""

from __future__ import annotations

import logging
import os

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.db.models import Q, QuerySet

from urlguard.conf import conf
from urlguard.hotpath.guard import get_guard
from urlguard.models import ShortLink, SpamRule, database
from urlguard.nodesync import sync
from urlguard.shortlinks.slugs import create_short_link
from urlguard.writepath.changes import RuleExists, add_rule
from urlguard.writepath.rules import normalize_rule

logger = logging.getLogger(__name__)

# (rule as an admin would paste it, category, what it demonstrates)
DEMO_RULES = [
    ("free-prizes.example", "spam", "domain: the site and every subdomain"),
    ("https://login.secure-bank.example/", "phishing", "subdomain: only login.secure-bank.example"),
    ("pages.example.net/cheap-pills/", "spam", "path: one directory and below"),
    ("http://downloads.example.org/tools/setup-free.exe", "malware", "page: one page"),
]

# (slug, destination, disabled reason or "")
DEMO_LINKS = [
    ("python", "https://www.python.org/", ""),
    ("django-docs", "https://docs.djangoproject.com/en/5.2/", ""),
    ("bloom", "https://en.wikipedia.org/wiki/Bloom_filter", ""),
    ("prize", "https://free-prizes.example/claim?id=42", ""),
    ("prize-sub", "https://win.free-prizes.example/now", ""),
    ("bank-login", "https://login.secure-bank.example/verify", ""),
    ("bank-home", "https://www.secure-bank.example/", ""),
    ("pills", "https://pages.example.net/cheap-pills/order.html", ""),
    ("garden", "https://pages.example.net/gardening/", ""),
    ("setup", "http://downloads.example.org/tools/setup-free.exe", ""),
    ("readme", "http://downloads.example.org/tools/readme.html", ""),
    ("gone", "https://www.python.org/", "disabled by the demo: reported as spam"),
]


class Command(BaseCommand):
    help = (
        "Load the demo data for `make run` (idempotent): rules at each level (domain, "
        "subdomain, path, page), short links to clean and listed pages, the filter brought "
        "up to date, and a demo superuser admin/admin if no superuser exists and the "
        "database is the embedded SQLite demo (no DATABASE_URL)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--base-url",
            default="http://127.0.0.1:8000",
            help="where the service runs, for the printed links",
        )
        parser.add_argument(
            "--no-superuser", action="store_true", help="do not create the demo superuser"
        )

    def handle(self, *args, base_url: str, no_superuser: bool, **options):
        out = self.stdout
        self._first_filter()
        added = 0
        for text, category, _ in DEMO_RULES:
            expression = normalize_rule(text)
            if SpamRule.objects.filter(expression=expression).exists():
                continue
            try:
                add_rule(text, category=category, source="demo", note="seed_demo")
                added += 1
            except RuleExists:
                pass
        links = 0
        for slug, destination, disabled in DEMO_LINKS:
            if ShortLink.objects.filter(slug=slug).exists():
                continue
            link = create_short_link(destination, slug=slug)
            if disabled:
                link.disabled, link.disabled_reason = True, disabled
                link.save(update_fields=["disabled", "disabled_reason"])
            links += 1
        out.write(
            f"demo data: {added} rule(s) and {links} short link(s) added "
            f"({len(DEMO_RULES) - added} and {len(DEMO_LINKS) - links} already there)"
        )

        try:
            result = sync.sync()
        except Exception as exc:
            raise CommandError(
                f"could not bring the filter up to date: {exc}; try `manage.py rebuild_filter`"
            ) from exc
        what = f"rebuilt ({result.rebuilt})" if result.rebuilt else "up to date"
        out.write(f"filter: {what}, at change #{result.applied_seq}")

        if not no_superuser:
            self._superuser()

        guard = get_guard()
        base = base_url.rstrip("/")
        out.write("")
        out.write("Click these (each listed link has a clean neighbour the rule leaves alone):")
        for slug, destination, disabled in DEMO_LINKS:
            if disabled:
                outcome = "disabled (410 page)"
            else:
                verdict = guard.check(destination)
                outcome = (
                    f"BLOCKED by {verdict.rule.expression}"
                    if verdict.blocked and verdict.rule is not None
                    else "allowed"
                )
            out.write(f"  {base}/{slug:<12} {outcome:<42} {destination}")
        out.write(f"  {base}/api/check?url=https://win.free-prizes.example/   (the JSON API)")

    def _first_filter(self) -> None:
        """A fresh demo has no filter file yet: build it now, as news (INFO), before
        the first rule's change would find it missing (a WARNING, right for a node
        whose file went missing, alarming on a first run)."""
        path = conf.FILTER_PATH
        if os.path.exists(path):
            return
        logger.info("building the demo's first filter file %s", path)
        try:
            sync.rebuild(path)
        except Exception as exc:
            raise CommandError(f"could not build the filter file {path}: {exc}") from exc

    def _superuser(self) -> None:
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
            return
        if not embedded_demo_database():
            self.stdout.write(
                "No superuser exists, and this is not the embedded SQLite demo "
                f"({connection.display_name}, DATABASE_URL set), so none is made with a known "
                "password. Create one with:  python manage.py createsuperuser"
            )
            return
        User.objects.create_superuser("admin", "admin@localhost", "admin")
        self.stdout.write(
            self.style.WARNING(
                "created the demo superuser  admin / admin  for /admin/, because the "
                "database is the embedded SQLite demo (no DATABASE_URL); it is never made "
                "on any other database. Change the password or delete it before real use."
            )
        )


def demo_links() -> QuerySet[ShortLink]:
    """The short links this command made (slug and destination as it made them), for
    the home page of the embedded demo; none on any other database, where the links
    are real users' and nobody else's business."""
    if not embedded_demo_database():
        return ShortLink.objects.none()
    made = Q()
    for slug, destination, _ in DEMO_LINKS:
        made |= Q(slug=slug, destination=destination)
    return ShortLink.objects.filter(made).order_by("slug")


def embedded_demo_database() -> bool:
    """The database is the embedded demo's SQLite file (settings.EMBEDDED_DEMO: no
    DATABASE_URL in the environment), not a deployment's."""
    return bool(getattr(settings, "EMBEDDED_DEMO", False)) and database.sqlite(connection)
