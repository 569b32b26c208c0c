"""The deployment run for real: two nodes, each a web (gunicorn) and a worker started by
deploy/entrypoint.sh as the image, compose, Kubernetes and systemd start them, against
PostgreSQL and Redis, and one beat. A rule listed on node 1 is blocked on node 2; node
2's worker, stopped while 200 changes are made, catches up when it is back; a second
beat started by mistake does no harm.

A `live` test (`make test-live`); the processes use the test database
pytest-django creates, so the test commits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

from tests.support.deploy import ENTRYPOINT, ROOT, free_port
from tests.support.services import LIVE, WORKER_SECRET_KEY, wait_for
from urlguard.models import SpamRule
from urlguard.nodesync import sync
from urlguard.writepath import changes

pytestmark = LIVE


class Role:
    """One `entrypoint.sh ROLE` process with its own log."""

    def __init__(self, role: str, env: dict[str, str], log: Path):
        self.role, self.log = role, log
        self._out = log.open("a")
        self.proc = subprocess.Popen(
            ["sh", str(ENTRYPOINT), role],
            cwd=ROOT,
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        self._out.close()


class Node:
    """A node as deploy/ runs it: web and worker sharing one var directory."""

    def __init__(self, name: str, base: Path, common: dict[str, str]):
        self.name = name
        self.var = base / name
        self.var.mkdir()
        self.port = free_port()
        self.env = {
            **common,
            "URLGUARD_NODE_NAME": name,
            "URLGUARD_VAR_DIR": str(self.var),
            "PROMETHEUS_MULTIPROC_DIR": str(self.var / "metrics"),
            "URLGUARD_BIND": f"127.0.0.1:{self.port}",
            "WEB_CONCURRENCY": "1",
        }
        self.filter_path = self.var / "filter.bin"
        self.web: Role | None = None
        self.worker: Role | None = None

    def start_worker(self) -> None:
        self.worker = Role("worker", self.env, self.var / "worker.log")
        wait_for(
            lambda: " ready." in self.worker.log.read_text(errors="replace"),
            timeout=60,
            what=f"{self.name}'s worker",
            log=self.worker.log,
        )
        # Redis fanout is pub/sub: a moment for the subscription to be live.
        time.sleep(0.3)

    def start_web(self) -> None:
        self.web = Role("web", self.env, self.var / "web.log")
        wait_for(lambda: self.get("/healthz")[0] == 200, 60, f"{self.name}'s web", self.web.log)

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except OSError:
            return 0, b""

    def blocks(self, url: str) -> bool:
        status, body = self.get(f"/api/check?url={urllib.parse.quote(url, safe='')}")
        assert status == 200, body
        return json.loads(body)["blocked"]

    def metric(self, name: str) -> float | None:
        status, body = self.get("/metrics")
        assert status == 200, body
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                if sample.name == name and not sample.labels:
                    return sample.value
        return None

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            ["sh", str(ENTRYPOINT), "manage", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def stop(self) -> None:
        for role in (self.web, self.worker):
            if role is not None:
                role.stop()


@pytest.fixture
def deployment(tmp_path):
    db = connection.settings_dict
    common = {
        **{
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("URLGUARD_", "PROMETHEUS_", "DJANGO_"))
        },
        # The project's settings with the catch-up interval from the environment.
        "DJANGO_SETTINGS_MODULE": "tests.support.services_settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}",
        "CELERY_BROKER_URL": django_settings.CELERY_BROKER_URL,
        "DJANGO_SECRET_KEY": WORKER_SECRET_KEY,
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "URLGUARD_PYTHON": sys.executable,
        "URLGUARD_CATCHUP_INTERVAL": "2",
    }
    nodes = [Node(f"node{i}", tmp_path, common) for i in (1, 2)]
    beats: list[Role] = []

    def beat(n: int) -> Role:
        env = {**common, "URLGUARD_VAR_DIR": str(tmp_path / f"beat{n}")}
        (tmp_path / f"beat{n}").mkdir()
        role = Role("beat", env, tmp_path / f"beat{n}.log")
        beats.append(role)
        wait_for(
            lambda: "beat: Starting..." in role.log.read_text(errors="replace"),
            30,
            "beat",
            role.log,
        )
        return role

    try:
        for node in nodes:
            node.start_worker()
            node.start_web()
        yield nodes, beat, beats
    finally:
        for node in nodes:
            node.stop()
        for role in beats:
            role.stop()


def test_two_nodes_one_beat_through_the_entrypoint(deployment, tmp_path):
    (node1, node2), beat, beats = deployment
    beat(1)
    for node in (node1, node2):
        wait_for(lambda n=node: n.get("/readyz")[0] == 200, 30, f"{node.name} ready", node.web.log)

    # A rule listed on node 1 (its manage.py) is blocked on node 2.
    (tmp_path / "one.txt").write_text("https://first.evil.example/\n")
    node1.manage("import_rules", str(tmp_path / "one.txt"), "--category", "phishing")
    wait_for(
        lambda: node2.blocks("https://first.evil.example/login"),
        what="node 2 to block node 1's rule",
        log=node2.worker.log,
    )
    assert not node2.blocks("https://clean.example/")

    # Node 2's worker is down while 200 changes are made: the nudges it missed are gone
    # (Redis fanout), so only its catch-up can bring the file level again.
    node2.worker.stop()
    (tmp_path / "many.txt").write_text(
        "".join(f"https://host{i}.bulk.example/\n" for i in range(200))
    )
    node1.manage("import_rules", str(tmp_path / "many.txt"))
    head = sync.log_head()
    wait_for(lambda: node1.metric("urlguard_filter_applied_seq") == head, what="node 1")
    assert node2.metric("urlguard_filter_lag_changes") == 200
    assert not node2.blocks("https://host7.bulk.example/x")  # stale: the filter lags
    node2.start_worker()
    wait_for(
        lambda: node2.metric("urlguard_filter_lag_changes") == 0,
        timeout=30,
        what="node 2 to catch up",
        log=node2.worker.log,
    )
    assert node2.blocks("https://host7.bulk.example/x")
    assert node2.metric("urlguard_filter_rules") == 201 == SpamRule.objects.count()

    # A second beat by mistake: every catch-up and verify is scheduled twice, and each
    # node still applies each change exactly once (counting filters double-count a
    # change applied twice, which the rule counts and a full verify would show).
    second = beat(2)
    gone = [f"host{i}.bulk.example/" for i in range(50)]
    for rule in SpamRule.objects.filter(expression__in=gone):
        changes.remove_rule(rule)
    changes.add_rule("late.evil.example", category="malware")
    head = sync.log_head()
    wait_for(
        lambda: "Sending due task urlguard-catch-up" in second.log.read_text(),
        what="the second beat to schedule",
        log=second.log,
    )
    expected = SpamRule.objects.count()
    for node in (node1, node2):
        wait_for(
            lambda n=node: n.metric("urlguard_filter_applied_seq") == head,
            timeout=30,
            what=f"{node.name} at the log head",
            log=node.worker.log,
        )
    first = [b.log.read_text().count("due task urlguard-catch-up") for b in beats]
    wait_for(
        lambda: all(
            b.log.read_text().count("due task urlguard-catch-up") >= n + 2
            for b, n in zip(beats, first, strict=True)
        ),
        what="two more catch-ups from each beat",
    )
    assert len(first) == 2
    for node in (node1, node2):
        assert node.metric("urlguard_filter_rules") == expected
        node.manage("verify_filter")  # exits non-zero on a rule missing from the file
        assert node.blocks("https://late.evil.example/")
        assert not node.blocks("https://host1.bulk.example/")
