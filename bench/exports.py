"""Benchmark: serving the list to other enforcement points, on PostgreSQL.

Creates its own database (urlguard_bench_exports, dropped and re-created), loads
--rules rules with COPY (not measured), then prints:
  - render time and size of each /lists/ export (one render per position);
  - the ABP differential patch and the RPZ IXFR for a 1% churn (size, time) beside
    the whole list / AXFR they spare;
  - URIBL queries per second answered by serve_dns to a bounded dnspython client
    (--clients threads, each one query in flight);
  - add_rule -> NXDOMAIN at an Unbound secondary (NOTIFY + IXFR), if unbound is installed;
  - the first poller's latency after a change, per export: rendered in its request (as
    before the pre-render, and still on a node that keeps no render) beside served while
    the node's pre-render runs and after it (--first-poller-only: this section alone).

    .venv/bin/python bench/exports.py [--rules 1000000] [--seconds 5] [--clients 4]
                                      [--pg postgres://postgres@127.0.0.1:5432]
                                      [--first-poller-only]
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import ipaddress
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CATEGORIES = ("phishing", "malware", "spam", "unwanted", "other")


def expression(i: int) -> str:
    kind = i % 10
    if kind < 7:
        return f"spam{i}.example{i % 97}.com/"
    if kind < 9:
        return f"host{i % 5000}.bad{i % 13}.net/path{i}/"
    return f"www.shop{i % 701}.org/offer/{i}.html"


def seed(connection, n: int) -> None:
    base = 1_700_000_000_000_000
    started = time.perf_counter()
    with connection.cursor() as cursor:
        raw = cursor.connection
        with raw.cursor() as cur:
            for table, line in (
                (
                    "urlguard_spamrule (expression, category, added_at, source, note, created,"
                    " updated)",
                    "{e}\t{c}\t{t}\tbench\t\t2026-01-01\t2026-01-01\n",
                ),
                (
                    "urlguard_changeevent (action, expression, added_at, category, source,"
                    " created, note)",
                    "add\t{e}\t{t}\t{c}\tbench\t2026-01-01\t\n",
                ),
            ):
                with cur.copy(f"COPY {table} FROM STDIN") as copy:
                    buf = io.StringIO()
                    for i in range(n):
                        buf.write(line.format(e=expression(i), c=CATEGORIES[i % 5], t=base + i))
                        if buf.tell() > 8 << 20:
                            copy.write(buf.getvalue())
                            buf = io.StringIO()
                    copy.write(buf.getvalue())
        raw.commit()
        cursor.execute("ANALYZE urlguard_spamrule")
        cursor.execute("ANALYZE urlguard_changeevent")
    print(f"seeded {n:,} rules with COPY in {time.perf_counter() - started:.1f} s", file=sys.stderr)


def mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rules", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--db", default="urlguard_bench_exports")
    parser.add_argument("--first-poller-only", action="store_true")
    args = parser.parse_args()

    import psycopg

    with psycopg.connect(f"{args.pg}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{args.db}"')
    var = Path(tempfile.mkdtemp(prefix="urlguard-bench-exports-"))
    os.environ.update(
        DATABASE_URL=f"{args.pg}/{args.db}",
        URLGUARD_VAR_DIR=str(var),
        DJANGO_SETTINGS_MODULE="urlguard_service.settings",
        DJANGO_SECRET_KEY="bench-" + "x" * 60,
    )
    os.environ.pop("CELERY_BROKER_URL", None)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    try:
        seed(connection, args.rules)
        if not args.first_poller_only:
            run(args, var)
        first_poller(args.rules)
    finally:
        connection.close()
        with psycopg.connect(f"{args.pg}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')
        shutil.rmtree(var, ignore_errors=True)


def run(args: argparse.Namespace, var: Path) -> None:
    import dns.message

    from urlguard.conf import conf
    from urlguard.exports import rcs
    from urlguard.exports.catalog import EXPORTS
    from urlguard.exports.dnsserver import DnsConfig, DnsServer
    from urlguard.exports.render import export_dir, render
    from urlguard.models import ChangeEvent, SpamRule
    from urlguard.nodesync import sync
    from urlguard.writepath.changes import add_rule, add_rules, remove_rules

    n = args.rules
    print(f"\n## Exports of {n:,} rules (PostgreSQL, one render per position)\n")
    print("| export | render | size | lines in file |")
    print("| --- | ---: | ---: | ---: |")
    first: dict[str, Path] = {}
    for name, made in EXPORTS.items():
        directory = export_dir(name)
        directory.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        result = render(made(), directory)
        took = time.perf_counter() - started
        first[name] = result.path
        with result.path.open("rb") as f:
            lines = sum(1 for _ in f)
        size = result.path.stat().st_size
        print(f"| {name} | {took:.1f} s | {mb(size)} | {lines:,} |")

    sync.rebuild(conf.FILTER_PATH)
    server = DnsServer(
        DnsConfig(
            rpz_zone="rpz.urlguard.",
            uribl_zone="uribl.urlguard.",
            transfer_networks=(ipaddress.ip_network("127.0.0.0/8"),),
            rate_limit=10**9,
        )
    )
    port = server.start("127.0.0.1", 0)[1]
    try:
        axfr_seconds, axfr_bytes, axfr_records = produce(server, "AXFR")
        print(
            f"\nAXFR of the RPZ zone: {axfr_records:,} records, {mb(axfr_bytes)}, "
            f"{axfr_seconds:.1f} s"
        )

        old_seq = ChangeEvent.objects.head()
        churn = max(1, n // 100)
        started = time.perf_counter()
        victims = list(
            SpamRule.objects.filter(added_at__lt=1_700_000_000_000_000 + churn).values_list(
                "pk", flat=True
            )
        )
        remove_rules(victims, source="bench")
        add_rules([f"churn{i}.example.com/" for i in range(churn)], source="bench", category="spam")
        print(
            f"1% churn: {churn:,} removed + {churn:,} added in "
            f"{time.perf_counter() - started:.1f} s"
        )
        ixfr_seconds, ixfr_bytes, ixfr_records = produce(server, "IXFR", serial=old_seq)
        print(
            f"IXFR for it: {ixfr_records:,} records, {mb(ixfr_bytes)}, {ixfr_seconds:.2f} s "
            f"({axfr_bytes / max(ixfr_bytes, 1):,.0f}x smaller than the AXFR)"
        )
        directory = export_dir("abp.txt")
        started = time.perf_counter()
        fresh = render(EXPORTS["abp.txt"](), directory)
        render_s = time.perf_counter() - started
        started = time.perf_counter()
        patch = b"".join(rcs.diff(first["abp.txt"], fresh.path))
        print(
            f"ABP patch for it: {mb(len(patch))} in {time.perf_counter() - started:.1f} s "
            f"(re-render {render_s:.1f} s) vs the whole list {mb(fresh.path.stat().st_size)}"
        )

        qps = uribl_rate(port, args.seconds, args.clients, n)
        print(
            f"\nURIBL: {qps:,.0f} queries/s ({args.clients} clients, one query in flight each, "
            f"half listed, {args.seconds:.0f} s)"
        )
        # A domain rule the churn left listed.
        k = (n // 100 + 10) // 10 * 10
        listed = f"spam{k}.example{k % 97}.com"
        for label, name in (("listed", listed), ("not listed", "clean7.example")):
            wire = dns.message.make_query(f"{name}.uribl.urlguard.", "A").to_wire()
            started = time.perf_counter()
            for _ in range(500):
                list(server.answer(wire, "127.0.0.1", tcp=False))
            each = (time.perf_counter() - started) / 500
            print(f"URIBL answer, {label}: {each * 1e6:,.0f} us in the server")
        # The secondary holds the zone once that rule's name is NXDOMAIN there.
        latency = notify_to_secondary(port, server, var, add_rule, listed + ".")
        if latency is None:
            print("add_rule -> NXDOMAIN at an Unbound secondary: not within 60 s")
        else:
            print(f"add_rule -> NXDOMAIN at an Unbound secondary (NOTIFY + IXFR): {latency:.2f} s")
    finally:
        server.stop()


def first_poller(n: int) -> None:
    """GET /lists/<name> right after a change: rendered in the request (every first
    poller's lot before the pre-render; still so for an export left out of
    EXPORTS_PRERENDER) beside the poll during the pre-render (served the newest render
    kept) and after it."""
    from django.conf import settings
    from django.test import Client

    from urlguard.exports import prerender
    from urlguard.exports.catalog import EXPORTS
    from urlguard.feeds import runner
    from urlguard.models import ChangeEvent
    from urlguard.nodesync import embedded, sync
    from urlguard.writepath.changes import add_rule

    # A request starts the embedded default's upkeep and feed threads: not measured.
    embedded.stop()
    runner.stop()
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    settings.URLGUARD = {**getattr(settings, "URLGUARD", {}), "EXPORTS_OPEN": True}
    client = Client()

    def poll(name: str) -> tuple[float, str]:
        started = time.perf_counter()
        response = client.get(f"/lists/{name}")
        for _ in response.streaming_content:
            pass
        return time.perf_counter() - started, response["X-URLGuard-Position"]

    print(f"\n## First poller after a change, {n:,} rules\n")
    sync.sync_and_report(periodic=True)  # the node's first catch-up renders them all
    assert prerender.wait(3600)
    # As before the pre-render: no export rendered ahead, so the first poll of a new
    # position renders it in its request.
    urlguard_settings = settings.URLGUARD
    settings.URLGUARD = {**urlguard_settings, "EXPORTS_PRERENDER": []}
    old = {}
    try:
        for i, name in enumerate(EXPORTS):
            add_rule(f"first-poller-{i}.example/", category="spam", source="bench")
            old[name] = poll(name)[0]
    finally:
        settings.URLGUARD = urlguard_settings
    started = time.perf_counter()
    # Committed, then applied by its nudge in-process (the embedded default), which
    # asks for the pre-render: a worker's apply task does the same.
    add_rule("first-poller-new.example/", category="spam", source="bench")
    head = str(ChangeEvent.objects.head())
    during = {name: poll(name) for name in EXPORTS}
    assert prerender.wait(3600)
    prerendered = time.perf_counter() - started
    after = {name: poll(name) for name in EXPORTS}
    print("| export | rendered in the request | during the pre-render | after it | ratio |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name in EXPORTS:
        (d, d_pos), (a, a_pos) = during[name], after[name]
        assert a_pos == head, (name, a_pos, head)
        which = "new" if d_pos == head else "previous"
        print(
            f"| {name} | {old[name] * 1e3:,.0f} ms | {d * 1e3:,.1f} ms ({which} position) "
            f"| {a * 1e3:,.1f} ms | {old[name] / max(d, a):,.0f}x |"
        )
    print(
        f"\nthe pre-render of all {len(EXPORTS)} exports was done {prerendered:.1f} s "
        "after add_rule returned"
    )


def produce(server, kind: str, serial: int | None = None) -> tuple[float, int, int]:  # type: ignore[no-untyped-def]
    """The server's work for one transfer (the messages it would send over TCP):
    seconds, bytes, records. A client's parsing is not counted."""
    import struct

    import dns.message
    import dns.rrset

    zone = "rpz.urlguard."
    query = dns.message.make_query(zone, kind)
    if serial is not None:
        query.authority.append(dns.rrset.from_text(zone, 0, "IN", "SOA", f". . {serial} 0 0 0 0"))
    started = time.perf_counter()
    total = records = 0
    for message in server.answer(query.to_wire(), "127.0.0.1", tcp=True):
        total += len(message) + 2
        records += struct.unpack("!H", message[6:8])[0]
    return time.perf_counter() - started, total, records


def _uribl_client(port: int, seconds: float, k: int, n: int, out) -> None:  # type: ignore[no-untyped-def]
    import dns.message
    import dns.query

    rng = random.Random(k)
    stop = time.monotonic() + seconds
    answered = 0
    while time.monotonic() < stop:
        i = rng.randrange(n)
        listed = i - i % 10  # a domain rule
        name = f"spam{listed}.example{listed % 97}.com" if i % 2 else f"clean{i}.example"
        query = dns.message.make_query(f"{name}.uribl.urlguard.", "A")
        try:
            dns.query.udp(query, "127.0.0.1", port=port, timeout=2)
            answered += 1
        except Exception:
            pass  # unanswered (dropped or timed out): not counted
    out.put(answered)


def uribl_rate(port: int, seconds: float, clients: int, n: int) -> float:
    """Answers per second to `clients` client processes (not threads: the server's
    own GIL is what is measured), each with one query in flight."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    out = context.Queue()
    procs = [
        context.Process(target=_uribl_client, args=(port, seconds, k, n, out))
        for k in range(clients)
    ]
    for p in procs:
        p.start()
    total = sum(out.get() for _ in procs)
    for p in procs:
        p.join()
    return total / seconds


def notify_to_secondary(port: int, server, var: Path, add_rule, listed: str) -> float | None:
    if not Path(shutil.which("unbound") or "/usr/sbin/unbound").exists():
        print("(unbound not installed: no secondary latency)")
        return None
    import dns.message
    import dns.query
    import dns.rcode

    from tests.support.unbound import free_port, start_unbound

    uport = free_port()
    server.config = dataclasses.replace(server.config, notify=(("127.0.0.1", uport),))
    process = start_unbound(
        var, port=uport, primary=port, zone="rpz.urlguard.", names={"late": "192.0.2.1"}
    )

    def rcode(name: str = "late.example.") -> int | None:
        try:
            return dns.query.udp(
                dns.message.make_query(name, "A"), "127.0.0.1", port=uport, timeout=1
            ).rcode()
        except Exception:
            return None

    try:
        deadline = time.monotonic() + 900
        started = time.perf_counter()
        while rcode(listed) != dns.rcode.NXDOMAIN and time.monotonic() < deadline:
            time.sleep(0.5)  # the first AXFR of the whole zone
        print(f"Unbound's first AXFR of the zone, loaded: {time.perf_counter() - started:.0f} s")
        assert rcode() == dns.rcode.NOERROR
        started = time.perf_counter()
        add_rule("late.example/", category="phishing", source="bench")
        while rcode() != dns.rcode.NXDOMAIN:
            if time.perf_counter() - started > 60:
                return None
            time.sleep(0.05)
        return time.perf_counter() - started
    finally:
        process.terminate()
        process.wait(10)


if __name__ == "__main__":
    main()
