"""Benchmarks of the admin's heavy paths, on the embedded default (SQLite, Celery
in-process), in a throw-away var dir:

1. Import of N rules (default 100,000) through the admin: upload + dry-run preview,
   then commit (changes.add_rules in chunks, each applied to the filter file) and the
   rescan that follows, all through Django's test client. Target: < 60 s end to end.
2. Rescan of M short links (default 1,000,000) against those rules with
   urlguard.shortlinks.rescan.rescan_links (filter first, table only for hits). Target: < 60 s.
   Beside it, measured in the same run on a sample: the naive rescan (one table query
   per link with its expressions) and an in-memory set of every rule (the memory-hungry
   upper bound a single process could reach).
3. Impact (urlguard.writepath.impact) against those M links: building the link index, then
   "what would this change block" for one rule and for all N imported rules (the
   import preview), and "what would removing them unblock" (the bulk-delete summary).
   Target: < 2 s each. Beside it, the rescan's own way: canonicalizing every link.
4. Revert of the N-rule import's change set (every rule removed again through
   urlguard.writepath.changes, in one change set).
5. The serving process during a ~20 MB import: the embedded default started with
   runserver in its own process, the upload, the dry run, the commit, each request's
   time and the server's peak resident memory. Target: requests < 1 s, < 300 MB.

    .venv/bin/python bench/admin.py [--rules 100000] [--links 1000000] [--megabytes 20]
"""

from __future__ import annotations

import argparse
import contextlib
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
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "urlguard_service.settings")
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

    from urlguard.jobs import dispatch
    from urlguard.models import AdminJob, SpamRule
    from urlguard.nodesync import sync

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
    upload = time.perf_counter() - t0
    dispatch.runner.join()  # the dry run, on the runner thread
    job = AdminJob.objects.get(kind="import")
    t1 = time.perf_counter()
    page = client.get(response["Location"])
    assert page.status_code == 200
    t2 = time.perf_counter()
    response = client.post(reverse("admin:urlguard_spamrule_import_commit", args=[job.pk]))
    assert response.status_code == 302
    commit_request = time.perf_counter() - t2
    dispatch.runner.join()  # the import and its rescan, on the runner thread
    t3 = time.perf_counter()
    job.refresh_from_db()
    assert job.state == "done", job.message
    rescan = AdminJob.objects.get(pk=job.result["rescan_job"])
    rules = SpamRule.objects.count()
    assert rules == n, (rules, n)
    return {
        "upload": upload,
        "commit_request": commit_request,
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
    from urlguard.hotpath.canonical import canonicalize, expressions
    from urlguard.hotpath.guard import reset_guard
    from urlguard.models import ShortLink, SpamRule
    from urlguard.shortlinks.rescan import rescan_links

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


def bench_impact(lines: list[str], scan: dict) -> dict:
    """Impact figures against the links bench_rescan made (the rules are listed)."""
    from urlguard.models import ShortLink
    from urlguard.writepath import impact
    from urlguard.writepath.rules import normalize_rule

    t0 = time.perf_counter()
    index = impact.build_link_index()
    build = time.perf_counter() - t0
    expressions = []
    for line in lines:
        with contextlib.suppress(ValueError):
            expressions.append(normalize_rule(line.split()[-1]))
    # One rule: a listed host that short links point to (through a subdomain).
    destination = (
        ShortLink.objects.filter(destination__startswith="https://www.spam")
        .values_list("destination", flat=True)
        .first()
    )
    host = destination.split("/")[2].removeprefix("www.")
    t1 = time.perf_counter()
    one = impact.impact_of_adding([f"{host}/"])
    one_seconds = time.perf_counter() - t1
    t2 = time.perf_counter()
    many = impact.impact_of_adding(expressions)
    many_seconds = time.perf_counter() - t2
    t3 = time.perf_counter()
    removal = impact.impact_of_removing(expressions)
    removal_seconds = time.perf_counter() - t3
    return {
        "build": build,
        "entries": len(index.keys),
        "one": one_seconds,
        "one_links": one.links,
        "many": many_seconds,
        "many_links": many.links,
        "removal": removal_seconds,
        "removal_links": removal.links,
        "rules": len(expressions),
        "scan": scan["ours"],
    }


def bench_revert(n: int) -> dict:
    """Revert the import's change set (all N rules removed in one new change set)."""
    from urlguard.models import ChangeSet, SpamRule
    from urlguard.writepath import revert

    change_set = ChangeSet.objects.filter(kind="import").order_by("-pk").first()
    before = SpamRule.objects.count()
    t0 = time.perf_counter()
    revert.revert_change_set(change_set, actor=None)
    seconds = time.perf_counter() - t0
    removed = before - SpamRule.objects.count()
    assert removed == n, (removed, n)
    return {"seconds": seconds, "removed": removed}


# -- the serving process during a 20 MB import (request time and peak memory) ----------


def _http(opener, url: str, data: bytes | None = None, headers: dict | None = None):
    import urllib.request

    request = urllib.request.Request(url, data=data, headers=headers or {})
    started = time.perf_counter()
    with opener.open(request, timeout=600) as response:
        body = response.read()
        return time.perf_counter() - started, response, body


def _csrf(jar) -> str:
    return next(c.value for c in jar if c.name == "csrftoken")


def _part(boundary: str, name: str, value: bytes) -> bytes:
    head = f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'
    return head.encode() + value + b"\r\n"


def _vm(pid: int, key: str) -> int:
    """VmHWM (peak) or VmRSS of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def bench_serving_import(megabytes: float, rng: random.Random) -> dict:
    """Start the embedded default (runserver, SQLite, jobs on the runner thread) in its
    own process and its own var dir, log in, upload a ~20 MB rule file, commit it, and
    measure each request and the server's peak resident memory."""
    import http.cookiejar
    import json
    import subprocess
    import urllib.parse
    import urllib.request
    import uuid

    port = 18611
    with tempfile.TemporaryDirectory(prefix="urlguard-bench-serve-") as var:
        env = {
            **os.environ,
            "URLGUARD_VAR_DIR": var,
            "DJANGO_DEBUG": "0",
            "DJANGO_SETTINGS_MODULE": "urlguard_service.settings",
        }
        env.pop("DATABASE_URL", None)
        env.pop("CELERY_BROKER_URL", None)
        python = sys.executable
        subprocess.run([python, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
        subprocess.run(
            [
                python,
                "-c",
                "import django; django.setup(); "
                "from django.contrib.auth import get_user_model; "
                "get_user_model().objects.create_superuser('bench', 'b@example.com', 'pw')",
            ],
            cwd=ROOT,
            env=env,
            check=True,
        )
        server = subprocess.Popen(
            [python, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            jar = http.cookiejar.CookieJar()
            opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
            for _ in range(100):
                try:
                    _http(opener, f"{base}/admin/login/")
                    break
                except OSError:
                    time.sleep(0.2)
            form = urllib.parse.urlencode(
                {"username": "bench", "password": "pw", "csrfmiddlewaretoken": _csrf(jar)}
            ).encode()
            login = f"{base}/admin/login/?next=/admin/"
            _http(opener, login, form, {"Referer": login})
            idle_rss = _vm(server.pid, "VmRSS")

            lines = []
            size = 0
            i = 0
            while size < megabytes * 2**20:
                line = rule_lines(1, rng)[0].replace("spam0-", f"spam{i}-")
                lines.append(line)
                size += len(line) + 1
                i += 1
            body_text = ("\n".join(lines) + "\n").encode()
            del lines
            boundary = uuid.uuid4().hex
            body = b"".join(
                [
                    _part(boundary, "csrfmiddlewaretoken", _csrf(jar).encode()),
                    _part(boundary, "default_category", b"spam"),
                    f"--{boundary}\r\n".encode(),
                    b'Content-Disposition: form-data; name="file"; filename="feed.txt"\r\n',
                    b"Content-Type: text/plain\r\n\r\n",
                    body_text,
                    f"\r\n--{boundary}--\r\n".encode(),
                ]
            )
            upload_url = f"{base}/admin/urlguard/spamrule/import/"
            upload_seconds, response, _ = _http(
                opener,
                upload_url,
                body,
                {
                    "Content-Type": f"multipart/form-data; boundary={boundary}",
                    "Referer": upload_url,
                },
            )
            job_url = response.geturl()
            job_id = int(job_url.rstrip("/").split("/")[-1])
            status_url = f"{base}/admin/urlguard/spamrule/jobs/{job_id}/status/"

            def wait(state: str) -> float:
                started = time.perf_counter()
                while True:
                    _, _, raw = _http(opener, status_url)
                    status = json.loads(raw)
                    if status["state"] in (state, "failed"):
                        assert status["state"] == state, status
                        return time.perf_counter() - started
                    time.sleep(0.5)

            preview_wait = wait("previewed")
            commit_seconds, _, _ = _http(
                opener,
                f"{base}/admin/urlguard/spamrule/import/{job_id}/commit/",
                urllib.parse.urlencode({"csrfmiddlewaretoken": _csrf(jar)}).encode(),
                {"Referer": job_url},
            )
            commit_wait = wait("done")
            peak = _vm(server.pid, "VmHWM")
        finally:
            server.terminate()
            server.wait(10)
    return {
        "bytes": len(body_text),
        "lines": i,
        "upload_request": upload_seconds,
        "preview_job": preview_wait,
        "commit_request": commit_seconds,
        "commit_job": commit_wait,
        "idle_rss": idle_rss,
        "peak_rss": peak,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rules", type=int, default=100_000)
    parser.add_argument("--links", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--megabytes", type=float, default=20.0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="urlguard-bench-") as tmp:
        setup_django(Path(tmp))
        imp, lines = bench_import(args.rules, rng)
        scan = bench_rescan(args.links, lines, rng)
        effect = bench_impact(lines, scan)
        undo = bench_revert(args.rules)
        from urlguard.nodesync import embedded

        embedded.stop()  # its catch-up thread must not outlive the throw-away var dir
    serve = bench_serving_import(args.megabytes, rng)

    print(
        f"\nAdmin import: {imp['rules']:,} rules ({imp['bytes'] / 2**20:.1f} MiB file), "
        "SQLite, Celery in-process, via the test client"
    )
    print("| step | seconds |")
    print("|---|---:|")
    print(f"| upload request | {imp['upload']:.2f} |")
    print(f"| upload + dry run (job) | {imp['preview']:.2f} |")
    print(f"| preview page render | {imp['preview_page']:.2f} |")
    print(f"| commit request | {imp['commit_request']:.2f} |")
    print(f"| commit until done (add_rules + filter apply + rescan, job) | {imp['commit']:.2f} |")
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
        f"| **urlguard.shortlinks.rescan (filter, table for hits), "
        f"{scan['processes']} process(es)** (target < 60) | **{scan['ours']:.2f}** wall, "
        f"{scan['ours_cpu']:.2f} CPU |"
    )
    print(f"| naive: one table query per link, 1 process | {scan['naive']:.2f} |")
    print(f"| every rule in a Python set (load + lookups), 1 process | {scan['in_memory']:.2f} |")
    print(f"(creating the {scan['links']:,} links took {scan['make']:.1f} s, not counted)")
    print(
        f"\nImpact against {scan['links']:,} short links ({effect['entries']:,} indexed "
        "expressions); the rescan's way is canonicalizing every link"
    )
    print("| question | seconds | links |")
    print("|---|---:|---:|")
    print(f"| build the link index (once; after each rescan) | {effect['build']:.2f} | |")
    print(
        f"| **adding one rule** (target < 2) | **{effect['one']:.3f}** | {effect['one_links']:,} |"
    )
    print(
        f"| **adding {effect['rules']:,} rules (import preview)** (target < 2) | "
        f"**{effect['many']:.2f}** | {effect['many_links']:,} |"
    )
    print(
        f"| **removing {effect['rules']:,} rules (bulk-delete summary)** (target < 2) | "
        f"**{effect['removal']:.2f}** | {effect['removal_links']:,} |"
    )
    print(f"| peer: the rescan (canonicalize every link) | {effect['scan']:.2f} | |")
    print(
        f"\nRevert of the {args.rules:,}-rule import's change set: "
        f"**{undo['seconds']:.2f} s** ({undo['removed']:,} rules removed)"
    )
    print(
        f"\nServing process (runserver, SQLite, jobs on its runner thread) during a "
        f"{serve['bytes'] / 2**20:.1f} MiB import of {serve['lines']:,} lines"
    )
    print("| step | seconds |")
    print("|---|---:|")
    print(f"| **upload request** (target < 1) | **{serve['upload_request']:.2f}** |")
    print(f"| dry run (job, until the preview is ready) | {serve['preview_job']:.2f} |")
    print(f"| **commit request** (target < 1) | **{serve['commit_request']:.2f}** |")
    print(f"| import + rescan (job) | {serve['commit_job']:.2f} |")
    print(
        f"| **peak resident memory of the serving process** (target < 300 MB) | "
        f"**{serve['peak_rss'] / 2**20:.0f} MB** (idle {serve['idle_rss'] / 2**20:.0f} MB) |"
    )
    print(f"(load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
