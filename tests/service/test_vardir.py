"""urlguard_service.vardir and the settings that use it: var/ is made 0700 with its files
0600, the embedded demo makes (once) and keeps a random SECRET_KEY there, and a
deployment with a real database and no key is refused at start."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from urlguard_service import vardir

ROOT = Path(__file__).resolve().parents[2]


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_private_dir_is_owner_only_even_under_a_lax_umask(tmp_path):
    old = os.umask(0o002)
    try:
        vardir.make_private_dir(tmp_path / "a" / "var")
    finally:
        os.umask(old)
    assert mode(tmp_path / "a" / "var") == 0o700


def test_private_dir_leaves_an_existing_directory_alone(tmp_path):
    existing = tmp_path / "shared"
    existing.mkdir()
    existing.chmod(0o750)
    vardir.make_private_dir(existing)
    assert mode(existing) == 0o750


def test_private_file_is_0600_and_never_follows_a_symlink(tmp_path):
    vardir.make_private_file(tmp_path / "db.sqlite3")
    assert mode(tmp_path / "db.sqlite3") == 0o600
    target = tmp_path / "target"
    (tmp_path / "planted").symlink_to(target)
    vardir.make_private_file(tmp_path / "planted")  # exists (as a link): left alone
    assert not target.exists()


def test_demo_secret_key_is_random_private_and_kept(tmp_path):
    tmp_path = tmp_path / "keys"
    tmp_path.mkdir()
    path = tmp_path / "secret_key"
    key = vardir.demo_secret_key(path)
    assert len(key) >= 50 and len(set(key)) >= 5
    assert mode(path) == 0o600
    assert vardir.demo_secret_key(path) == key
    assert vardir.demo_secret_key(tmp_path / "other") != key
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "secret_key"]


def test_demo_secret_key_two_starts_at_once_agree(tmp_path, monkeypatch):
    """The other process links its key into place between our read and our link."""
    tmp_path = tmp_path / "keys"
    tmp_path.mkdir()
    path = tmp_path / "secret_key"
    real_link = os.link

    def link_after_the_other(src, dst):
        path.write_text("the-other-process-key\n")
        return real_link(src, dst)

    monkeypatch.setattr(os, "link", link_after_the_other)
    assert vardir.demo_secret_key(path) == "the-other-process-key"
    assert [p.name for p in tmp_path.iterdir()] == ["secret_key"]


def _django(tmp_path: Path, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SECRET_KEY", "DJANGO_DEBUG")
        and not k.startswith("URLGUARD_")
    }
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**base, "URLGUARD_VAR_DIR": str(tmp_path / "demo" / "var"), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


SHOW_KEY = (
    "import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'urlguard_service.settings'; "
    "django.setup(); from django.conf import settings; print(settings.SECRET_KEY)"
)


@pytest.mark.slow
def test_the_embedded_demo_makes_its_key_and_var_dir_private(tmp_path):
    first = _django(tmp_path, SHOW_KEY)
    assert first.returncode == 0, first.stderr
    key = first.stdout.strip()
    var = tmp_path / "demo" / "var"
    assert key == (var / "secret_key").read_text().strip()
    assert key != "dev-only-insecure-key-change-me-in-production"
    assert mode(var) == 0o700
    assert mode(var / "secret_key") == 0o600
    assert mode(var / "urlguard.sqlite3") == 0o600
    assert _django(tmp_path, SHOW_KEY).stdout.strip() == key  # kept across restarts


@pytest.mark.slow
def test_an_environment_key_wins_and_nothing_is_written(tmp_path):
    done = _django(tmp_path, SHOW_KEY, DJANGO_SECRET_KEY="from-the-environment")
    assert done.stdout.strip() == "from-the-environment"
    assert not (tmp_path / "demo" / "var" / "secret_key").exists()


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["check", "wsgi"])
def test_a_real_database_without_a_key_does_not_start(tmp_path, entry):
    """DATABASE_URL set (not the demo), no DJANGO_SECRET_KEY, DEBUG off: `check` and
    the gunicorn boot stop with urlguard.E100 (no database connection is needed)."""
    code = (
        "import sys; from django.core.management import execute_from_command_line; "
        "execute_from_command_line(['manage.py', 'check'])"
        if entry == "check"
        else "import urlguard_service.wsgi"
    )
    env = {
        "DATABASE_URL": "postgres://nobody@127.0.0.1:9/none",
        "DJANGO_SETTINGS_MODULE": "urlguard_service.settings",
    }
    done = _django(tmp_path, code, **env)
    assert done.returncode != 0
    assert "urlguard.E100" in done.stderr and "DJANGO_SECRET_KEY" in done.stderr
    assert not (tmp_path / "demo" / "var" / "secret_key").exists()
    ok = _django(tmp_path, code, **env, DJANGO_SECRET_KEY="k3J9-x" * 10)
    assert ok.returncode == 0, ok.stderr
