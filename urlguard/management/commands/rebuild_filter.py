"""`manage.py rebuild_filter`: write this node's filter file anew from the spam table."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from urlguard.conf import conf

from ._filterfile import add_path_argument, run_sync
from ._progress import Progress


class Command(BaseCommand):
    help = (
        "Rebuild this node's filter file from the spam table (SpamRule), then apply any "
        "change committed meanwhile. The new file is written aside and atomically replaces "
        "the old one, so running web workers keep answering and switch on their next check. "
        "Use it after restoring a backup, changing FILTER_CAPACITY/FILTER_ERROR_RATE, or when "
        "`verify_filter` reports mismatches. Shows progress on a terminal."
    )

    def add_arguments(self, parser):
        add_path_argument(parser)

    def handle(self, *args, path: str | None = None, **options):
        path = path or conf.FILTER_PATH
        progress = Progress(self.stdout, "rules")
        try:
            result = run_sync(
                path, force_rebuild="requested by manage.py rebuild_filter", progress=progress
            )
        finally:
            progress.end()
        later = result.applied
        self.stdout.write(
            self.style.SUCCESS(
                f"Rebuilt {path}: {result.rules:,} rules in {result.rebuild_seconds:.2f} s; "
                f"now at change #{result.applied_seq}"
                + (f" ({later} committed during the rebuild applied)" if later else "")
                + "."
            )
        )
