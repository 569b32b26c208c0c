"""Plain words for what the admin, the jobs and the warning page show: counts with
their nouns and thousands separators, host names and rule expressions that wrap only
where a reader expects, durations in the unit that fits, rule ids as dates. The
template filters (urlguard.templatetags.urlguard_format) are these functions."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from django.utils.html import format_html_join
from django.utils.safestring import SafeString, mark_safe


def counted(n: int, noun: str) -> str:
    """A count with its noun, for messages: 1 rule, 2,000 rules."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def unbroken_host(host: str) -> SafeString:
    """A host name that a narrow screen wraps only after a dot, never at a hyphen
    (browsers break after '-', which turns `my-bank.example` into `my-` / `bank...`
    and reads like another name)."""
    labels = str(host or "").split(".")
    return format_html_join(
        mark_safe("<wbr>"),
        '<span class="label">{}{}</span>',
        ((label, "." if i < len(labels) - 1 else "") for i, label in enumerate(labels)),
    )


def breakable_expression(expression: str) -> SafeString:
    """A rule expression that wraps after a dot, a slash or a query's separators, never
    inside a label or a path segment (only one longer than the column breaks, as a
    last resort, by the column's overflow-wrap)."""
    pieces = re.split(r"(?<=[./?&=])", str(expression or ""))
    return format_html_join(mark_safe("<wbr>"), "{}", ((piece,) for piece in pieces if piece))


def duration(seconds: float | None) -> str:
    """0.009877 -> "9.9 ms", 2.5 -> "2.5 s", 95 -> "1 min 35 s"; "—" for None."""
    if seconds is None or seconds == "":
        return "—"
    value = float(seconds)
    if value < 0.001:
        return f"{value * 1e6:.0f} µs"
    if value < 1:
        return f"{value * 1000:.1f} ms"
    if value < 60:
        return f"{value:.1f} s"
    minutes, rest = divmod(round(value), 60)
    return f"{minutes} min {rest} s"


def micros_datetime(micros: int | None) -> datetime | None:
    """A rule id (added_at, microseconds since the epoch) as a UTC datetime."""
    if micros is None:
        return None
    try:
        return datetime.fromtimestamp(int(micros) / 1e6, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


def micros_date(micros: int | None) -> str:
    """1795420000000000 -> "2026-11-23 08:26:40 UTC"."""
    when = micros_datetime(micros)
    return f"{when:%Y-%m-%d %H:%M:%S} UTC" if when is not None else "—"


def count(value: int | None) -> str:
    """1234567 -> "1,234,567" (independent of the locale's thousands setting)."""
    if value is None or value == "":
        return "—"
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return str(value)
