"""Benchmark: the Safe Browsing v4 Update API at a million rules, on PostgreSQL.

Creates its own database (urlguard_bench_safebrowsing, dropped and re-created), loads
--rules rules with COPY (bench/exports.py's seed, not measured), prepares the lists as
the pre-render does, then prints, each request through Django's test client (the
whole middleware stack, in this process):
  - a full update of the three lists, RICE, protobuf (Firefox's request): its time
    and the bytes a prefix;
  - a partial update after a 1% churn (rules removed and added), from the previous
    position's state;
  - fullHashes:find of one listed prefix beside GET /api/check?url= (median, p90).

Targets: full update <= 1 s and <= 2.5 bytes a prefix; partial <= 100 ms; find <= 2 ms
median.

    .venv/bin/python bench/safebrowsing.py [--rules 1000000] [--runs 7] [--checks 300]
                                           [--pg postgres://postgres@127.0.0.1:5432]
"""

from __future__ import annotations

import argparse
import base64
import cProfile
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.exports import expression, seed  # noqa: E402

THREAT_TYPES = (5, 1, 3)  # Firefox's phishing, malware, unwanted


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms"


def fetch_request(states: dict[int, bytes]) -> str:
    from urlguard.safebrowsing import wire

    message = wire.message("FetchThreatListUpdatesRequest")
    message.client.client_id = "navclient-auto-ffox"
    for threat_type in THREAT_TYPES:
        one = message.list_update_requests.add(
            threat_type=threat_type,
            platform_type=2,
            threat_entry_type=1,
            state=states.get(threat_type, b""),
        )
        one.constraints.supported_compressions.append(2)
    return base64.urlsafe_b64encode(message.SerializeToString()).decode()


def timed_get(client, path: str, params: dict[str, str]) -> tuple[float, object]:
    started = time.perf_counter()
    response = client.get(path, params, HTTP_X_HTTP_METHOD_OVERRIDE="POST")
    took = time.perf_counter() - started
    assert response.status_code == 200, response.content[:300]
    return took, response


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rules", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--checks", type=int, default=300)
    parser.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--db", default="urlguard_bench_safebrowsing")
    parser.add_argument("--profile-find", metavar="FILE", help="cProfile the finds into FILE")
    args = parser.parse_args()

    import psycopg

    with psycopg.connect(f"{args.pg}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{args.db}"')
    var = Path(tempfile.mkdtemp(prefix="urlguard-bench-safebrowsing-"))
    os.environ.update(
        DATABASE_URL=f"{args.pg}/{args.db}",
        URLGUARD_VAR_DIR=str(var),
        DJANGO_SETTINGS_MODULE="urlguard_service.settings",
        DJANGO_SECRET_KEY="bench-" + "x" * 60,
        DJANGO_ALLOWED_HOSTS="testserver,localhost",
    )
    os.environ.pop("CELERY_BROKER_URL", None)
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    settings.RATELIMIT_ENABLE = False  # the figures are of the work, not of the limits
    call_command("migrate", verbosity=0)
    try:
        seed(connection, args.rules)
        run(args)
    finally:
        connection.close()
        with psycopg.connect(f"{args.pg}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')
        shutil.rmtree(var, ignore_errors=True)


def run(args: argparse.Namespace) -> None:
    from django.test import Client

    from urlguard.conf import conf
    from urlguard.exports import prerender
    from urlguard.models import SpamRule
    from urlguard.nodesync import sync
    from urlguard.operations import apikeys
    from urlguard.runtime import stats
    from urlguard.safebrowsing import prepared, wire
    from urlguard.writepath.changes import add_rules, remove_rules

    # The pre-render's work happens here, in the open; requests never wait for it.
    prerender.request = lambda: None
    n = args.rules
    key = apikeys.create_api_key("bench")[1]
    client = Client()
    api = "/safebrowsing/v4"
    update_params = {"$ct": "application/x-protobuf", "key": key, "$httpMethod": "POST"}

    started = time.perf_counter()
    lists = prepared.prepare_full_updates()
    print(f"\n## Safe Browsing v4 at {n:,} rules (PostgreSQL)\n")
    prefixes = sum(len(v) for v in lists.prefixes.values())
    print(
        f"prepared off the request path (read, hash, sort, RICE-code): "
        f"{time.perf_counter() - started:.1f} s, {prefixes:,} prefixes in three lists"
    )

    times = []
    for _ in range(args.runs):
        took, response = timed_get(
            client, f"{api}/threatListUpdates:fetch", {**update_params, "$req": fetch_request({})}
        )
        times.append(took)
    body = response.content  # type: ignore[attr-defined]
    answer = wire.parse("FetchThreatListUpdatesResponse", body)
    data = sum(
        len(a.rice_hashes.encoded_data) for u in answer.list_update_responses for a in u.additions
    )
    print(
        f"full update, RICE, protobuf: first {ms(times[0])}, median {ms(statistics.median(times))}"
        f" (target <= 1 s); {len(body):,} bytes, {data / prefixes:.2f} bytes a prefix"
        " (target <= 2.5)"
    )
    states = {u.threat_type: u.new_client_state for u in answer.list_update_responses}

    churn = max(1, n // 100)
    started = time.perf_counter()
    victims = list(
        SpamRule.objects.filter(added_at__lt=1_700_000_000_000_000 + churn).values_list(
            "pk", flat=True
        )
    )
    remove_rules(victims, source="bench")
    categories = ("phishing", "malware", "spam")
    for i, category in enumerate(categories):
        add_rules(
            [f"churn{j}.example.com/" for j in range(i, churn, len(categories))],
            source="bench",
            category=category,
        )
    print(
        f"1% churn written: {churn:,} removed + {churn:,} added in "
        f"{time.perf_counter() - started:.1f} s"
    )
    started = time.perf_counter()
    prepared.prepare_full_updates()
    print(f"new position prepared off the request path: {time.perf_counter() - started:.1f} s")
    times = []
    for _ in range(args.runs):
        took, response = timed_get(
            client,
            f"{api}/threatListUpdates:fetch",
            {**update_params, "$req": fetch_request(states)},
        )
        times.append(took)
    partial = wire.parse("FetchThreatListUpdatesResponse", response.content)  # type: ignore[attr-defined]
    kinds = {u.response_type for u in partial.list_update_responses}
    assert kinds == {1}, f"expected partial updates, got {kinds}"
    print(
        f"partial update after it (RICE): first {ms(times[0])}, median "
        f"{ms(statistics.median(times))} (target <= 100 ms); {len(response.content):,} bytes"  # type: ignore[attr-defined]
    )

    sync.rebuild(conf.FILTER_PATH)
    listed = [expression(i) for i in range(churn, churn + args.checks)]
    find_times, check_times = [], []
    profile = cProfile.Profile() if args.profile_find else None
    for i, rule in enumerate(listed):
        message = wire.message("FindFullHashesRequest")
        message.client.client_id = "navclient-auto-ffox"
        message.threat_info.threat_types.extend([5, 1, 3])
        message.threat_info.platform_types.append(2)
        message.threat_info.threat_entry_types.append(1)
        message.threat_info.threat_entries.add(hash=hashlib.sha256(rule.encode()).digest()[:4])
        if profile is not None:
            profile.enable()
        took, response = timed_get(
            client,
            f"{api}/fullHashes:find",
            {
                **update_params,
                "$req": base64.urlsafe_b64encode(message.SerializeToString()).decode(),
            },
        )
        assert wire.parse("FindFullHashesResponse", response.content).matches  # type: ignore[attr-defined]
        if profile is not None:
            profile.disable()
        find_times.append(took)
        url = f"http://{rule}" if i % 2 else f"http://clean{i}.example.org/"
        took, _ = timed_get(client, "/api/check", {"url": url})
        check_times.append(took)

    def spread(values: list[float]) -> str:
        values = sorted(values)
        return f"median {ms(statistics.median(values))}, p90 {ms(values[int(len(values) * 0.9)])}"

    print(f"fullHashes:find of a listed prefix: {spread(find_times)} (target <= 2 ms median)")
    print(f"GET /api/check?url= beside it (half listed): {spread(check_times)}")
    stats.flush()  # the hit log's events, before the database goes
    if profile is not None:
        profile.dump_stats(args.profile_find)


if __name__ == "__main__":
    main()
