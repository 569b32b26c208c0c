"""Benchmark: urlguard.hotpath.canonical on the hot path of every redirect.

canonicalize + expressions per URL (µs, median and p99) on a few thousand
realistic URLs, cold (nothing cached: every URL new) and warm (a destination seen
before), in the call pattern of Guard.check: `expressions(canonicalize(url))`.
Beside it, in the same run, a floor that is not a peer in what it does:
`urllib.parse.urlsplit` plus lower-casing the host (no unescaping, no IPv4 or IDNA
handling, no expressions). Then hostile input as one-off timings (a 100 KB URL,
10,000 nested %25), and the worst host of each shape at 60 and 10,000
characters beside a plain host of the same length, each in a forked child with
a time limit (an exponential case would never finish).

    .venv/bin/python bench/canonical.py [--urls 5000] [--repeat 20] [--limit 10]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from urlguard.hotpath import canonical  # noqa: E402  (after the path tweak)
from urlguard.hotpath.canonical import canonicalize, expressions  # noqa: E402

WORDS = (
    "news",
    "shop",
    "blog",
    "login",
    "account",
    "images",
    "static",
    "video",
    "search",
    "product",
    "item",
    "article",
    "2026",
    "11",
    "help",
    "en",
    "de",
    "api",
    "v2",
    "user",
)
TLDS = ("com", "net", "org", "de", "co.uk", "io", "fr", "com.br", "info", "jp")


def realistic_urls(count: int, seed: int = 20261122) -> list[str]:
    """Short-link destinations as they come: mostly https, www or a subdomain, a few
    path segments, tracking queries, now and then a fragment, a port, an escape,
    upper case, an IDN host or an IP address."""
    rng = random.Random(seed)
    urls = []
    for i in range(count):
        scheme = "https" if rng.random() < 0.85 else "http"
        labels = [f"{rng.choice(WORDS)}{i}", rng.choice(TLDS)]
        roll = rng.random()
        if roll < 0.5:
            labels.insert(0, "www")
        elif roll < 0.7:
            labels.insert(0, rng.choice(WORDS))
        host = ".".join(labels)
        if rng.random() < 0.03:
            host = f"bücher{i}.example"
        elif rng.random() < 0.02:
            host = f"{rng.randrange(1, 223)}.{rng.randrange(256)}.{rng.randrange(256)}.1"
        if rng.random() < 0.05:
            host = host.upper()
        if rng.random() < 0.03:
            host += ":8080"
        path = "/" + "/".join(rng.choice(WORDS) for _ in range(rng.randrange(0, 5)))
        if rng.random() < 0.5:
            path += rng.choice(("", "/", ".html", "/index.php"))
        if rng.random() < 0.05:
            path += "/caf%C3%A9%20menu"
        url = f"{scheme}://{host}{path}"
        if rng.random() < 0.4:
            url += f"?utm_source={rng.choice(WORDS)}&utm_medium=social&id={rng.randrange(10**6)}"
        if rng.random() < 0.1:
            url += "#section-2"
        urls.append(url)
    return urls


def per_url_micros(
    fn: Callable[[str], object],
    urls: Sequence[str],
    repeat: int,
    before: Callable[[], None] | None = None,
) -> list[float]:
    """µs per call of fn(url) for each URL: the best of `repeat` single calls (the
    least disturbed by the rest of the machine)."""
    timings = []
    clock = time.perf_counter_ns
    for url in urls:
        best = None
        for _ in range(repeat):
            if before is not None:
                before()
            start = clock()
            fn(url)
            elapsed = clock() - start
            if best is None or elapsed < best:
                best = elapsed
        timings.append(best / 1000)
    return timings


def row(name: str, micros: list[float]) -> str:
    ordered = sorted(micros)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (
        f"| {name:<52} | {statistics.median(ordered):>9.2f} | {p99:>8.2f} "
        f"| {statistics.fmean(ordered):>8.2f} |"
    )


def once_millis(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def refused_or_ms(fn: Callable[[], object]) -> str:
    try:
        return f"{once_millis(fn):.1f} ms"
    except ValueError as exc:
        return f"refused in {once_millis(lambda: _refused(fn)):.1f} ms ({str(exc)[-30:]})"


def _refused(fn: Callable[[], object]) -> None:
    with contextlib.suppress(ValueError):
        fn()


# The worst host of each shape, n characters long ("hex parts" is the one that
# made a regular expression backtrack exponentially: 0x10 repeated, then a "g").
WORST_HOSTS = {
    "plain (a...a)": lambda n: "a" * n,
    "hex parts": lambda n: ("0x10" * n)[: n - 1] + "g",
    "hex parts and dots": lambda n: ("0x10." * n)[: n - 1] + "g",
    "zeros, then no octal digit": lambda n: "0" * (n - 1) + "8",
    "0x, zeros, then no hex digit": lambda n: "0x" + "0" * (n - 3) + "g",
    "dots": lambda n: "." * (n - 1) + "1",
    "digits": lambda n: "1" * n,
    "percent-escapes": lambda n: ("%31%2e" * n)[: n - 1] + "g",
    "nested %25": lambda n: "%" + "25" * ((n - 3) // 2) + "41",
    "distinct non-ASCII (Punycode)": lambda n: "".join(chr(0x4E00 + i % 20_000) for i in range(n)),
}


def _time_in_child(url: str, limit: float) -> str:
    """Best of 3 canonicalize(url) in a forked child, or '> limit' if it ran out."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: time it, report, exit
        os.close(reader)
        best = float("inf")
        outcome = "ok"
        for _ in range(3):
            canonical._cache.clear()
            start = time.perf_counter()
            try:
                canonicalize(url)
            except ValueError:
                outcome = "refused"
            best = min(best, time.perf_counter() - start)
        os.write(writer, f"{best * 1000:.3f} ms ({outcome})".encode())
        os._exit(0)
    os.close(writer)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            with os.fdopen(reader) as pipe:
                return pipe.read()
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    os.close(reader)
    return f"> {limit:.0f} s (stopped)"


def worst_hosts(limit: float) -> None:
    print(f"\nworst host of each shape, canonicalize, best of 3 (limit {limit:.0f} s each):")
    print(f"| {'host shape':<32} | {'60 chars':>22} | {'10,000 chars':>22} |")
    print(f"|{'-' * 34}|{'-' * 24}|{'-' * 24}|")
    for name, make in WORST_HOSTS.items():
        cells = [_time_in_child(f"http://{make(n)}/", limit) for n in (60, 10_000)]
        print(f"| {name:<32} | {cells[0]:>22} | {cells[1]:>22} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--urls", type=int, default=5000)
    parser.add_argument(
        "--limit", type=float, default=10.0, help="seconds per worst-host timing (default 10)"
    )
    parser.add_argument(
        "--repeat", type=int, default=20, help="calls per URL; the best one counts (default 20)"
    )
    args = parser.parse_args()
    urls = realistic_urls(args.urls)
    clear = canonical._cache.clear
    expression_counts = [len(expressions(u)) for u in urls]

    def guard_pattern(url: str) -> list[str]:
        return expressions(canonicalize(url))

    browser_url = getattr(canonical, "browser_url", None)

    def middleware_pattern(url: str) -> list[str]:
        # The middleware's: the Location to send, then the guard's check of it.
        return expressions(canonicalize(browser_url(url)))  # type: ignore[misc]

    def clear_both() -> None:
        clear()
        getattr(canonical, "_browser_cache", {}).clear()

    def floor(url: str) -> str:
        parts = urlsplit(url)
        return (parts.hostname or "") + parts.path

    print(
        f"{len(urls):,} URLs, {statistics.fmean(expression_counts):.1f} expressions each "
        f"on average; best of {args.repeat} calls per URL; µs per URL\n"
    )
    print(f"| {'what':<52} | {'median':>9} | {'p99':>8} | {'mean':>8} |")
    print(f"|{'-' * 54}|{'-' * 11}|{'-' * 10}|{'-' * 10}|")
    print(
        row(
            "expressions(canonicalize(url)), cold (no cache)",
            per_url_micros(guard_pattern, urls, args.repeat, before=clear),
        )
    )
    clear()
    print(
        row(
            "expressions(canonicalize(url)), warm (seen before)",
            per_url_micros(guard_pattern, urls, args.repeat),
        )
    )
    if browser_url is not None:
        print(
            row(
                "expressions(canonicalize(browser_url(url))), cold",
                per_url_micros(middleware_pattern, urls, args.repeat, before=clear_both),
            )
        )
        clear_both()
        print(
            row(
                "expressions(canonicalize(browser_url(url))), warm",
                per_url_micros(middleware_pattern, urls, args.repeat),
            )
        )
    print(
        row(
            "canonicalize(url) alone, cold",
            per_url_micros(canonicalize, urls, args.repeat, before=clear),
        )
    )
    print(
        row(
            "floor: urllib.parse.urlsplit + hostname (not a peer)",
            per_url_micros(floor, urls, args.repeat),
        )
    )

    clear()
    hundred_kb = "http://Sub.Example.com/" + "abc%2Fdef/./../%41%25%32%35/" * 3600 + "?q=1"
    nested = "http://example.com/%" + "25" * 10_000 + "41"
    print(
        f"\nhostile input, one call each, with MAX_URL_LENGTH "
        f"({getattr(canonical, 'MAX_URL_LENGTH', 0):,}) and with it lifted to 2 MiB:"
    )
    limit = canonical.MAX_URL_LENGTH
    print(
        f"  100 KB URL ({len(hundred_kb):,} chars), canonicalize + expressions: "
        f"{refused_or_ms(lambda: expressions(canonicalize(hundred_kb)))}"
    )
    print(f"  10,000 nested %25, canonicalize: {refused_or_ms(lambda: canonicalize(nested))}")
    huge_host = "http://" + "a." * 50_000 + "com/"
    print(
        f"  100 KB host of 50,000 labels, canonicalize + expressions: "
        f"{refused_or_ms(lambda: expressions(canonicalize(huge_host)))}"
    )
    canonical.MAX_URL_LENGTH = 2 * 1024 * 1024
    print(
        f"  lifted: 100 KB URL {refused_or_ms(lambda: expressions(canonicalize(hundred_kb)))}, "
        f"100 KB host {refused_or_ms(lambda: expressions(canonicalize(huge_host)))}"
    )
    canonical.MAX_URL_LENGTH = limit

    worst_hosts(args.limit)
    print(f"\nload average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
