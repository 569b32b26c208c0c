"""deploy/entrypoint.sh, the one script the image, compose, Kubernetes, the systemd
units and the topology test start every role with: the settings module is manage.py's
default, each role runs what it says (on the embedded SQLite here; the several-node
run on PostgreSQL and Redis is tests/deploy/test_topology.py)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request

from tests.support.deploy import ENTRYPOINT, entrypoint, environment, free_port, web_role


def test_the_settings_module_is_manage_pys_default(tmp_path):
    """Moving the service's settings changes manage.py only: the script follows it."""
    (tmp_path / "deploy").mkdir()
    script = tmp_path / "deploy" / "entrypoint.sh"
    shutil.copy(ENTRYPOINT, script)
    (tmp_path / "manage.py").write_text(
        "import os, sys\n"
        'os.environ.setdefault("DJANGO_SETTINGS_MODULE", "elsewhere.service.settings")\n'
        'print(os.environ["DJANGO_SETTINGS_MODULE"], os.environ["PROMETHEUS_MULTIPROC_DIR"], '
        "*sys.argv[1:])\n"
    )
    env = environment(tmp_path / "var")
    done = entrypoint("manage", "filter_info", "--json", env=env, script=script)
    assert done.returncode == 0, done.stderr
    metrics = tmp_path / "var" / "metrics"
    expected = ["elsewhere.service.settings", str(metrics), "filter_info", "--json"]
    assert done.stdout.split() == expected
    assert metrics.is_dir()
    env["DJANGO_SETTINGS_MODULE"] = "mine.settings"
    done = entrypoint("manage", "check", env=env, script=script)
    assert done.stdout.split()[0] == "mine.settings"


def test_an_unknown_role_is_refused_with_the_list(tmp_path):
    done = entrypoint("wbe", env=environment(tmp_path))
    assert done.returncode == 2
    assert "unknown role 'wbe'" in done.stderr
    for role in ("web", "worker", "beat", "dns", "migrate", "createsuperuser", "healthcheck dns"):
        assert f"entrypoint.sh {role}" in done.stderr
    assert entrypoint(env=environment(tmp_path)).returncode == 2


def test_migrate_then_the_first_admin_from_the_environment(tmp_path):
    env = environment(tmp_path / "var")
    done = entrypoint("createsuperuser", env=env)
    assert done.returncode != 0
    assert "set DJANGO_SUPERUSER_USERNAME" in done.stderr
    done = entrypoint("migrate", env=env)
    assert done.returncode == 0, done.stderr
    assert "Applying urlguard.0001" in done.stdout
    admin = {"DJANGO_SUPERUSER_USERNAME": "root", "DJANGO_SUPERUSER_EMAIL": "root@example.org"}
    done = entrypoint("createsuperuser", env={**env, **admin})
    assert done.returncode != 0 and "set DJANGO_SUPERUSER_PASSWORD" in done.stderr
    admin["DJANGO_SUPERUSER_PASSWORD"] = "first-password-7d1f"
    done = entrypoint("createsuperuser", env={**env, **admin})
    assert done.returncode == 0, done.stderr
    assert "Superuser created successfully." in done.stdout
    # Run again at every deploy: the user stays, and so does its password.
    again = {**admin, "DJANGO_SUPERUSER_PASSWORD": "another-password-0c2e"}
    done = entrypoint("createsuperuser", env={**env, **again})
    assert done.returncode == 0, done.stderr
    assert "user root exists; left unchanged" in done.stdout
    probe = (
        "from django.contrib.auth.models import User; u = User.objects.get(username='root'); "
        "print(u.is_superuser and u.check_password('first-password-7d1f'))"
    )
    done = entrypoint("manage", "shell", "--verbosity", "0", "-c", probe, env=env)
    assert done.stdout.strip() == "True", done.stderr


def test_web_serves_and_its_healthcheck_says_so(tmp_path, migrated):
    env = environment(migrated)
    bind = f"127.0.0.1:{free_port()}"
    env.update(URLGUARD_BIND=bind, WEB_CONCURRENCY="1")
    assert entrypoint("healthcheck", env=env).returncode != 0  # nothing listens yet
    with (
        web_role(env, tmp_path / "web.log"),
        urllib.request.urlopen(f"http://{bind}/metrics", timeout=10) as answer,
    ):
        assert b"urlguard_filter_readable" in answer.read()
    text = (tmp_path / "web.log").read_text()
    # gunicorn (the exec'd process, so signals reach it) with the metrics hooks.
    assert "urlguard metrics in" in text and str(tmp_path / "var" / "metrics") in text
    assert '"GET /metrics HTTP/1.1" 200' in text


def free_dns_port() -> int:
    """A port free for UDP and TCP both, in this test run's range (18200-18299)."""
    for port in range(18250, 18300):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u, socket.socket() as t:
            try:
                u.bind(("127.0.0.1", port))
                t.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port in 18250-18299")


def test_dns_serves_and_its_healthcheck_says_so(tmp_path, migrated):
    import dns.message
    import dns.query

    var = migrated
    env = environment(var)
    port = free_dns_port()
    env.update(URLGUARD_DNS_BIND=f"127.0.0.1:{port}", URLGUARD_DNS_RPZ_ZONE="rpz.example.net.")
    assert entrypoint("healthcheck", "dns", env=env, timeout=30).returncode != 0  # not yet
    log = (tmp_path / "dns.log").open("w")
    server = subprocess.Popen(
        ["sh", str(ENTRYPOINT), "dns"], env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while entrypoint("healthcheck", "dns", env=env, timeout=30).returncode != 0:
            assert server.poll() is None, (tmp_path / "dns.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "dns.log").read_text()
            time.sleep(0.2)
        query = dns.message.make_query("2.0.0.127.uribl.urlguard.", "A")
        answer = dns.query.udp(query, "127.0.0.1", port=port, timeout=5)
        assert answer.answer[0][0].to_text() == "127.0.0.2"
        # The zone comes from the environment: the default one is no longer served.
        query = dns.message.make_query("rpz.urlguard.", "SOA")
        assert dns.query.udp(query, "127.0.0.1", port=port, timeout=5).rcode() == 5  # REFUSED
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        log.close()
    text = (tmp_path / "dns.log").read_text()
    # serve_dns itself (exec'd: SIGTERM reached it) on the address and port given.
    assert f"serve_dns on 127.0.0.1 port {port}" in text and "serve_dns stopped." in text
    assert server.returncode == 0
    # Its metrics are in the node's directory, which the node's web sums at /metrics.
    assert list((var / "metrics").glob("*.db"))


def test_the_worker_refuses_the_shipped_secret_key_off_the_demo(tmp_path):
    """The system checks stop it as they stop gunicorn, before it reaches for a broker."""
    env = environment(
        tmp_path / "var",
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
        CELERY_BROKER_URL="redis://127.0.0.1:1/0",
    )
    done = entrypoint("worker", env=env, timeout=60)
    assert done.returncode == 1
    assert "urlguard.E100" in done.stdout + done.stderr
