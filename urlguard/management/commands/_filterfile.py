"""What the filter-file commands share: the --path option, opening the file
read-only with an error that says how to repair it, running a sync with the
failures a command can report, and the base of the read-only diagnostics."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.test.utils import override_settings

from filterengine import FilterFileError, ScalingCountingBloomFilter
from urlguard.conf import conf
from urlguard.nodesync import registry, sync

# System checks about writing the filter file (its directory must be writable): a
# diagnostic that only reads it must run exactly when that is broken.
WRITE_CHECKS = ("urlguard.E001",)


class DiagnosticCommand(BaseCommand):
    """A command that never writes the filter file: the system checks about writing
    it do not stop it (an operator runs these on a read-only var dir)."""

    writes: bool = False  # a subclass may decide per run (e.g. verify_filter --sync)

    def execute(self, *args: Any, **options: Any) -> Any:
        self.writes = bool(options.get("sync"))
        return super().execute(*args, **options)

    def check(self, *args: Any, **kwargs: Any) -> None:
        if self.writes:
            return super().check(*args, **kwargs)
        silenced = [*getattr(settings, "SILENCED_SYSTEM_CHECKS", []), *WRITE_CHECKS]
        with override_settings(SILENCED_SYSTEM_CHECKS=silenced):
            return super().check(*args, **kwargs)


def add_path_argument(parser: Any) -> None:
    parser.add_argument(
        "--path", help=f"filter file (default: URLGUARD FILTER_PATH, now {conf.FILTER_PATH})"
    )


def open_readonly(path: str) -> ScalingCountingBloomFilter:
    if not os.path.exists(path):
        raise CommandError(f"{path} does not exist; run `manage.py rebuild_filter`.")
    try:
        return ScalingCountingBloomFilter.open(path, readonly=True)
    except (OSError, FilterFileError) as exc:
        raise CommandError(f"{path} is unreadable: {exc}; run `manage.py rebuild_filter`.") from exc


@contextmanager
def write_errors(path: str) -> Iterator[None]:
    """The failures of writing the filter file a command can report, as CommandErrors."""
    try:
        yield
    except registry.WriterBusy as exc:
        raise CommandError(str(exc)) from exc
    except (OSError, FilterFileError) as exc:  # the directory, a full disk
        raise CommandError(f"could not write {path}: {exc}") from exc


def run_sync(path: str, **options: Any) -> sync.SyncResult:
    """sync.sync(path=path, **options) with its expected failures as CommandErrors;
    the node's status is reported when `path` is this node's file."""
    with write_errors(path):
        result = sync.sync(path=path, **options)
    if path == conf.FILTER_PATH:
        sync.report(result, full=True)
    return result
