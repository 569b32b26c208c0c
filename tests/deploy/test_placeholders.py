"""Every secret the shipped deploy files (deploy/: Kubernetes, compose, systemd, the
.env examples) leave for the operator to fill in is refused as it ships: a copied
file never starts a service on a value everyone who has read it knows. The secrets
are found by reading the files, so a placeholder added to them later is held to the
same rule, and a new kind of secret fails here until the service refuses its
placeholder too."""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from tests.support.deploy import entrypoint, environment

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
_SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD")
_ASSIGNMENT = re.compile(r"^\s*(?:Environment=)?([A-Z][A-Z0-9_]*)=(.*)$")


def _is_secret(name: str, value: str) -> bool:
    return bool(_SECRET_NAME.search(name)) or urlsplit(value).password is not None


_INTERPOLATION = re.compile(r"\$\{\w+(?::?([-?])([^}]*))?\}")


def _compose_default(value: str) -> str | None:
    """What compose sets `value` to where the operator's .env sets nothing: its
    ${NAME:-default}s replaced by their defaults; None where a ${NAME:?...} stops
    compose instead (the .env example's empty value is then checked)."""
    if any(m.group(1) == "?" for m in _INTERPOLATION.finditer(value)):
        return None
    return _INTERPOLATION.sub(lambda m: m.group(2) or "", value)


def shipped_secrets() -> list[tuple[str, str, str]]:
    """(file, variable, value) of every secret a deploy file ships."""
    found = []
    for path in sorted(DEPLOY.rglob("*")):
        if not path.is_file():
            continue
        name = str(path.relative_to(ROOT))
        if path.suffix == ".yaml":
            for document in yaml.safe_load_all(path.read_text()):
                if not isinstance(document, dict):
                    continue
                if document.get("kind") in ("Secret", "ConfigMap"):
                    data = {**document.get("data", {}), **document.get("stringData", {})}
                    found += [(name, k, str(v)) for k, v in data.items() if _is_secret(k, str(v))]
                for service in (document.get("services") or {}).values():
                    environment = service.get("environment") or {}
                    for variable, value in environment.items():
                        shipped = _compose_default(str(value))
                        if shipped is not None and _is_secret(variable, shipped):
                            found.append((name, variable, shipped))
        elif path.name.endswith(".env.example") or path.suffix == ".service":
            for line in path.read_text().splitlines():
                match = _ASSIGNMENT.match(line)
                if match and _is_secret(*match.groups()):
                    found.append((name, *match.groups()))
    return found


SHIPPED = shipped_secrets()


def test_the_deploy_files_are_read():
    found = {(file, variable) for file, variable, _ in SHIPPED}
    assert ("deploy/kubernetes/config.yaml", "DJANGO_SECRET_KEY") in found
    assert ("deploy/kubernetes/config.yaml", "URLGUARD_METRICS_TOKEN") in found
    assert ("deploy/systemd/urlguard.env.example", "DATABASE_URL") in found
    assert ("deploy/compose.env.example", "POSTGRES_PASSWORD") in found
    assert ("deploy/compose.yaml", "DJANGO_SUPERUSER_PASSWORD") in found  # ${...:-}


def _check(tmp_path: Path, **variables: str) -> subprocess.CompletedProcess[str]:
    """`manage.py check` of the service with a good environment but `variables`."""
    good = {
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
    }
    env = environment(tmp_path / "var", **{**good, **variables})
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _refused_by_check(tmp_path: Path, check_id: str, **variables: str) -> None:
    done = _check(tmp_path, **variables)
    assert done.returncode != 0 and check_id in done.stderr, (variables, done.stderr[-2000:])


def _compose_requires(variable: str) -> None:
    """compose.yaml stops on an empty value: every use is ${NAME:?...}."""
    text = (DEPLOY / "compose.yaml").read_text()
    uses = re.findall(r"\$\{" + variable + r"(:?[?-]?)", text)
    assert uses and set(uses) == {":?"}, (variable, uses)


def refuse(tmp_path: Path, variable: str, value: str, migrated: Path) -> None:
    """Shows that the service refuses `value` for `variable` (`migrated`: a var
    directory with a migrated database, tests/deploy/conftest.py)."""
    if variable == "DJANGO_SECRET_KEY":
        _refused_by_check(tmp_path, "urlguard.E100", DJANGO_SECRET_KEY=value)
    elif variable == "URLGUARD_METRICS_TOKEN":
        _refused_by_check(tmp_path, "urlguard.E074", URLGUARD_METRICS_TOKEN=value)
    elif variable == "DATABASE_URL":
        _refused_by_check(tmp_path, "urlguard.E101", DATABASE_URL=value)
    elif variable == "POSTGRES_PASSWORD":
        if not value:
            _compose_requires(variable)
        else:
            url = f"postgres://urlguard:{value}@postgres:5432/urlguard"
            _refused_by_check(tmp_path, "urlguard.E101", DATABASE_URL=url)
    elif variable == "DJANGO_SUPERUSER_PASSWORD":
        env = environment(migrated)
        admin = {"DJANGO_SUPERUSER_USERNAME": "root", "DJANGO_SUPERUSER_PASSWORD": value}
        done = entrypoint("createsuperuser", env={**env, **admin})
        assert done.returncode != 0 and "DJANGO_SUPERUSER_PASSWORD" in done.stderr, done.stderr
        assert "Superuser created" not in done.stdout
    else:
        pytest.fail(f"{variable} is a secret deploy/ ships: say how its placeholder is refused")


@pytest.mark.parametrize(("file", "variable", "value"), SHIPPED)
def test_a_shipped_placeholder_is_refused(tmp_path, migrated, file, variable, value):
    refuse(tmp_path, variable, value, migrated)


def test_real_values_pass(tmp_path):
    """The refusals are of the placeholders, not of every value."""
    done = _check(
        tmp_path,
        URLGUARD_METRICS_TOKEN=secrets.token_urlsafe(24),
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    done = _check(tmp_path, DATABASE_URL="postgres://urlguard:Zq8-x1@postgres:5432/urlguard")
    assert "urlguard.E101" not in done.stderr
