"""What the filter-file commands share: the --path option, opening the file
read-only with an error that says how to repair it, and running a sync with the
failures a command can report."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.core.management.base import CommandError

from filterengine import FilterFileError, ScalingCountingBloomFilter
from urlguard import registry, sync
from urlguard.conf import conf


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
    except OSError as exc:  # a rebuild could not write the file (directory, disk)
        raise CommandError(f"could not write {path}: {exc}") from exc


def run_sync(path: str, **options: Any) -> sync.SyncResult:
    """sync.sync(path=path, **options) with its expected failures as CommandErrors;
    the node's status is reported when `path` is this node's file."""
    with write_errors(path):
        result = sync.sync(path=path, **options)
    if path == conf.FILTER_PATH:
        sync.report(result, full=True)
    return result
