"""urlguard.checks and the settings table (urlguard.conf): every id fires on its
misconfiguration, and only then; a wrong value stops `check`, runserver and the
WSGI/ASGI boot; the typed accessors never hand out a value of the wrong type."""

from __future__ import annotations

import io
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from urlguard.checks import (
    MIDDLEWARE_PATH,
    PROXY_MIDDLEWARE_PATH,
    check_settings,
    refuse_to_start,
)
from urlguard.conf import DEFAULTS, SETTINGS, conf

ROOT = Path(__file__).resolve().parents[2]


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


# -- the table itself ----------------------------------------------------------------


def test_each_row_has_its_own_check_id_and_a_hint():
    check_ids = [row.check_id for row in SETTINGS.values()]
    assert len(set(check_ids)) == len(check_ids)
    assert all(re.fullmatch(r"urlguard\.E0\d\d", i) for i in check_ids)
    assert all(row.hint and row.must_be for row in SETTINGS.values())
    assert {name: row.default for name, row in SETTINGS.items()} == DEFAULTS


def test_every_setting_is_documented_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    documented = set(re.findall(r"^\| `([A-Z_]+)` \|", readme, re.MULTILINE))
    assert set(SETTINGS) <= documented


@pytest.mark.parametrize("name", list(SETTINGS))
def test_every_default_passes_and_reads_back_typed(name):
    row = SETTINGS[name]
    assert row.problem(row.default) == ""
    getattr(conf, name)  # no ImproperlyConfigured


@pytest.mark.parametrize("name", list(SETTINGS))
def test_every_row_refuses_a_value_of_another_type(settings, name):
    """One test per row's check id: the error names the setting, what it must be,
    the wrong value and (in the hint) what to write instead."""
    row = SETTINGS[name]
    wrong = object()
    set_urlguard(settings, **{name: wrong})
    (error,) = [m for m in check_settings() if m.id == row.check_id]
    assert error.level == checks.ERROR
    assert f"URLGUARD['{name}'] must be {row.must_be}" in error.msg and repr(wrong) in error.msg
    assert row.hint in error.hint and repr(row.default) in error.hint
    with pytest.raises(ImproperlyConfigured, match=re.escape(row.check_id)):
        getattr(conf, name)


# Values each row must refuse beyond a wrong type: out of range, bool for a number,
# a string where a number or list is meant. (name, bad values)
REFUSED = {
    "DATA_DIR": ["", 5],
    "FILTER_PATH": ["", 5],
    "FILTER_CAPACITY": [0, -5, 1.5, "1000", True, None],
    "FILTER_ERROR_RATE": [0, 1, 1.5, -0.1, "0.01", True, None, math.nan],
    "REBUILD_HEADROOM": [0.5, 0, "2", None, math.inf],
    "FILTER_MAX_STAGES": [0, -1, 2.5, "4", True],
    "ON_FILTER_ERROR": ["maybe", "", None, "Database"],
    "CHECK_INTERNAL_REDIRECTS": ["yes", 1, None],
    "ALLOWED_OTHER_SCHEMES": ["mailto", ["http"], ["HTTPS"], ["mail to"], [""], [5], None],
    "CONTINUE_TOKEN_MAX_AGE": [0, -1, "900", None],
    "REDIRECT_MAX_AGE": ["90s", "90", -1, 1.5, True, None],
    "ALLOW_PRIVATE_ADDRESS_RULES": ["no", 0],
    "PROTECTED_HOSTS": ["example.com", [""], [1]],
    "LINK_SHORTENERS": ["bit.ly", ["bit.ly", None]],
    "CONFIRM_IMPACT_LINKS": [-1, 1.5, "100", None, False],
    "REPORT_MISTAKE_URL": ["abuse@example.com", "javascript:alert(1)", "//evil", ""],
    "REPORT_RATE_LIMIT": [0, -1, "5", None, True],
    "REPORT_MAIL_INTERVAL": [-1, "900", None, 1.5, True],
    "HIT_LOG_DAYS": [0, -7, "90", None, 1.5],
    "REPORT_ADDRESS_RATE_LIMIT": [0, -1, "10", None, True, 2.5],
    "REPORT_MAX_OPEN_PER_DESTINATION": [0, -1, "20", None, False],
    "REPORT_TOKEN_MAX_AGE": [0, -1, "86400", None, math.inf],
    "HIT_EVENTS_KEPT": [0, -1, "100000", None, 1.5, True],
    "NODE_NAME": ["", "  ", 7],
    "CATCHUP_INTERVAL": [0, -1, "60", None],
    "EMBEDDED_CATCH_UP": ["false", 0],
    "BROADCAST_QUEUE": ["", None],
    "SPOT_CHECK_SAMPLE": [-1, 0.5, "200", None],
    "VERIFY_INTERVAL": [-1, "3600", None, math.nan],
    "WRITER_LOCK_TIMEOUT": [0, -1, "60", None],
    "FEED_SHRINK_THRESHOLD": [0, 1.5, -0.5, "0.5", None, True],
    "FEED_MAX_BYTES": [0, -1, 1.5, "1000", None],
    "FEED_CONNECT_TIMEOUT": [0, -1, "10", None],
    "FEED_READ_TIMEOUT": [0, -1, "30", None],
    "FEED_DEADLINE": [0, "300", None],
    "FEED_MAX_REDIRECTS": [-1, 2.5, "5", True],
    "FEED_UNHEALTHY_FAILURES": [0, "3", 1.5],
    "FEED_CHECK_INTERVAL": [0, -60, "60", None],
    "FEED_RETRIES": [-1, "3", 0.5],
    "FEED_CLAIM_TIMEOUT": [0, "3600", None],
    "FEED_EMBEDDED_REFRESH": ["yes", 1, None],
    "FEED_FILE_ROOT": ["", 5],
    "FEED_ALLOWED_NETWORKS": ["127.0.0.0/8", ["localhost"], ["10.0.0.0/33"], None],
    "FEED_MAX_ENTRIES": [0, -1, "100", 1.5, None, True],
    "FEED_MAX_LINE": [0, 1023, "65536", None, 1.5],
    "FEED_SHRINK_WINDOW": [-1, "604800", None, math.inf, True],
    "HEARTBEAT_INTERVAL": [0, -1, "10", None, True],
    "HEARTBEAT_TIMEOUT": [0, -1, "60", None, True],
    "STATS_FLUSH_INTERVAL": [0, -1, "1", None, True, math.nan],
    "STATS_BUFFER_MAX": [0, -1, 1.5, "100000", None, True],
    "STATS_STOP_TIMEOUT": [-1, "5", None, math.inf],
    "LINK_CACHE_SIZE": [0, -1, 1.5, "50000", None, True],
    "LINK_CACHE_TTL": [0, -1, "60", None],
    "LINK_CACHE_POLL": [0, -1, "0.5", None],
    "READY_MAX_LAG_CHANGES": [-1, 1.5, "1000", None],
    "READY_MAX_LAG_SECONDS": [0, -1, "120", None],
    "METRICS_DIR": ["", 5],
    "METRICS_ALLOWED_NETWORKS": ["127.0.0.0/8", ["localhost"], ["10.0.0.0/33"], [""], None],
    "METRICS_TOKEN": [None, 5, "CHANGE-ME", "change_me", "ChangeMe-please", "password"],
    "TRUSTED_PROXIES": [
        "127.0.0.1/32",
        ["localhost"],
        ["10.0.0.10/8"],
        ["0.0.0.0/0"],
        ["::/0"],
        ["0.0.0.0/1", "128.0.0.0/1", "::/1", "8000::/1"],
        ["0.0.0.0/7"],
        ["2000::/16"],
        ["2001:db8::/31"],
        ["1.0.0.0/8", "2.0.0.0/8", "3.0.0.0/8"],  # each a /8, together more than two
        ["2001:db8::/32", "2001:db9::/32", "2001:dba::/32"],
        ["127.0.0.1:80"],
        [""],
        None,
    ],
    "API_MAX_URLS": [0, -1, "1000", 1.5, None],
    "API_MAX_BODY_BYTES": [0, "2MB", None],
    "API_KEY_RATE": ["120", "120/minute", "fast", 120, None],
    "API_OPEN_RATE": ["60 per minute", "/m", None],
    "API_FAILED_KEY_RATE": ["10", "10/minute", 10, None],
    "API_MAX_URL_LENGTH": [0, -1, "8192", 1.5, None],
    "API_MAX_BATCH_CHARS": [0, "512k", None, True],
    "CONTENT_MAX_CHARS": [0, -1, "50000", 1.5, None, True],
    "LOG_JSON": ["yes", 1, None],
    "EXPORT_MAX_AGE": [-1, "300", "5m", 1.5, None, True],
    "EXPORTS_OPEN": ["yes", 1, None],
    "EXPORT_KEEP_VERSIONS": [0, -1, "20", 1.5, None],
    "EXPORT_KEEP_BYTES": [-1, "100MB", 1e8, None, True],
    "EXPORT_MAX_LAG_SECONDS": [0, -1, "600", math.inf, None, True],
    "EXPORTS_PRERENDER": ["hosts.txt", ["hosts.txt", "nope.txt"], [""], None],
    "SAFEBROWSING_ENABLED": ["yes", 1, None],
    "SAFEBROWSING_MIN_WAIT": [-1, "1800", "30m", 1.5, None, True],
    "SAFEBROWSING_CACHE_DURATION": [-1, "300", 1.5, None],
    "SAFEBROWSING_NEGATIVE_CACHE_DURATION": [-1, "300", 1.5, None],
    "DNS_RPZ_ZONE": ["rpz.urlguard", "", ".", "a..b.", "bad_label-.x.", None, 5],
    "DNS_URIBL_ZONE": ["uribl.urlguard", "-x.example.", None],
    "DNS_NOTIFY": ["127.0.0.1:53", ["127.0.0.1"], ["localhost:53"], ["127.0.0.1:0"], None],
    "DNS_TRANSFER_NETWORKS": ["127.0.0.0/8", ["localhost"], ["10.0.0.0/33"], None],
    "DNS_JOURNAL_CHANGES": [0, -1, "1000", 1.5, None],
    "DNS_RATE_LIMIT": [0, -1, "100", 1.5, None, True],
    "PUBLIC_URL": ["guard.example.com", "ftp://x", "", 5],
}
# Values that look odd but are right.
ACCEPTED = {
    "DATA_DIR": [None, "/srv/urlguard", Path("/srv/urlguard")],
    "FILTER_PATH": [None, "/srv/urlguard/filter.bin", Path("/srv/urlguard/filter.bin")],
    "REDIRECT_MAX_AGE": [0, 3600],
    "ALLOWED_OTHER_SCHEMES": [[], ("mailto",), {"tel", "sms"}, ["MAILTO"], ["web+app"]],
    "PROTECTED_HOSTS": [None, [], ["example.com"]],
    "REPORT_MISTAKE_URL": [None, "https://example.com/report?x=1", "/report/", "mailto:a@b.c"],
    "VERIFY_INTERVAL": [0, 0.5],
    "SPOT_CHECK_SAMPLE": [0],
    "CONFIRM_IMPACT_LINKS": [0],
    "REPORT_MAIL_INTERVAL": [0, 60],
    "REBUILD_HEADROOM": [1, 2.5],
    "FEED_SHRINK_THRESHOLD": [1, 0.9],
    "FEED_MAX_REDIRECTS": [0],
    "FEED_RETRIES": [0],
    "FEED_FILE_ROOT": [None, "/srv/feeds", Path("/srv/feeds")],
    "FEED_ALLOWED_NETWORKS": [[], ["127.0.0.1/32", "::1"]],
    "FEED_SHRINK_WINDOW": [0, 86400.5],
    "READY_MAX_LAG_CHANGES": [0],
    "METRICS_ALLOWED_NETWORKS": [[], ["10.0.0.1"], ("10.1.2.0/24", "fd00::/8")],
    "TRUSTED_PROXIES": [
        [],
        ["10.0.0.10"],
        ("127.0.0.1/32", "::1/128", "172.30.253.0/24"),
        ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"],
        ["10.0.0.0/8", "10.1.0.0/16", "10.0.0.0/8"],  # overlaps counted once
        ["2001:db8::/32", "fd00::/32"],
    ],
    "API_KEY_RATE": ["100/5m", "1/s", "10000/d"],
    "API_FAILED_KEY_RATE": ["3/h", "100/5m"],
    "REPORT_TOKEN_MAX_AGE": [600, 0.5],
    "EXPORT_MAX_AGE": [0, 86400],
    "EXPORT_KEEP_BYTES": [0, 10**12],
    "EXPORT_MAX_LAG_SECONDS": [0.5, 3600],
    "DNS_RPZ_ZONE": ["rpz.example.net.", "RPZ.Example."],
    "DNS_NOTIFY": [[], ["127.0.0.1:5353"], ("[::1]:53", "10.0.0.2:53")],
    "DNS_TRANSFER_NETWORKS": [[], ["10.0.0.1"], ("10.1.2.0/24", "fd00::/8")],
    "PUBLIC_URL": [None, "https://guard.example.com/"],
}


def test_every_row_has_refused_examples():
    assert set(REFUSED) == set(SETTINGS)


@pytest.mark.parametrize(
    ("name", "value"), [(n, v) for n, values in REFUSED.items() for v in values]
)
def test_refused_values(settings, name, value):
    set_urlguard(settings, **{name: value})
    assert SETTINGS[name].check_id in ids()


@pytest.mark.parametrize(
    ("name", "value"), [(n, v) for n, values in ACCEPTED.items() for v in values]
)
def test_accepted_values(settings, name, value):
    set_urlguard(settings, **{name: value})
    assert SETTINGS[name].check_id not in ids()


# -- typed accessors -----------------------------------------------------------------


def test_accessors_return_the_documented_types(settings, filter_path):
    assert conf.REDIRECT_MAX_AGE == 90 and type(conf.REDIRECT_MAX_AGE) is int
    assert str(filter_path) == conf.FILTER_PATH
    assert frozenset({"mailto", "tel"}) == conf.ALLOWED_OTHER_SCHEMES
    set_urlguard(settings, ALLOWED_OTHER_SCHEMES=["MAILTO", "Sms"], FILTER_PATH=None)
    assert frozenset({"mailto", "sms"}) == conf.ALLOWED_OTHER_SCHEMES
    assert str(Path(settings.VAR_DIR) / "filter.bin") == conf.FILTER_PATH
    assert type(conf.CATCHUP_INTERVAL) is float
    assert conf.NODE_NAME  # None: the host name


def test_a_wrong_value_is_never_handed_out(settings):
    set_urlguard(settings, REDIRECT_MAX_AGE="90s")
    with pytest.raises(ImproperlyConfigured, match=r"REDIRECT_MAX_AGE.*'90s'.*not '90s'"):
        conf.REDIRECT_MAX_AGE  # noqa: B018


def test_allowed_other_schemes_as_a_string_is_refused_not_read_as_letters(settings):
    set_urlguard(settings, ALLOWED_OTHER_SCHEMES="mailto")
    (error,) = [m for m in check_settings() if m.id == "urlguard.E012"]
    assert "'mailto'" in error.msg and "['mailto', 'tel']" in error.hint


# -- the checks that look at more than one row -----------------------------------------


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


def test_data_dir_defaults_under_the_sites_base_dir(settings, tmp_path):
    settings.BASE_DIR = tmp_path / "mysite"
    set_urlguard(settings, DATA_DIR=None, FILTER_PATH=None, METRICS_DIR=None)
    assert str(tmp_path / "mysite" / "var" / "urlguard") == conf.DATA_DIR
    assert str(tmp_path / "mysite" / "var" / "urlguard" / "filter.bin") == conf.FILTER_PATH
    assert str(tmp_path / "mysite" / "var" / "urlguard" / "metrics") == conf.METRICS_DIR
    assert "urlguard.E025" not in ids()


def test_e025_no_data_dir_and_no_base_dir_to_derive_one(settings):
    """A site whose settings have no BASE_DIR: the check names the setting to write,
    and nothing (the check of the filter directory, start-up) raises."""
    del settings.BASE_DIR
    set_urlguard(settings, DATA_DIR=None, FILTER_PATH=None)
    (error,) = [m for m in check_settings() if m.id == "urlguard.E025"]
    assert "DATA_DIR" in error.msg and "BASE_DIR" in error.msg
    assert "URLGUARD = {'DATA_DIR': '/var/lib/urlguard'}" in error.hint
    with pytest.raises(ImproperlyConfigured, match="urlguard.E025"):
        conf.FILTER_PATH  # noqa: B018
    set_urlguard(settings, FILTER_PATH="/srv/urlguard/filter.bin")
    assert conf.FILTER_PATH == "/srv/urlguard/filter.bin"


def test_a_wrong_filter_path_is_reported_once(settings):
    set_urlguard(settings, FILTER_PATH=5)
    assert ids() == ["urlguard.E010"]


def test_e004_middleware_missing(settings):
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != MIDDLEWARE_PATH]
    errors = [m for m in check_settings() if m.id == "urlguard.E004"]
    assert errors and MIDDLEWARE_PATH in errors[0].hint


def test_e084_trusted_proxies_without_their_middleware(settings):
    set_urlguard(settings, TRUSTED_PROXIES=["127.0.0.1/32"])
    assert "urlguard.E084" not in ids()
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != PROXY_MIDDLEWARE_PATH]
    (error,) = [m for m in check_settings() if m.id == "urlguard.E084"]
    assert PROXY_MIDDLEWARE_PATH in error.hint and "REMOTE_ADDR" in error.msg
    set_urlguard(settings, TRUSTED_PROXIES=[])
    assert "urlguard.E084" not in ids()


def test_e005_bad_policy_names_the_choices(settings):
    set_urlguard(settings, ON_FILTER_ERROR="maybe")
    (error,) = [m for m in check_settings() if m.id == "urlguard.E005"]
    assert "'maybe'" in error.msg and "database" in error.msg


def test_e000_namespace_not_a_dict(settings):
    settings.URLGUARD = [("FILTER_PATH", "/tmp/x")]
    assert ids() == ["urlguard.E000"]


def test_w002_unknown_setting_says_did_you_mean(settings):
    set_urlguard(settings, FILTER_CAPACTIY=10)
    (warning,) = [m for m in check_settings() if m.id == "urlguard.W002"]
    assert "FILTER_CAPACTIY" in warning.msg and "Did you mean 'FILTER_CAPACITY'?" in warning.hint


def test_w002_unknown_setting_with_nothing_close_lists_the_known_ones(settings):
    set_urlguard(settings, COLOUR="blue")
    (warning,) = [m for m in check_settings() if m.id == "urlguard.W002"]
    assert "'COLOUR'" in warning.msg and "REDIRECT_MAX_AGE" in warning.hint


@pytest.mark.django_db
def test_missing_file_does_not_block_the_command_that_fixes_it(filter_path):
    call_command("rebuild_filter", skip_checks=False, stdout=io.StringIO())
    assert filter_path.exists()
    assert check_settings() == []


# -- a wrong value stops the start, not every redirect --------------------------------


def test_manage_py_check_stops_on_a_wrong_value(settings):
    set_urlguard(settings, REDIRECT_MAX_AGE="90s")
    with pytest.raises(SystemCheckError, match="urlguard.E014"):
        call_command("check", stdout=io.StringIO(), stderr=io.StringIO())
    with pytest.raises(SystemCheckError, match="REDIRECT_MAX_AGE"):
        refuse_to_start()


def test_refuse_to_start_lets_warnings_through(filter_path):
    refuse_to_start()  # W001 (no filter file yet) is only a warning


def _boot(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run `args` with settings whose URLGUARD has REDIRECT_MAX_AGE='90s'."""
    (tmp_path / "wrong_settings.py").write_text(
        "from urlguard_service.settings import *  # noqa: F403\n"
        "URLGUARD = {**URLGUARD, 'REDIRECT_MAX_AGE': '90s'}  # noqa: F405\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "DJANGO_SETTINGS_MODULE": "wrong_settings",
        "URLGUARD_VAR_DIR": str(tmp_path / "var"),
        "URLGUARD_FILTER_PATH": str(tmp_path / "var" / "filter.bin"),
    }
    env.pop("DATABASE_URL", None)
    env.pop("CELERY_BROKER_URL", None)
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
@pytest.mark.parametrize("entry_point", ["urlguard_service.wsgi", "urlguard_service.asgi"])
def test_wsgi_and_asgi_boot_stop_on_a_wrong_value(tmp_path, entry_point):
    """What gunicorn (or an ASGI server) does first: import the application."""
    done = _boot(tmp_path, "-c", f"import {entry_point}")
    assert done.returncode != 0
    assert "urlguard.E014" in done.stderr and "'90s'" in done.stderr


@pytest.mark.slow
def test_runserver_stops_on_a_wrong_value(tmp_path):
    done = _boot(tmp_path, "manage.py", "runserver", "--noreload", "127.0.0.1:18401")
    assert done.returncode != 0
    assert "urlguard.E014" in done.stderr


# -- SECRET_KEY and the var directory -------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "dev-only-insecure-key-change-me-in-production",
        "django-insecure-" + "x1y2z3" * 10,
        "short-but-random-9f8e7d",
        "a" * 60,
        "CHANGE-ME-50-OR-MORE-RANDOM-CHARACTERS-CHANGE-ME-CHANGE-ME",
        "x7Qp" * 10 + "-replace-me",
    ],
)
def test_e100_a_known_or_short_secret_key_with_debug_off(settings, key):
    settings.DEBUG = False
    settings.SECRET_KEY = key
    errors = [m for m in checks.run_checks(tags=["urlguard"]) if m.id == "urlguard.E100"]
    assert len(errors) == 1 and "DJANGO_SECRET_KEY" in errors[0].hint
    with pytest.raises(SystemCheckError, match="urlguard.E100"):
        refuse_to_start()


def test_e100_not_raised_for_a_long_random_key_or_with_debug_on(settings):
    settings.DEBUG = False
    settings.SECRET_KEY = "k3J9-x" * 10
    assert "urlguard.E100" not in {m.id for m in checks.run_checks(tags=["urlguard"])}
    settings.DEBUG = True
    settings.SECRET_KEY = "dev-only-insecure-key-change-me-in-production"
    assert "urlguard.E100" not in {m.id for m in checks.run_checks(tags=["urlguard"])}


@pytest.mark.parametrize("password", ["CHANGE-ME", "changeme", "PASSWORD", "Replace_Me"])
def test_e101_a_placeholder_database_password_with_debug_off(settings, monkeypatch, password):
    settings.DEBUG = False
    # In place: overriding DATABASES is refused (SQLite ignores the password).
    monkeypatch.setitem(settings.DATABASES["default"], "PASSWORD", password)
    errors = [m for m in checks.run_checks(tags=["urlguard"]) if m.id == "urlguard.E101"]
    assert len(errors) == 1 and "'default'" in errors[0].msg and "DATABASE_URL" in errors[0].hint
    settings.DEBUG = True
    assert "urlguard.E101" not in {m.id for m in checks.run_checks(tags=["urlguard"])}


def test_e101_not_raised_for_a_real_password(settings, monkeypatch):
    settings.DEBUG = False
    monkeypatch.setitem(settings.DATABASES["default"], "PASSWORD", "k3J9-x0q")
    assert "urlguard.E101" not in {m.id for m in checks.run_checks(tags=["urlguard"])}


def test_w003_var_dir_readable_by_others(settings, filter_path):
    var = filter_path.parent
    assert "urlguard.W003" not in {m.id for m in checks.run_checks(tags=["urlguard"])}
    var.chmod(0o755)
    (warning,) = [m for m in checks.run_checks(tags=["urlguard"]) if m.id == "urlguard.W003"]
    assert "755" in warning.msg and f"chmod 700 {var}" in warning.hint
