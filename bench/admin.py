"""Benchmarks of the admin's two heavy paths, on the embedded default (SQLite, Celery
in-process), in a throw-away var dir:

1. Import of N rules (default 100,000) through the admin: upload + dry-run preview,
   then commit (changes.add_rules in chunks, each applied to the filter file) and the
   rescan that follows, all through Django's test client. Target: < 60 s end to end.
2. Rescan of M short links (default 1,000,000) against those rules with
   urlguard.rescan.rescan_links (filter first, table only for hits). Target: < 60 s.
   Beside it, measured in the same run on a sample: the naive rescan (one table query
   per link with its expressions) and an in-memory set of every rule (the memory-hungry
   upper bound a single process could reach).

    .venv/bin/python bench/admin.py [--rules 100000] [--links 1000000]
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def setup_django(var: Path) -> None:
    os.environ["URLGUARD_VAR_DIR"] = str(var)
    os.environ["DJANGO_DEBUG"] = "0"  # DEBUG keeps every query in memory
    os.environ.pop("DATABASE_URL", None)
    os.environ.pop("CELERY_BROKER_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "urlguard.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _cpu() -> float:
    """CPU seconds of this process and of its finished children (the rescan pool)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def rule_lines(n: int, rng: random.Random) -> list[str]:
    """A feed as people paste it: URLs, bare hosts, hosts-file lines and paths."""
    lines = []
    for i in range(n):
        host = f"spam{i}-{rng.randrange(10**6)}.example{i % 97}.com"
        kind = i % 4
        if kind == 0:
            lines.append(f"https://{host}/")
        elif kind == 1:
            lines.append(host)
        elif kind == 2:
            lines.append(f"0.0.0.0 {host}")
        else:
            lines.append(f"http://{host}/promo/")
    return lines


def bench_import(n: int, rng: random.Random) -> tuple[dict, list[str]]:
    from django.contrib.auth import get_user_model
    from django.core.files.uploadedfile import SimpleUploadedFile
    from django.test import Client
    from django.urls import reverse

    from urlguard import sync
    from urlguard.models import AdminJob, SpamRule

    sync.rebuild()  # the node's filter file, empty, as `make run` leaves it
    user = get_user_model().objects.create_superuser("bench", "b@example.com", "pw")
    client = Client()
    client.force_login(user)
    lines = rule_lines(n, rng)
    body = ("\n".join(lines) + "\n").encode()

    t0 = time.perf_counter()
    response = client.post(
        reverse("admin:urlguard_spamrule_import"),
        {"file": SimpleUploadedFile("feed.txt", body), "default_category": "spam"},
    )
    assert response.status_code == 302, response.content[:500]
    job = AdminJob.objects.get(kind="import")
    t1 = time.perf_counter()
    page = client.get(response["Location"])
    assert page.status_code == 200
    t2 = time.perf_counter()
    response = client.post(reverse("admin:urlguard_spamrule_import_commit", args=[job.pk]))
    assert response.status_code == 302
    t3 = time.perf_counter()
    job.refresh_from_db()
    assert job.state == "done", job.message
    rescan = AdminJob.objects.get(pk=job.result["rescan_job"])
    rules = SpamRule.objects.count()
    assert rules == n, (rules, n)
    return {
        "preview": t1 - t0,
        "preview_page": t2 - t1,
        "commit": t3 - t2,
        "total": t3 - t0,
        "import_only": job.result["import_seconds"],
        "rescan": rescan.result["seconds"],
        "rules": rules,
        "bytes": len(body),
    }, lines


def make_links(m: int, spam_hosts: list[str], rng: random.Random) -> int:
    """M short links, about 1% of them to a listed host (a subdomain or a deeper
    page, so the roll-up matters); the rest to clean hosts. Inserted with one
    executemany per batch: the setup is not what is measured."""
    from django.db import connection, transaction
    from django.utils import timezone

    from urlguard.models import ShortLink

    table = ShortLink._meta.db_table
    sql = (
        f"INSERT INTO {table} (slug, destination, created, disabled, disabled_reason, "
        "click_count, unique_visitors) VALUES (%s, %s, %s, %s, '', 0, 0)"
    )
    now = timezone.now()
    batch = 50_000
    spam = 0
    with transaction.atomic(), connection.cursor() as cursor:
        for start in range(0, m, batch):
            rows = []
            for i in range(start, min(start + batch, m)):
                if rng.random() < 0.01:
                    destination = f"https://www.{rng.choice(spam_hosts)}/p/{i}"
                    spam += 1
                else:
                    destination = (
                        f"https://site{rng.randrange(10**7)}.example.org/a/b/{i}.html?ref={i % 13}"
                    )
                rows.append((f"l{i}", destination, now, False))
            cursor.executemany(sql, rows)
    return spam


def bench_rescan(m: int, lines: list[str], rng: random.Random) -> dict:
    from urlguard.canonical import canonicalize, expressions
    from urlguard.guard import reset_guard
    from urlguard.models import ShortLink, SpamRule
    from urlguard.rescan import rescan_links

    spam_hosts = [
        line.split()[-1].split("://")[-1].split("/")[0] for line in lines if "/promo/" not in line
    ][:5000]
    t0 = time.perf_counter()
    expected = make_links(m, spam_hosts, rng)
    made = time.perf_counter() - t0
    reset_guard()
    t1 = time.perf_counter()
    cpu0 = _cpu()
    result = rescan_links()
    ours = time.perf_counter() - t1
    ours_cpu = _cpu() - cpu0
    assert len(result.hits) == expected, (len(result.hits), expected)

    # Peers on a sample of the same links, extrapolated to M.
    sample = list(ShortLink.objects.order_by("pk").values_list("destination", flat=True)[:20_000])
    t2 = time.perf_counter()
    naive_hits = 0
    for url in sample:
        if SpamRule.objects.filter(expression__in=expressions(canonicalize(url))).exists():
            naive_hits += 1
    naive = (time.perf_counter() - t2) * m / len(sample)

    t3 = time.perf_counter()
    listed = set(SpamRule.objects.values_list("expression", flat=True).iterator(chunk_size=20_000))
    load = time.perf_counter() - t3
    t4 = time.perf_counter()
    set_hits = sum(1 for url in sample if not listed.isdisjoint(expressions(canonicalize(url))))
    in_memory = load + (time.perf_counter() - t4) * m / len(sample)
    assert set_hits == naive_hits
    return {
        "links": m,
        "make": made,
        "ours": ours,
        "ours_cpu": ours_cpu,
        "processes": result.processes,
        "hits": len(result.hits),
        "naive": naive,
        "in_memory": in_memory,
        "sample": len(sample),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rules", type=int, default=100_000)
    parser.add_argument("--links", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="urlguard-bench-") as tmp:
        setup_django(Path(tmp))
        imp, lines = bench_import(args.rules, rng)
        scan = bench_rescan(args.links, lines, rng)

    print(
        f"\nAdmin import: {imp['rules']:,} rules ({imp['bytes'] / 2**20:.1f} MiB file), "
        "SQLite, Celery in-process, via the test client"
    )
    print("| step | seconds |")
    print("|---|---:|")
    print(f"| upload + dry-run preview | {imp['preview']:.2f} |")
    print(f"| preview page render | {imp['preview_page']:.2f} |")
    print(f"| commit request (add_rules + filter apply + rescan) | {imp['commit']:.2f} |")
    print(f"|   of which add_rules + filter apply | {imp['import_only']:.2f} |")
    print(f"|   of which rescan of the (empty) link table | {imp['rescan']:.2f} |")
    print(f"| **end to end** (target < 60) | **{imp['total']:.2f}** |")
    print(
        f"\nRescan: {scan['links']:,} short links against {imp['rules']:,} rules "
        f"({scan['hits']:,} point to spam); peers measured on {scan['sample']:,} of the "
        "same links and extrapolated"
    )
    print("| method | seconds for all links |")
    print("|---|---:|")
    print(
        f"| **urlguard.rescan (filter, table for hits), {scan['processes']} process(es)** "
        f"(target < 60) | **{scan['ours']:.2f}** wall, {scan['ours_cpu']:.2f} CPU |"
    )
    print(f"| naive: one table query per link, 1 process | {scan['naive']:.2f} |")
    print(f"| every rule in a Python set (load + lookups), 1 process | {scan['in_memory']:.2f} |")
    print(
        f"(creating the {scan['links']:,} links took {scan['make']:.1f} s, not counted; "
        f"load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)"
    )


if __name__ == "__main__":
    main()
