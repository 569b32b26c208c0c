"""`manage.py restore_filter FILE`: put a backup of the filter file in place, brought
up to date with the change log, without ever writing into the file readers map."""

from __future__ import annotations

import os

from django.core.management.base import BaseCommand, CommandError

from filterengine import FilterFileError, FilterLockedError, FilterSpaceError
from urlguard.conf import conf
from urlguard.nodesync import sync

from ._filterfile import add_path_argument, write_errors


class Command(BaseCommand):
    help = (
        "Restore this node's filter file from a backup FILE: validate it (a clean filter "
        "file of this node's FILTER_CAPACITY/FILTER_ERROR_RATE, not ahead of the change "
        "log), copy it beside the live file, replay the change log after the backup's "
        "applied_seq into the copy, and atomically replace the live file. Web workers "
        "switch on their next check and never answer from an outdated file. (Copying a "
        "file over the live one in place is not the way: readers refuse it until it is "
        "caught up.)"
    )

    def add_arguments(self, parser):
        parser.add_argument("file", help="the backup filter file to restore")
        add_path_argument(parser)

    def handle(self, *args, file: str, path: str | None = None, **options):
        path = path or conf.FILTER_PATH
        if not os.path.isfile(file):
            raise CommandError(f"{file} is not a file.")
        if os.path.exists(path) and os.path.samefile(file, path):
            raise CommandError(f"{file} is the live filter file itself; restore from a copy of it.")
        with write_errors(path):
            try:
                result = sync.restore(file, path)
            except (FilterSpaceError, FilterLockedError):
                raise  # could not write, or busy: said by write_errors
            except FilterFileError as exc:  # the backup: unreadable, dirty, another kind
                raise CommandError(str(exc)) from exc
        if path == conf.FILTER_PATH:
            sync.report(result, full=True)
        self.stdout.write(
            self.style.SUCCESS(
                f"Restored {path} from {file}: {result.applied:,} change(s) after the "
                f"backup replayed; now at change #{result.applied_seq}."
            )
        )
