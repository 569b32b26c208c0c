"""urlguard.checks: every id fires on its misconfiguration, and only then."""

from __future__ import annotations

import io

import pytest
from django.core import checks
from django.core.management import call_command

from urlguard.checks import MIDDLEWARE_PATH, check_settings


def ids() -> list[str]:
    return sorted(m.id for m in check_settings())


def set_urlguard(settings, **values) -> None:
    settings.URLGUARD = {**settings.URLGUARD, **values}


def test_checks_are_registered():
    assert check_settings in checks.registry.registry.get_checks()
    found = checks.run_checks(tags=["urlguard"])
    assert "urlguard.W001" in {m.id for m in found}


def test_default_settings_pass_except_the_missing_file(filter_path):
    messages = check_settings()
    assert [m.id for m in messages] == ["urlguard.W001"]
    (warning,) = messages
    assert warning.level == checks.WARNING
    assert "rebuild_filter" in warning.hint and str(filter_path) in warning.msg


def test_no_warning_once_the_file_exists(filter_path):
    filter_path.write_bytes(b"x")  # existence is all W001 looks at
    assert check_settings() == []


def test_e001_filter_directory_unusable(settings, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    set_urlguard(settings, FILTER_PATH=str(blocker / "sub" / "filter.bin"))
    (error,) = check_settings()
    assert error.id == "urlguard.E001" and "not a directory" in error.msg
    assert "FILTER_PATH" in error.hint


def test_e001_not_raised_for_a_directory_that_can_be_created(settings, tmp_path):
    set_urlguard(settings, FILTER_PATH=str(tmp_path / "new" / "deeper" / "filter.bin"))
    assert ids() == ["urlguard.W001"]


@pytest.mark.parametrize("rate", [0, 1, 1.5, -0.1, "0.01", True, None])
def test_e002_bad_error_rate(settings, rate):
    set_urlguard(settings, FILTER_ERROR_RATE=rate)
    assert "urlguard.E002" in ids()


@pytest.mark.parametrize("capacity", [0, -5, 1.5, "1000", True, None])
def test_e003_bad_capacity(settings, capacity):
    set_urlguard(settings, FILTER_CAPACITY=capacity)
    assert "urlguard.E003" in ids()


def test_e004_middleware_missing(settings):
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != MIDDLEWARE_PATH]
    errors = [m for m in check_settings() if m.id == "urlguard.E004"]
    assert errors and MIDDLEWARE_PATH in errors[0].hint


def test_e005_bad_policy(settings):
    set_urlguard(settings, ON_FILTER_ERROR="maybe")
    (error,) = [m for m in check_settings() if m.id == "urlguard.E005"]
    assert "'maybe'" in error.msg and "database" in error.msg


@pytest.mark.parametrize(
    ("name", "check_id"),
    [("CATCHUP_INTERVAL", "urlguard.E006"), ("WRITER_LOCK_TIMEOUT", "urlguard.E007")],
)
@pytest.mark.parametrize("value", [0, -1, "60", None])
def test_e006_e007_bad_durations(settings, name, check_id, value):
    set_urlguard(settings, **{name: value})
    assert check_id in ids()


@pytest.mark.parametrize("value", [0.5, 0, "2", None])
def test_e008_bad_rebuild_headroom(settings, value):
    set_urlguard(settings, REBUILD_HEADROOM=value)
    assert "urlguard.E008" in ids()


@pytest.mark.parametrize("value", [0, -1, 2.5, "4", True])
def test_e009_bad_max_stages(settings, value):
    set_urlguard(settings, FILTER_MAX_STAGES=value)
    assert "urlguard.E009" in ids()


def test_e000_namespace_not_a_dict(settings):
    settings.URLGUARD = [("FILTER_PATH", "/tmp/x")]
    assert ids() == ["urlguard.E000"]


def test_w002_unknown_setting(settings):
    set_urlguard(settings, FILTER_CAPACTIY=10)
    (warning,) = [m for m in check_settings() if m.id == "urlguard.W002"]
    assert "FILTER_CAPACTIY" in warning.msg and "FILTER_CAPACITY" in warning.hint


@pytest.mark.django_db
def test_missing_file_does_not_block_the_command_that_fixes_it(filter_path):
    call_command("rebuild_filter", skip_checks=False, stdout=io.StringIO())
    assert filter_path.exists()
    assert check_settings() == []
