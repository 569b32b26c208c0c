"""Benchmark the other filters against what a user would pick instead, in one run:
ops/s and bytes per element side by side (issue 5), plus the two measurements that
decide product choices: the clean-URL cache (opposite filter vs bounded LRU) and
the persistent filter's fan-out and block size.

    .venv/bin/python bench/variants.py            # full run, ~1-2 min
    .venv/bin/python bench/variants.py --quick    # smaller sizes, a smoke run

Prints Markdown tables a person can paste into a note."""

from __future__ import annotations

import argparse
import gc
import platform
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from filterengine import (
    ContinuousBloomFilter,
    OppositeBloomFilter,
    PersistentBloomFilter,
    RotatingBloomFilter,
    ScalableBloomFilter,
)
from filterengine.hashing import MASK64, hash_pair, plan_slices


def rate(fn: Callable[[], object], ops: int, repeat: int = 3) -> float:
    """Best-of-`repeat` operations per CPU second of fn(), which performs `ops`
    operations. CPU time of this process, not wall time: the machine is shared, and
    time spent waiting for a core says nothing about the structure."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return ops / max(best, 1e-9)


def allocated(build: Callable[[], object]) -> tuple[object, int]:
    """The object build() returns and the bytes allocated for it that are still live."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    obj = build()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return obj, after - before


def table(title: str, header: list[str], rows: list[list[object]]) -> None:
    print(f"\n### {title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        cells = []
        for v in row:
            if isinstance(v, float):
                cells.append(f"{v:,.0f}" if v >= 100 else f"{v:.3g}")
            else:
                cells.append(str(v))
        print("| " + " | ".join(cells) + " |")


def urls(start: int, n: int) -> list[str]:
    return [f"https://example{i % 997}.com/path/{i}?q={i * 7919}" for i in range(start, start + n)]


# -- opposite filter vs LRU vs dict --------------------------------------------------
def bench_opposite(n: int) -> None:
    from cachetools import LRUCache

    size = 1 << 16
    keys = urls(0, n)
    # A stream where about half the lookups repeat a recent key.
    stream = [keys[i // 2] if i % 2 else keys[(i * 31) % n] for i in range(n)]

    def run_opposite():
        f = OppositeBloomFilter(size)
        cab = f.contains_and_add
        for k in stream:
            cab(k)

    def run_lru():
        c = LRUCache(maxsize=size)
        for k in stream:
            if k in c:
                c[k]  # refresh recency, as a cache hit does
            else:
                c[k] = True

    def run_dict():
        d: dict[str, bool] = {}
        for k in stream:
            if k in d:
                continue
            d[k] = True

    def fill(make, put):
        def build():
            s = make()
            for i in range(size):
                put(s, f"https://example{i % 997}.com/path/{i}?q={i * 7919}")
            return s

        return build

    rows = []
    for name, run, make, put in [
        (
            "OppositeBloomFilter (ours)",
            run_opposite,
            lambda: OppositeBloomFilter(size),
            lambda s, k: s.add(k),
        ),
        (
            "cachetools.LRUCache",
            run_lru,
            lambda: LRUCache(maxsize=size),
            lambda s, k: s.__setitem__(k, True),
        ),
        ("dict (unbounded)", run_dict, dict, lambda s, k: s.__setitem__(k, True)),
    ]:
        _, mem = allocated(fill(make, put))
        rows.append([name, rate(run, len(stream)), mem / size])
    table(
        f"Opposite filter, {size:,} slots/entries; seen-and-remember on {len(stream):,} URLs",
        ["structure", "ops/s", "bytes/element (keys included)"],
        rows,
    )


def bench_clean_cache(n: int) -> None:
    """The cache of URLs confirmed clean after a main-filter false positive (the
    Guard's clean cache): a Zipf stream of lookups; on a miss the Guard queries the
    table and adds the URL. Both are thread-safe as the Guard needs: the LRU as
    urlguard.hotpath.guard.LRUCleanCache wraps it (a lock), ours with its own lock."""
    import threading

    from cachetools import LRUCache

    class LockedLRU:  # urlguard.hotpath.guard.LRUCleanCache, without importing Django
        def __init__(self, maxsize):
            self._data, self._lock = LRUCache(maxsize=maxsize), threading.Lock()

        def __contains__(self, key):
            with self._lock:
                return self._data.get(key, False)

        def add(self, key):
            with self._lock:
                self._data[key] = True

    rng = np.random.default_rng(7)
    universe = 200_000
    ids = np.minimum(rng.zipf(1.2, n), universe)
    stream = [f"https://fp-site{i % 1000}.example/p/{i}" for i in ids.tolist()]
    rows = []
    configs = [
        ("LRU + lock (Guard's LRUCleanCache)", LockedLRU, 1024),
        ("LRU + lock (Guard's LRUCleanCache)", LockedLRU, 10_000),
        ("OppositeBloomFilter", OppositeBloomFilter, 1024),
        ("OppositeBloomFilter", OppositeBloomFilter, 16_384),
        ("OppositeBloomFilter", OppositeBloomFilter, 32_768),
    ]
    for name, make, entries in configs:

        def run(make=make, entries=entries):
            cache = make(entries)
            hits = 0
            for url in stream:
                if url in cache:
                    hits += 1
                else:
                    cache.add(url)  # after the table confirmed it clean
            return hits

        hits = run()

        def build(make=make, entries=entries):
            cache = make(entries)
            for i in range(max(entries, 1)):
                cache.add(f"https://fp-site{i % 1000}.example/p/{i}")
            return cache

        _, mem = allocated(build)
        rows.append(
            [
                name,
                entries,
                f"{hits / len(stream):.1%}",
                rate(run, len(stream)),
                f"{mem / 1024:,.0f} KiB",
            ]
        )
    table(
        f"Clean-URL cache: Zipf(1.2) stream of {len(stream):,} lookups over {universe:,} "
        f"URLs (a miss costs one table query)",
        ["structure", "entries/slots", "hit rate", "lookups/s", "memory when full"],
        rows,
    )


# -- scalable ------------------------------------------------------------------
def bench_scalable(n: int) -> None:
    from pybloom_live import ScalableBloomFilter as PyScalable

    keys = urls(0, n)
    absent = urls(10_000_000, 50_000)
    p, n0 = 0.01, 1000
    rows = []
    for name, make in [
        ("ScalableBloomFilter s=2 r=0.85 (ours)", lambda: ScalableBloomFilter(n0, p)),
        (
            "ScalableBloomFilter s=2 r=0.5 (RedisBloom parameters, ours)",
            lambda: ScalableBloomFilter(n0, p, growth=2, tightening=0.5),
        ),
        (
            "pybloom_live.ScalableBloomFilter s=2 r=0.9",
            lambda: PyScalable(n0, p, PyScalable.SMALL_SET_GROWTH),
        ),
    ]:

        def add_all(make=make):
            f = make()
            for k in keys:
                f.add(k)
            return f

        f = add_all()
        adds = rate(add_all, n, repeat=1)
        probe = rate(lambda f=f: [k in f for k in absent], len(absent), repeat=2)
        fpr = sum(k in f for k in absent) / len(absent)
        stages = f.stages if isinstance(f, ScalableBloomFilter) else len(f.filters)
        nbytes = (
            f.nbytes
            if isinstance(f, ScalableBloomFilter)
            else sum(len(b.bitarray) // 8 for b in f.filters)
        )
        rows.append([name, stages, adds, probe, nbytes / n, f"{fpr:.4f}"])
    table(
        f"Scalable filters: {n:,} URLs from initial capacity {n0:,}, target P={p}",
        ["structure", "stages", "adds/s", "lookups/s (absent)", "bytes/element", "measured FPR"],
        rows,
    )


# -- TTL -----------------------------------------------------------------------
def bench_ttl(n: int) -> None:
    ttl = 3600.0
    keys = urls(0, n)
    probes = keys[: n // 2] + urls(5_000_000, n // 2)

    class ExpiryDict:
        """What a user would write: key -> expiry time, purged now and then."""

        def __init__(self, ttl):
            self.ttl, self.d, self.adds = ttl, {}, 0

        def add(self, key):
            now = time.monotonic()
            self.d[key] = now + self.ttl
            self.adds += 1
            if self.adds % 10_000 == 0:
                self.d = {k: v for k, v in self.d.items() if v > now}

        def __contains__(self, key):
            return self.d.get(key, 0.0) > time.monotonic()

    rows = []
    for name, make in [
        ("ContinuousBloomFilter (ours)", lambda: ContinuousBloomFilter(n, 0.01, ttl)),
        ("RotatingBloomFilter, 2 slices (ours)", lambda: RotatingBloomFilter(n, 0.01, ttl)),
        ("dict of expiry times", lambda: ExpiryDict(ttl)),
    ]:

        def fill(make=make):
            f = make()
            for k in keys:
                f.add(k)
            return f

        adds = rate(fill, n, repeat=1)
        f, mem = allocated(lambda make=make: fill(make))
        if isinstance(f, ExpiryDict):
            # The dict holds the keys it was given; count their size too.
            mem += sum(sys.getsizeof(k) for k in keys)
        lookups = rate(lambda f=f: [k in f for k in probes], len(probes), repeat=2)
        fpr = sum(k in f for k in urls(9_000_000, 20_000)) / 20_000
        rows.append([name, adds, lookups, mem / n, f"{fpr:.4f}"])
    table(
        f"Time-to-live filters: {n:,} URLs alive, ttl 1 h, P=0.01",
        ["structure", "adds/s", "lookups/s (half present)", "bytes/element", "measured FPR"],
        rows,
    )


# -- persistent ----------------------------------------------------------------
def bench_persistent_shape(n: int, capacity: int) -> list[list[object]]:
    keys = urls(0, n)
    rows = []
    for fanout in (8, 16, 32, 64):
        for block in (64, 256, 1024):
            base = PersistentBloomFilter(capacity, 0.01, fanout=fanout, block_bytes=block)
            base = base.add_many(urls(50_000_000, capacity // 2))  # half full: real blocks

            def chain(base=base):
                v = base
                for k in keys:
                    v = v.add(k)
                return v

            adds = rate(chain, n, repeat=3)

            def retained(base=base):
                versions = [base]
                for k in keys:
                    versions.append(versions[-1].add(k))
                return versions

            _, mem = allocated(retained)
            v = chain()
            lookups = rate(lambda v=v: [k in v for k in keys], n, repeat=3)
            rows.append([fanout, block, v.info()["depth"], adds, lookups, mem / n])
    return rows


def bench_persistent(n: int, capacity: int) -> None:
    import pyrsistent

    shape_rows = bench_persistent_shape(n, capacity)
    table(
        f"Persistent filter shape (capacity {capacity:,}, P=0.01, half full): "
        f"{n:,} one-by-one adds, every version retained",
        ["fan-out", "block bytes", "depth", "adds/s", "lookups/s", "bytes per version"],
        shape_rows,
    )

    keys = urls(0, n)
    k, cells = plan_slices(capacity, 0.01)
    nbits = k * cells
    offsets = [(i, i * cells) for i in range(k)]

    def bits_of(key):
        h1, h2 = hash_pair(key)
        return [base + ((h1 + i * h2) & MASK64) % cells for i, base in offsets]

    prefill = urls(50_000_000, capacity // 2)
    # Every structure starts from the same half-full array, built outside the timing.
    words = [0] * (-(-nbits // 64))
    flat = bytearray(-(-nbits // 8))
    for key in prefill:
        for b in bits_of(key):
            words[b >> 6] |= 1 << (b & 63)
            flat[b >> 3] |= 1 << (b & 7)
    start_vector = pyrsistent.pvector(words)
    start_bytes = bytes(flat)

    # pyrsistent.pvector of 64-bit words: a persistent vector (C, 32-way trie).
    def pvector_chain():
        v = start_vector
        versions = [v]
        for key in keys:
            e = v.evolver()
            for b in bits_of(key):
                e[b >> 6] = e[b >> 6] | (1 << (b & 63))
            v = e.persistent()
            versions.append(v)
        return versions

    def pvector_contains(v):
        return [all(v[b >> 6] >> (b & 63) & 1 for b in bits_of(key)) for key in keys]

    # A full copy of the bit array per insert.
    def copy_chain():
        versions = [start_bytes]
        for key in keys:
            arr = bytearray(versions[-1])
            for b in bits_of(key):
                arr[b >> 3] |= 1 << (b & 7)
            versions.append(bytes(arr))
        return versions

    ours = PersistentBloomFilter(capacity, 0.01).add_many(prefill)

    def ours_chain():
        versions = [ours]
        for key in keys:
            versions.append(versions[-1].add(key))
        return versions

    rows = []
    for name, chain, contains in [
        ("PersistentBloomFilter (ours)", ours_chain, lambda vs: [key in vs[-1] for key in keys]),
        ("pyrsistent.pvector of 64-bit words", pvector_chain, lambda vs: pvector_contains(vs[-1])),
        (
            "full copy per insert",
            copy_chain,
            lambda vs: [all(vs[-1][b >> 3] >> (b & 7) & 1 for b in bits_of(key)) for key in keys],
        ),
    ]:
        adds = rate(chain, n, repeat=1)
        versions, mem = allocated(chain)
        lookups = rate(lambda vs=versions, c=contains: c(vs), n, repeat=2)
        rows.append([name, adds, lookups, mem / (n + 1)])
        del versions
    table(
        f"Persistent filters (capacity {capacity:,}, {nbits // 8:,} bytes of bits, half "
        f"full): {n:,} one-by-one adds, every version retained",
        ["structure", "adds/s", "lookups/s", "bytes per retained version"],
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    print(
        f"bench/variants.py on Python {platform.python_version()}, numpy {np.__version__}, "
        f"{platform.machine()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    bench_opposite(200_000 // scale)
    bench_clean_cache(300_000 // scale)
    bench_scalable(200_000 // scale)
    bench_ttl(100_000 // scale)
    bench_persistent(2000 // scale, 100_000)


if __name__ == "__main__":
    main()
