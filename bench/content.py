"""Benchmark: `urlguard.content.check_text` on a 2,000-character post with 10 links,
per link, beside `Guard.check_many` on the same 10 links (the batch check it makes)
and `find_links` alone (the scan), in the same run. Target: check_text <= 100 µs
per link.

    .venv/bin/python bench/content.py [--rules 100000] [--posts 2000]

The posts are prose with 10 distinct clean links each, of the kinds people post
(full URLs, `www.` hosts, bare hosts with a path on new top-level domains), placed
among the words; the filter holds synthetic rules (bench/guard.py's). Runs on a
throw-away var dir (SQLite + filter file), never on var/.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.guard import rule_expressions  # noqa: E402

PROSE = (
    "the quick brown fox jumps over a lazy dog and then it reads what people wrote "
    "about it, which was mostly kind; some said more, e.g. that it should rest. Others "
    "asked (politely) where to find more!"
)
WORDS = PROSE.split(" ")
LINKS_PER_POST = 10
POST_CHARS = 2000


def link(i: int, kind: int) -> str:
    if kind == 0:
        return f"https://www.shop{i}.com/c{i % 7}/item{i}.html?ref={i % 97}"
    if kind == 1:
        return f"www.news{i}.org/story/{i}"
    if kind == 2:
        return f"deal{i}.top/promo/{i % 13}/"
    return f"(see http://blog{i}.example.net/{i}/comments)"


def post(n: int, rng: random.Random) -> str:
    """About POST_CHARS characters of prose with LINKS_PER_POST links among them."""
    links = [link(n * LINKS_PER_POST + k, k % 4) for k in range(LINKS_PER_POST)]
    budget = POST_CHARS + 40 - sum(len(x) + 1 for x in links)  # cut to size below
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < budget:
        words.append(rng.choice(WORDS))
    for k, text in enumerate(links):
        words.insert((k + 1) * len(words) // (LINKS_PER_POST + 1) + k, text)
    return " ".join(words)[:POST_CHARS]


def median_us(fn, items) -> tuple[float, float]:
    """(median, p90) µs of fn(item) over items."""
    samples = []
    clock = time.perf_counter_ns
    for item in items:
        t0 = clock()
        fn(item)
        samples.append((clock() - t0) / 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.9)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rules", type=int, default=100_000)
    parser.add_argument("--posts", type=int, default=2000)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="urlguard-bench-content-")
    os.environ["URLGUARD_VAR_DIR"] = tmp
    os.environ.pop("DATABASE_URL", None)
    os.environ["DJANGO_DEBUG"] = "0"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "urlguard_service.settings")
    try:
        run(args, Path(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(args: argparse.Namespace, tmp: Path) -> None:
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)  # a filter false positive is confirmed in the table

    from filterengine import ScalingCountingBloomFilter
    from urlguard.conf import conf
    from urlguard.content import check_text, find_links
    from urlguard.hotpath.guard import Guard, use_guard

    path = str(tmp / "filter.bin")
    ScalingCountingBloomFilter.build(
        path,
        ((e, i + 1) for i, e in enumerate(rule_expressions(args.rules))),
        capacity=args.rules,
        error_rate=conf.FILTER_ERROR_RATE,
    )
    filt = ScalingCountingBloomFilter.open(path, readonly=True)
    guard = Guard(lambda: filt)
    rng = random.Random(36)
    posts = [post(n, rng) for n in range(args.posts)]
    warm = [post(n, rng) for n in range(args.posts, args.posts + 200)]
    links = [find_links(p) for p in posts]
    assert all(len(found) == LINKS_PER_POST for found in links), links[0]
    assert all(len(p) == POST_CHARS for p in posts)

    with use_guard(guard):
        for p in warm:  # the code warm, not the caches: the timed posts are all new
            check_text(p)
        guard.clean_cache.clear()
        rows = [
            ("check_text(post)", median_us(check_text, posts)),
            ("  find_links(post) alone", median_us(find_links, posts)),
        ]
        guard.clean_cache.clear()
        rows.append(("  Guard.check_many(its 10 links) alone", median_us(guard.check_many, links)))
    filt.close()

    print(
        f"\ncheck_text on {args.posts:,} posts of {POST_CHARS:,} characters with "
        f"{LINKS_PER_POST} links each (target: <= 100 µs per link), {args.rules:,} rules; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n"
    )
    print(f"| {'what':<40} | {'median µs/post':>14} | {'p90 µs/post':>11} | {'µs/link':>8} |")
    print(f"|{'-' * 42}|{'-' * 16}|{'-' * 13}|{'-' * 10}|")
    for name, (median, p90) in rows:
        per_link = median / LINKS_PER_POST
        print(f"| {name:<40} | {median:>14.0f} | {p90:>11.0f} | {per_link:>8.1f} |")


if __name__ == "__main__":
    main()
