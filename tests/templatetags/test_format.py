"""urlguard.templatetags.urlguard_format: what the admin and warning page display."""

from __future__ import annotations

import pytest

from urlguard.templatetags.urlguard_format import count, duration, micros_date, unbroken_host


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.009877661000246007, "9.9 ms"),
        (0.0000042, "4 µs"),
        (2.5, "2.5 s"),
        (95, "1 min 35 s"),
        (None, "—"),
    ],
)
def test_duration(seconds, text):
    assert duration(seconds) == text


def test_micros_date_and_count():
    assert micros_date(1_795_420_000_000_000) == "2026-11-23 07:46:40 UTC"
    assert micros_date(None) == "—" and micros_date(10**30) == "—"
    assert count(1234567) == "1,234,567" and count(None) == "—"


def test_unbroken_host_wraps_only_between_labels():
    html = unbroken_host("my-bank.ex<ample.com")
    assert html == (
        '<span class="label">my-bank.</span><wbr><span class="label">ex&lt;ample.</span>'
        '<wbr><span class="label">com</span>'
    )
