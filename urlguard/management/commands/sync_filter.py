"""`manage.py sync_filter`: apply the pending change log to this node's filter now."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from urlguard.conf import conf
from urlguard.nodesync import sync

from ._filterfile import add_path_argument, run_sync, write_errors


class Command(BaseCommand):
    help = (
        "Apply every change-log row this node's filter file has not applied yet (what the "
        "Celery worker does on each nudge and on its periodic catch-up). A missing, dirty, "
        "corrupt or differently configured file is rebuilt from the spam table, and the "
        "reason is printed. Then a random sample of SPOT_CHECK_SAMPLE rules is probed in "
        "the file; a miss (damaged counters) rebuilds it."
    )

    def add_arguments(self, parser):
        add_path_argument(parser)

    def handle(self, *args, path: str | None = None, **options):
        path = path or conf.FILTER_PATH
        result = run_sync(path)
        if result.rebuilt:
            self.stdout.write(
                self.style.WARNING(
                    f"Rebuilt {path} ({result.rebuilt}): {result.rules:,} rules in "
                    f"{result.rebuild_seconds:.2f} s."
                )
            )
        self.stdout.write(
            self.style.SUCCESS(
                f"{path}: applied {result.applied} change(s); now at change #{result.applied_seq} "
                f"(log head #{max(result.head, result.applied_seq)})."
            )
        )
        sample = conf.SPOT_CHECK_SAMPLE
        if sample and not result.rebuilt:
            with write_errors(path):
                check = sync.verify_and_repair(path, sample=sample)
            if check.missing:
                self.stdout.write(
                    self.style.ERROR(f"{check.summary()}: the file was rebuilt from the table.")
                )
            else:
                self.stdout.write(check.summary())
