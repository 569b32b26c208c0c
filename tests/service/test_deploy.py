"""The deployment settings README.md's "Deploying safely" describes: with a real key
and DJANGO_HTTPS=1, `manage.py check --deploy` reports only the two HSTS choices the
README explains; without DJANGO_HTTPS, exactly what it turns on; the proxy header
and the health paths a load balancer probes over plain HTTP."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# manage.py in a subprocess, but for the health paths' test.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
KEY = "k3J9-xQ7_p" * 6


def _run(tmp_path: Path, args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    var = tmp_path / "deploy-var"
    var.mkdir(mode=0o700, exist_ok=True)
    (var / "filter.bin").touch()  # W001 (no filter file yet) is not a deployment matter
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "URLGUARD_")) and k not in ("DATABASE_URL",)
    }
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env={
            **base,
            "URLGUARD_VAR_DIR": str(var),
            "URLGUARD_FILTER_PATH": str(var / "filter.bin"),
            "DJANGO_SECRET_KEY": KEY,
            "DJANGO_ALLOWED_HOSTS": "go.example.com",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


def _check_ids(done: subprocess.CompletedProcess[str]) -> set[str]:
    return set(re.findall(r"^\?: \(([\w.]+)\)", done.stderr + done.stdout, re.MULTILINE))


def test_check_deploy_is_clean_apart_from_what_the_readme_explains(tmp_path):
    done = _run(tmp_path, ["manage.py", "check", "--deploy"], DJANGO_HTTPS="1")
    assert done.returncode == 0, done.stderr
    explained = {"security.W005", "security.W021"}  # HSTS for subdomains, preload
    assert _check_ids(done) == explained
    readme = (ROOT / "README.md").read_text()
    assert all(check_id in readme for check_id in explained)


def test_without_https_check_deploy_names_what_django_https_turns_on(tmp_path):
    done = _run(tmp_path, ["manage.py", "check", "--deploy"])
    assert _check_ids(done) == {"security.W004", "security.W008", "security.W012", "security.W016"}


SHOW = (
    "import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'urlguard_service.settings'; "
    "django.setup(); from django.conf import settings as s; "
    "print(s.SECURE_PROXY_SSL_HEADER, s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS, "
    "s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE)"
)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "None False 0 False False"),
        ({"DJANGO_HTTPS": "1"}, "None True 31536000 True True"),
        (
            {"DJANGO_HTTPS": "1", "DJANGO_SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto"},
            "('HTTP_X_FORWARDED_PROTO', 'https') True 31536000 True True",
        ),
    ],
)
def test_https_settings_from_the_environment(tmp_path, env, expected):
    done = _run(tmp_path, ["-c", SHOW], **env)
    assert done.stdout.strip() == expected, done.stderr


@pytest.mark.django_db
def test_health_paths_are_not_redirected_to_https(client, settings):
    settings.SECURE_SSL_REDIRECT = True
    assert client.get("/admin/")["Location"] == "https://testserver/admin/"
    for path in ("/healthz", "/readyz", "/metrics"):
        assert client.get(path).status_code != 301, path


def test_postgresql_connections_give_up_after_a_bounded_wait(tmp_path):
    code = (
        "import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'urlguard_service.settings'; "
        "from django.conf import settings; "
        "print(settings.DATABASES['default']['OPTIONS'].get('connect_timeout'))"
    )
    done = _run(tmp_path, ["-c", code], DATABASE_URL="postgres://postgres@127.0.0.1:5432/unused")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "5"


def test_node_name_metrics_access_and_trusted_proxies_come_from_the_environment(tmp_path):
    """What deploy/ sets per node and per deployment; unset keeps the defaults."""
    probe = (
        "import django; django.setup(); from urlguard.conf import conf; "
        "print(conf.NODE_NAME, repr(conf.METRICS_TOKEN), "
        "[str(n) for n in conf.METRICS_ALLOWED_NETWORKS], "
        "[str(n) for n in conf.TRUSTED_PROXIES])"
    )
    env = {"DJANGO_SETTINGS_MODULE": "urlguard_service.settings"}
    done = _run(
        tmp_path,
        ["-c", probe],
        URLGUARD_NODE_NAME="node7",
        URLGUARD_METRICS_TOKEN="t0ken",
        URLGUARD_METRICS_ALLOWED_NETWORKS="127.0.0.0/8, 10.0.0.0/8",
        URLGUARD_TRUSTED_PROXIES="127.0.0.1/32, ::1",
        **env,
    )
    assert done.stdout.split(" ", 2) == [
        "node7",
        "'t0ken'",
        "['127.0.0.0/8', '10.0.0.0/8'] ['127.0.0.1/32', '::1/128']\n",
    ]
    done = _run(tmp_path, ["-c", probe], **env)
    assert done.stdout.split(" ", 1)[1] == "'' ['127.0.0.0/8', '::1/128'] []\n", done.stderr


def test_the_dns_roles_settings_come_from_the_environment(tmp_path):
    probe = (
        "import django; django.setup(); from urlguard.conf import conf; "
        "print(conf.DNS_RPZ_ZONE, conf.DNS_URIBL_ZONE, "
        "[str(n) for n in conf.DNS_TRANSFER_NETWORKS], conf.DNS_NOTIFY)"
    )
    env = {"DJANGO_SETTINGS_MODULE": "urlguard_service.settings"}
    done = _run(
        tmp_path,
        ["-c", probe],
        URLGUARD_DNS_RPZ_ZONE="rpz.example.net.",
        URLGUARD_DNS_URIBL_ZONE="uribl.example.net.",
        URLGUARD_DNS_TRANSFER_NETWORKS="127.0.0.0/8, 10.0.0.0/24",
        URLGUARD_DNS_NOTIFY="10.0.0.53:53,10.0.0.54:5353",
        **env,
    )
    assert done.stdout.strip() == (
        "rpz.example.net. uribl.example.net. ['127.0.0.0/8', '10.0.0.0/24'] "
        "(('10.0.0.53', 53), ('10.0.0.54', 5353))"
    ), done.stderr
    done = _run(tmp_path, ["-c", probe], **env)
    assert done.stdout.strip() == ("rpz.urlguard. uribl.urlguard. ['127.0.0.0/8', '::1/128'] ()"), (
        done.stderr
    )


def test_the_feed_file_root_and_allowed_networks_come_from_the_environment(tmp_path):
    """README's file:// example needs no edited settings: its environment is enough."""
    probe = (
        "import django; django.setup(); from urlguard.conf import conf; "
        "print(conf.FEED_FILE_ROOT, [str(n) for n in conf.FEED_ALLOWED_NETWORKS])"
    )
    env = {"DJANGO_SETTINGS_MODULE": "urlguard_service.settings"}
    done = _run(
        tmp_path,
        ["-c", probe],
        URLGUARD_FEED_FILE_ROOT="/etc/urlguard/feeds",
        URLGUARD_FEED_ALLOWED_NETWORKS="10.20.0.0/16, fd00:20::/48,",
        **env,
    )
    assert done.stdout.strip() == "/etc/urlguard/feeds ['10.20.0.0/16', 'fd00:20::/48']", (
        done.stderr
    )
    done = _run(tmp_path, ["-c", probe], **env)
    assert done.stdout.strip() == "None []", done.stderr
    # A wrong value is the setting's own system check, as for every other variable.
    check = "import django; django.setup(); from django.core.management import call_command; "
    check += "call_command('check')"
    done = _run(tmp_path, ["-c", check], URLGUARD_FEED_ALLOWED_NETWORKS="intranet", **env)
    assert done.returncode != 0 and "urlguard.E061" in done.stderr, done.stderr
