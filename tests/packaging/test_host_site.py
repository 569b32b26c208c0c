"""What a Django site owner does: build the wheel, install it into a fresh
virtualenv, make a site with `django-admin startproject` that uses
django.contrib.redirects, add only the lines README.md's "Add it to your Django
site" names, then migrate, check, and follow the site's redirects (WSGI and ASGI
handlers) and open the app's admin pages; then the same on the lowest Django the
wheel's range admits."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("build") is None,
        reason="the wheel is built with `python -m build`, which is not installed "
        "(pip install build, or make install)",
    ),
    pytest.mark.slow,
]

# What the copy the wheel is built from leaves out (caches, the checkout's own state).
NOT_IN_THE_WHEEL = (
    ".git",
    ".venv",
    "var",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".hypothesis",
    "tests",
    "bench",
)

# The site's own redirects, the ones urlguard must guard (not part of the README).
REDIRECTS_APP = """
INSTALLED_APPS += ["django.contrib.sites", "django.contrib.redirects"]
SITE_ID = 1
MIDDLEWARE.append("django.contrib.redirects.middleware.RedirectFallbackMiddleware")
"""


def readme_block(first_line: str) -> str:
    """The fenced Python block of README.md's host section that starts with `first_line`."""
    text = README.read_text()
    section = text.split("## Add it to your Django site", 1)[1].split("\n## ", 1)[0]
    for block in re.findall(r"```python\n(.*?)```", section, re.DOTALL):
        if block.startswith(first_line):
            return block
    raise AssertionError(f"README.md's host section has no block starting {first_line!r}")


def run(args: list, cwd: Path, env: dict, timeout: float = 120, stdin: str = "") -> str:
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def _environment(tmp: Path) -> dict[str, str]:
    """This process's environment minus the service's settings; pip's cache inside
    the test's own directory (the registries' files are local)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "URLGUARD_", "DATABASE_", "CELERY_", "PROMETHEUS_"))
        and k not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    env["PIP_CACHE_DIR"] = str(tmp / "pip-cache")
    return env


def lowest_django() -> str:
    """The lowest Django the wheel's dependency range admits (pyproject.toml)."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    (lowest,) = re.findall(r'^\s*"Django>=([0-9.]+),', pyproject, re.MULTILINE)
    return lowest


def constraints(tmp: Path, django: str) -> Path:
    """The service's versions (constraints.txt), with Django at `django`: only so that
    pip reuses the wheels already on this machine; what is installed is what the
    wheel's own metadata asks for."""
    lines = [
        f"Django=={django}" if line.startswith("Django==") else line
        for line in (ROOT / "constraints.txt").read_text().splitlines()
    ]
    path = tmp / "constraints.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def visit(python: Path, site: Path, env: dict[str, str], report: Path) -> dict:
    """Run host_site_check.py in the site; what a visitor and an admin saw."""
    script = Path(__file__).with_name("host_site_check.py")
    run([python, script, report], site, {**env, "PYTHONPATH": str(site)})
    return json.loads(report.read_text())


def assert_guarded(seen: dict) -> None:
    for stack in ("sync", "async"):
        bad, clean = seen[stack]["/go-bad/"], seen[stack]["/go-clean/"]
        assert bad["status"] == 403 and bad["location"] is None, (stack, bad)
        assert bad["phishing"] and bad["report_href"], (stack, bad)
        assert seen[stack]["report_status"] == 200, stack
        assert clean == {
            "status": 301,
            "location": "https://www.djangoproject.com/start/",
            "phishing": False,
            "report_href": None,
        }, (stack, clean)
    assert not seen["celery_installed"]  # an extra: the rule above applied in-process
    assert seen["metrics_status"] == 501  # an extra too: the page says what to install
    assert seen["slug_status"] == 404 and not seen["shortlink_admin"]
    assert seen["admin_header"] == "Django administration"  # the site's own branding
    assert len(seen["admin"]) > 8
    assert all(status == 200 for status in seen["admin"].values()), seen["admin"]


def test_a_new_site_installs_the_wheel_and_every_redirect_is_guarded(tmp_path):
    env = _environment(tmp_path)
    # Built from a copy: setuptools writes build/ and *.egg-info beside the sources.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*NOT_IN_THE_WHEEL))
    run([sys.executable, "-m", "build", "--wheel", "--outdir", tmp_path / "dist", "."], source, env)
    (wheel,) = (tmp_path / "dist").glob("urlguard-*.whl")
    # The metadata an index shows: readme rendered, no warning.
    run([sys.executable, "-m", "twine", "check", "--strict", wheel], ROOT, env)
    venv.create(tmp_path / "venv", with_pip=True)
    python = tmp_path / "venv" / "bin" / "python"
    pip = [python, "-m", "pip", "install", "-q"]
    run([*pip, "-c", ROOT / "constraints.txt", wheel], tmp_path, env, timeout=300)

    site = tmp_path / "site"
    site.mkdir()
    run([python, "-m", "django", "startproject", "mysite", site], tmp_path, env)
    settings_py = site / "mysite" / "settings.py"
    settings_py.write_text(settings_py.read_text() + REDIRECTS_APP + readme_block("# settings.py"))
    urls_py = site / "mysite" / "urls.py"
    urls_py.write_text(urls_py.read_text() + "\n" + readme_block("# urls.py"))

    run([python, "manage.py", "migrate", "--noinput"], site, env)
    # README's first rule: a host and every subdomain.
    added = run(
        [python, "manage.py", "import_rules", "-", "--category", "phishing"],
        site,
        env,
        stdin="evil.example\n",
    )
    assert "1 added" in added, added
    checked = run([python, "manage.py", "check"], site, env)
    assert checked.strip() == "System check identified no issues (0 silenced).", checked
    assert_guarded(visit(python, site, env, tmp_path / "seen.json"))

    # The same site on the lowest Django the wheel's range admits.
    lowest = lowest_django()
    run([*pip, "-c", constraints(tmp_path, lowest), f"Django=={lowest}"], tmp_path, env)
    assert run([python, "-m", "django", "--version"], tmp_path, env).strip() == lowest
    checked = run([python, "manage.py", "check"], site, env)
    assert checked.strip() == "System check identified no issues (0 silenced).", checked
    assert_guarded(visit(python, site, env, tmp_path / "seen-lowest.json"))


def test_the_readme_installs_from_a_checkout_while_the_index_has_no_urlguard():
    """Every install command of README's host section names a checkout or its built
    wheels (`pip install urlguard` alone would ask PyPI, where it is not yet)."""
    section = README.read_text().split("## Add it to your Django site", 1)[1].split("\n## ", 1)[0]
    commands = [
        line.split("#", 1)[0].strip()
        for block in re.findall(r"```sh\n(.*?)```", section, re.DOTALL)
        for line in block.splitlines()
        if line.startswith("pip install")
    ]
    assert commands
    for command in commands:
        assert "/path/to/urlguard" in command, command
    assert any(c.startswith("pip install --find-links /path/to/urlguard/dist") for c in commands)
