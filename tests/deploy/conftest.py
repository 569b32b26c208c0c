"""Fixtures for tests/deploy: a var directory whose embedded database is migrated, and
an nginx prefix (a certificate and a config that includes site.conf). Every
test here runs the deploy files' own programs (entrypoint.sh, gunicorn, nginx, the
linters): all are `slow`, left out of `make test-fast`."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.deploy import entrypoint, environment, run, tool
from tests.support.services import services_available  # noqa: F401  (LIVE's fixture)

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:  # every test of the session: only this folder's are marked
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def _migrated_databases(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    var = tmp_path_factory.mktemp("migrated") / "var"
    done = entrypoint("migrate", env=environment(var))
    assert done.returncode == 0, done.stderr
    return sorted(var.glob("*.sqlite3"))


@pytest.fixture
def migrated(_migrated_databases: list[Path], tmp_path: Path) -> Path:
    """tmp_path/var with the embedded database as `entrypoint.sh migrate` leaves it:
    migrated once per run and copied (each migration costs a subprocess seconds;
    test_entrypoint.py tests the migrate role itself). Nothing else of that run
    is copied: the secret key and the metric files are this test's own."""
    var = tmp_path / "var"
    var.mkdir(exist_ok=True)  # tests/conftest.py's filter_path made it
    for database in _migrated_databases:
        shutil.copy2(database, var / database.name)
    return var


@pytest.fixture
def nginx_prefix(tmp_path) -> Path:
    nginx = tool("nginx", "Debian nginx-light")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    made = run(
        "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        "-subj", "/CN=links.example.org", "-keyout", key, "-out", cert,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    (tmp_path / "nginx.conf").write_text(
        f"pid {tmp_path}/nginx.pid;\nerror_log {tmp_path}/error.log;\nevents {{}}\n"
        f"http {{\n    access_log off;\n    include {tmp_path}/site.conf;\n}}\n"
    )
    tmp_path.joinpath("nginx").symlink_to(nginx)
    return tmp_path
