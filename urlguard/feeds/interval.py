"""A feed's refresh interval as a person types it ("90 s", "15 min", "2h", "1 d", or
plain seconds): one parser, one set of bounds and one way of showing it, for the
admin's feed form and `manage.py add_feed --interval` alike."""

from __future__ import annotations

import re

__all__ = ["MAX_INTERVAL", "MIN_INTERVAL", "human_interval", "parse_interval"]

# More often than once a minute costs the feed's server, not fresher rules.
MIN_INTERVAL = 60
# Rarer than monthly is a feed left to go stale, more likely a slip of the unit.
MAX_INTERVAL = 30 * 86400
# Longer text is no interval: refused before the pattern reads it.
MAX_TEXT = 40

_UNITS = {
    **dict.fromkeys(("", "s", "sec", "secs", "second", "seconds"), 1),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600),
    **dict.fromkeys(("d", "day", "days"), 86400),
}
_INTERVAL = re.compile(r"(\d{1,12}(?:\.\d{1,6})?)\s*([a-z]*)")
EXAMPLES = "90 s, 15 min, 1 h or 1 d (a plain number is seconds)"


def human_interval(seconds: int | None) -> str:
    """3600 -> "1 h", 90 -> "90 s", 5400 -> "90 min": the largest unit that divides."""
    if not seconds:
        return ""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def parse_interval(text: str | int) -> int:
    """The seconds `text` says, between MIN_INTERVAL and MAX_INTERVAL; ValueError
    says what was wrong and what is accepted."""
    typed = str(text).strip().lower()
    match = _INTERVAL.fullmatch(typed) if len(typed) <= MAX_TEXT else None
    if match is None or match.group(2) not in _UNITS:
        shown = typed if len(typed) <= MAX_TEXT else typed[:MAX_TEXT] + "..."
        raise ValueError(f"{shown!r} is no interval: give a number and a unit: {EXAMPLES}.")
    seconds = round(float(match.group(1)) * _UNITS[match.group(2)])
    if not MIN_INTERVAL <= seconds <= MAX_INTERVAL:
        raise ValueError(
            f"At least {human_interval(MIN_INTERVAL)} and at most "
            f"{human_interval(MAX_INTERVAL)}: {typed!r} is {human_interval(seconds) or '0 s'}."
        )
    return seconds
