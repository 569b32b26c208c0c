"""Template filters that format what the admin and the warning page show: host names
that wrap only between labels, durations in the unit that fits, rule ids as dates,
and counts with thousands separators. Their code is urlguard.wording's, which the
admin's own Python uses too."""

from __future__ import annotations

from django import template

from urlguard.wording import breakable_expression, count, duration, micros_date, unbroken_host

__all__ = ["breakable_expression", "count", "duration", "micros_date", "unbroken_host"]

register = template.Library()

for _filter in (unbroken_host, breakable_expression, duration, micros_date, count):
    register.filter(_filter)
