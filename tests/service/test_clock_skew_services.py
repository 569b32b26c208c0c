"""Long writes of nodes whose clocks are an hour off, for real: each node is a process
of its own under libfaketime (Debian's libfaketime), named as a host of its own, on
PostgreSQL, which holds the one
clock every age is judged on. A node an hour ahead killed mid-work (after its heartbeat
beat) is taken over once HEARTBEAT_TIMEOUT has passed on the database's clock, not an
hour later; a live node an hour behind, beating, is never taken over."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection

from tests.support.services import LIVE, unavailable
from urlguard.feeds import refresh
from urlguard.models import AdminJob, ChangeSet, Source
from urlguard.runtime import ownership
from urlguard.writepath import changes

pytestmark = LIVE

ROOT = Path(__file__).resolve().parents[2]
FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
HOUR = 3600
TIMEOUT = 5  # the observer's HEARTBEAT_TIMEOUT, seconds
INTERVAL = 0.25  # the nodes' HEARTBEAT_INTERVAL, seconds

# Takes work (`job`: an admin job; `claim`: a feed's refresh claim; `change_set`), lets
# its heartbeat beat once, prints its own clock and keeps working (its heartbeat thread
# beating) until the test kills it or closes its stdin.
NODE = textwrap.dedent("""
    import os, sys
    import django
    django.setup()
    from django.conf import settings
    settings.URLGUARD = {**settings.URLGUARD, "HEARTBEAT_INTERVAL": float(os.environ["INTERVAL"])}
    from django.utils import timezone
    from urlguard.models import ChangeSet, Source
    from urlguard.runtime import ownership

    # Another host (this one would know its process dead at once, whatever the clocks).
    ownership.this_host = lambda: "skewed-node"
    what, pk = sys.argv[1], int(sys.argv[2])
    if what == "job":
        from urlguard.jobs import dispatch
        assert dispatch.begin(pk, "revert") is not None
    elif what == "claim":
        from urlguard.feeds import refresh
        assert refresh._claim(Source.objects.get(pk=pk), str(ownership.me())) == ""
    else:
        from urlguard.writepath import changes
        writing = changes.change_set(kind=ChangeSet.Kind.IMPORT)
        writing.__enter__()
    assert ownership.beat(str(ownership.me()).partition(" task ")[0])
    print(timezone.now().isoformat(), flush=True)
    sys.stdin.read()
""")


@pytest.fixture
def node(tmp_path, settings):
    """start(what, skew): a node process, its clock `skew` seconds off, that took `what`;
    returns (the process, the row's primary key)."""
    if not FAKETIME.exists():
        unavailable(f"needs libfaketime ({FAKETIME}): apt-get install libfaketime")
    settings.URLGUARD = {**settings.URLGUARD, "HEARTBEAT_TIMEOUT": TIMEOUT}
    script = tmp_path / "node.py"
    script.write_text(NODE)
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"
    processes: list[subprocess.Popen] = []

    def start(what: str, skew: int) -> tuple[subprocess.Popen, int]:
        if what == "job":
            pk = AdminJob.objects.create(kind="revert", state="queued").pk
        elif what == "claim":
            pk = Source.objects.create(name="skewed", kind="feed", url="file:///nowhere").pk
        else:
            pk = 0
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.support.services_settings",
            "DATABASE_URL": url,  # the test database
            "PYTHONPATH": str(ROOT),
            "PYTHONDONTWRITEBYTECODE": "1",
            "INTERVAL": str(INTERVAL),
            "LD_PRELOAD": str(FAKETIME),
            "FAKETIME": f"{skew:+d}",
            # The wall clock only: timed waits on a faked monotonic clock never end.
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }
        process = subprocess.Popen(
            [sys.executable, str(script), what, str(pk)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        processes.append(process)
        line = process.stdout.readline()  # type: ignore[union-attr]
        assert line, f"the node did not take its {what}"
        own = datetime.fromisoformat(line.strip()) - ownership.database_now()
        assert abs(own.total_seconds() - skew) < 60, f"the node's clock is {own} off, not {skew} s"
        return process, pk

    yield start
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
        process.stdout.close()  # type: ignore[union-attr]
        process.stdin.close()  # type: ignore[union-attr]


def _taken_over(what: str, pk: int) -> bool:
    """Whether this host (the database's clock, its own right) takes the work over."""
    if what == "job":
        return ownership.recover_orphans()["jobs"] == 1
    if what == "claim":
        return refresh._claim(Source.objects.get(pk=pk), str(ownership.me())) == ""
    return changes.interrupted(kind=ChangeSet.Kind.IMPORT) is not None


def _heartbeat(what: str, pk: int) -> datetime:
    if what == "job":
        return AdminJob.objects.get(pk=pk).heartbeat  # type: ignore[return-value]
    if what == "claim":
        return Source.objects.get(pk=pk).refresh_heartbeat  # type: ignore[return-value]
    return ChangeSet.objects.get(finished__isnull=True).heartbeat  # type: ignore[return-value]


@pytest.mark.parametrize("what", ["job", "claim", "change_set"])
def test_the_work_of_a_node_ahead_killed_mid_way_is_taken_over_after_the_timeout(node, what):
    process, pk = node(what, +HOUR)
    process.kill()
    process.wait(timeout=30)
    last = _heartbeat(what, pk)
    assert not _taken_over(what, pk)
    deadline = time.monotonic() + 60
    while not _taken_over(what, pk):
        assert time.monotonic() < deadline, f"the dead node's {what} was not taken over"
        time.sleep(0.1)
    # Taken over once its heartbeat was TIMEOUT old on the database's clock.
    age = ownership.database_now() - last
    assert timedelta(seconds=TIMEOUT) < age < timedelta(seconds=TIMEOUT + 30)


@pytest.mark.parametrize(
    "what",
    [
        "job",
        "claim",
        "change_set",
    ],
)
def test_the_live_work_of_a_node_behind_is_not_taken_over(node, what):
    process, pk = node(what, -HOUR)
    until = time.monotonic() + 2 * TIMEOUT
    while time.monotonic() < until:
        assert not _taken_over(what, pk), f"the live node's {what} was taken over"
        time.sleep(0.2)
    assert process.poll() is None
