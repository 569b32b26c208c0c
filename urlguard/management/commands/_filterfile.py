"""What the filter-file commands share: the --path option, and opening the file
read-only with an error that says how to repair it."""

from __future__ import annotations

import os
from typing import Any

from django.core.management.base import CommandError

from filterengine import FilterFileError, ScalingCountingBloomFilter
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
