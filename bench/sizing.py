"""Sizing: disk and memory per million rules and per million short links, measured on
PostgreSQL through the real write paths, for README "Running in production".

Creates its own database (urlguard_bench_sizing, dropped and re-created) and var
directory. Rules are listed by `manage.py import_rules` (spam table, provenance,
change log, change set, and the filter file followed in-process), then the file is
rebuilt by `manage.py rebuild_filter` as a worker does at a pod's first start. Short
links are created with the ORM in batches (the admin's and the API's model), then the
link index that the impact previews read is built. Clicks: one raw row per (link,
visitor, hour), sized per million rows. Figures are measured at --rules/--links/
--clicks and scaled linearly to a million (tables and files grow linearly; the
filter by its capacity, which a rebuild sets to rules x REBUILD_HEADROOM).

    .venv/bin/python bench/sizing.py [--rules 200000] [--links 200000] [--clicks 200000]
                                     [--pg postgres://postgres@127.0.0.1:5432]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MILLION = 1_000_000


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


# Runs manage.py in a child that reports its own peak RSS (RUSAGE_CHILDREN would give
# the largest of every child so far).
_PEAK = (
    "import resource, runpy, sys\n"
    "sys.argv = ['manage.py', *sys.argv[1:]]\n"
    "try:\n"
    "    runpy.run_path('manage.py', run_name='__main__')\n"
    "finally:\n"
    "    print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
)


def manage(env: dict[str, str], *args: str) -> tuple[float, int]:
    """Runs a manage.py command; returns (seconds, peak RSS in bytes of that process)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _PEAK, *args], cwd=ROOT, env=env, check=True,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    seconds = time.perf_counter() - started
    peak = [line for line in done.stderr.splitlines() if line.startswith("PEAK ")][-1]
    return seconds, int(peak.split()[1]) * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rules", type=int, default=200_000)
    parser.add_argument("--links", type=int, default=200_000)
    parser.add_argument("--clicks", type=int, default=200_000)
    parser.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--db", default="urlguard_bench_sizing")
    args = parser.parse_args()

    import psycopg

    with psycopg.connect(f"{args.pg}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{args.db}"')
    var = Path(tempfile.mkdtemp(prefix="urlguard-bench-sizing-"))
    env = {
        **{k: v for k, v in os.environ.items() if k != "CELERY_BROKER_URL"},
        "DATABASE_URL": f"{args.pg}/{args.db}",
        "URLGUARD_VAR_DIR": str(var),
        "DJANGO_SETTINGS_MODULE": "urlguard_service.settings",
        "DJANGO_SECRET_KEY": "bench-" + "x" * 60,
        "PROMETHEUS_MULTIPROC_DIR": str(var / "metrics"),
    }
    os.environ.update({k: env[k] for k in ("DATABASE_URL", "URLGUARD_VAR_DIR",
                                           "DJANGO_SETTINGS_MODULE", "DJANGO_SECRET_KEY",
                                           "PROMETHEUS_MULTIPROC_DIR")})  # fmt: skip
    os.environ.pop("CELERY_BROKER_URL", None)
    manage(env, "migrate", "--noinput")
    _, baseline_rss = manage(env, "check")

    import django

    django.setup()
    from django.db import connection

    from urlguard.models import Click, ShortLink
    from urlguard.writepath.impact import build_link_index

    def table_bytes(*tables: str) -> int:
        with connection.cursor() as cursor:
            total = 0
            for table in tables:
                cursor.execute("VACUUM ANALYZE " + table)
                cursor.execute("SELECT pg_total_relation_size(%s)", [table])
                total += cursor.fetchone()[0]
            return total

    def dir_bytes(path: Path) -> int:
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())

    rows = []
    # Rules: one domain, path or page per line, as feeds and imports list them.
    rules_file = var / "rules.txt"
    with rules_file.open("w") as out:
        for i in range(args.rules):
            kind = i % 10
            if kind < 7:
                out.write(f"spam{i}.example{i % 97}.com\n")
            elif kind < 9:
                out.write(f"http://host{i % 5000}.bad{i % 13}.net/path{i}/\n")
            else:
                out.write(f"http://www.shop{i % 701}.org/offer/{i}.html\n")
    rule_tables = ("urlguard_spamrule", "urlguard_rulesource", "urlguard_changeevent",
                   "urlguard_changeset")  # fmt: skip
    before = table_bytes(*rule_tables)
    import_s, import_rss = manage(env, "import_rules", str(rules_file))
    db_rules = table_bytes(*rule_tables) - before
    rebuild_s, rebuild_rss = manage(env, "rebuild_filter")
    filter_bytes = (var / "filter.bin").stat().st_size
    scale = MILLION / args.rules
    rows += [
        ("rules: PostgreSQL (rules, provenance, change log)", db_rules * scale),
        ("rules: filter file (each node; mapped by every process)", filter_bytes * scale),
    ]
    print(f"import_rules of {args.rules:,}: {import_s:.1f} s, peak RSS {mib(import_rss)}",
          file=sys.stderr)  # fmt: skip
    print(f"rebuild_filter of {args.rules:,}: {rebuild_s:.1f} s, peak RSS {mib(rebuild_rss)}",
          file=sys.stderr)  # fmt: skip

    # Short links.
    before = table_bytes("urlguard_shortlink")
    batch = 10_000
    for start in range(0, args.links, batch):
        ShortLink.objects.bulk_create(
            ShortLink(slug=f"l{i:x}", destination=f"https://site{i % 50_000}.example/p/{i}?ref=x")
            for i in range(start, min(start + batch, args.links))
        )
    db_links = table_bytes("urlguard_shortlink") - before
    started = time.perf_counter()
    build_link_index()
    index_s = time.perf_counter() - started
    index_bytes = dir_bytes(var / "link-index")
    scale = MILLION / args.links
    rows += [
        ("short links: PostgreSQL", db_links * scale),
        ("short links: link index (var/link-index, the node that builds it)", index_bytes * scale),
    ]
    print(f"link index of {args.links:,}: {index_s:.1f} s", file=sys.stderr)

    # Raw click rows (kept HIT_LOG_DAYS-independent: one per link, visitor and hour).
    before = table_bytes("urlguard_click")
    pks = list(ShortLink.objects.values_list("pk", flat=True)[:1000])
    for start in range(0, args.clicks, batch):
        Click.objects.bulk_create(
            Click(link_id=pks[i % len(pks)], visitor=f"{i:064x}")
            for i in range(start, min(start + batch, args.clicks))
        )
    db_clicks = table_bytes("urlguard_click") - before
    rows.append(("clicks: PostgreSQL (raw rows)", db_clicks * MILLION / args.clicks))

    print(f"\nper million (measured at {args.rules:,} rules, {args.links:,} links, "
          f"{args.clicks:,} clicks; PostgreSQL {connection.pg_version // 10000})")  # fmt: skip
    print("| what | per million |\n| --- | --- |")
    for what, size in rows:
        print(f"| {what} | {mib(size)} |")
    print(f"| rules: `rebuild_filter` peak RSS above a booted process's {mib(baseline_rss)} "
          f"(the worker at a node's first start) | "
          f"{mib((rebuild_rss - baseline_rss) * MILLION / args.rules)} |")  # fmt: skip
    print(f"| rules: `import_rules` peak RSS above it | "
          f"{mib((import_rss - baseline_rss) * MILLION / args.rules)} |")  # fmt: skip
    connection.close()
    with psycopg.connect(f"{args.pg}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')


if __name__ == "__main__":
    main()
