"""`manage.py allow_host HOST [--note TEXT]` and `manage.py allow_host --remove HOST`:
the admin's Allowlist from the shell, acting at once (feed listings of the host are
withdrawn, or listed again)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from urlguard.writepath.allowlist import allow_host, unallow_host
from urlguard.writepath.rules import RuleError


class Command(BaseCommand):
    help = (
        "Put HOST on the allowlist: feeds may no longer block it (or a parent domain of "
        "it) whole, and the feed listings that do are withdrawn now, in one change set. "
        "Rules a person or an import listed are shown and left. --remove takes HOST off "
        "the allowlist and lists the feeds' listings of it again at once."
    )

    def add_arguments(self, parser):
        parser.add_argument("host", help="a host (example.com) or a URL on it")
        parser.add_argument("--note", default="", help="why it is allowlisted")
        parser.add_argument(
            "--remove", action="store_true", help="take HOST off the allowlist instead"
        )

    def handle(self, *args, host: str, note: str, remove: bool, **options):
        if remove and note:
            raise CommandError("--note goes with adding a host, not with --remove")
        try:
            result = unallow_host(host) if remove else allow_host(host, note=note)
        except RuleError as exc:
            raise CommandError(f"{host!r} is no host to allowlist: {exc}") from None
        except LookupError as exc:
            raise CommandError(str(exc)) from None
        if remove:
            head = f"{result.host} is no longer on the allowlist"
        elif result.created:
            head = f"{result.host} is on the allowlist"
        else:
            head = f"{result.host} was already on the allowlist"
        self.stdout.write(
            head + (f" (change set #{result.change_set.pk})" if result.change_set else "")
        )
        for line in result.lines() or ["no feed listing changed"]:
            self.stdout.write(f"  {line}")
