"""Where the scaling filter's time goes, and whether a blocked counter layout would pay.

    .venv/bin/python bench/layouts.py [--rates 0.001,0.01] [--keys 1000000] [--repeat 3]

Two tables per error rate, CPU time (``process_time``), best of ``--repeat``, all
in one process (the machine is shared: only ratios within one run mean anything):

1. **Where the time goes** in ``add_many`` (one stage sized for all keys, chunks of
   100,000 keys as bench/engine.py adds them) and in one ``contains``. The add
   rows time the steps of ``counters._add_part`` one by one on a replica of it
   (same operations, same order; a timer between steps), the contains rows call
   the library's own pieces (``FileView.check_file``, the hash, ``lookup.probe``)
   on a read-only file.
2. **A blocked layout, prototyped**: every key's k counters of a stage in one
   64-byte block (128 4-bit counters; even probes in low nibbles, odd probes in
   high ones, each at a byte given by 6 bits of h2 (then h1); the block by
   multiply-shift of h1's top 32 bits), sized with the textbook model of a blocked
   filter (the load per block is Poisson) at the error rate the current planner
   gives a one-stage file. Batch add (keys whose blocks repeat in a chunk are
   taken in rounds, so a round's gathers and scatters never collide), batch
   lookups and one lookup in pure Python (with the one lseek a mapped file's size
   check costs), in memory (a mapped file's resident pages cost the same),
   against the current layout (a real file) and fastbloom-rs, with bytes per key
   and the measured false-positive rate.

The prototype is not the file format; it answers "would it pay" before one pays for
a format version.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from engine import table, url_keys

from filterengine import ScalingCountingBloomFilter
from filterengine import fileformat as ff
from filterengine.counters import _add_counted
from filterengine.hashing import _hash_bytes, _hashable_keys, hash_pairs, hash_tuple
from filterengine.lookup import probe
from filterengine.scaling import DEFAULT_GROWTH, DEFAULT_TIGHTENING

CHUNK = 100_000
PART = 65_535  # counters._PART


def cpu(fn: Callable[[], object]) -> float:
    gc.collect()
    start = time.process_time()
    fn()
    return time.process_time() - start


# -- 1. where the time goes ---------------------------------------------------------
def add_steps(keys: list[str], rate: float) -> tuple[dict[str, float], int]:
    """Seconds per step of adding ``keys`` to a one-stage array, as counters does."""
    header = ff.make_header(
        len(keys), rate, DEFAULT_GROWTH, DEFAULT_TIGHTENING, seed=0, generation=1
    )
    entry = ff.stage_plan(header, 0, 0)
    k, cells = entry.k, entry.cells
    array = np.zeros(entry.nbytes, np.uint8)
    scratch = np.empty(cells, dtype=np.uint16)
    modulus = np.uint64(cells)
    spent: dict[str, float] = {}
    clock = time.process_time

    def tick(label: str, since: float) -> float:
        now = clock()
        spent[label] = spent.get(label, 0.0) + now - since
        return now

    gc.collect()
    for at in range(0, len(keys), CHUNK):
        t = clock()
        hashable = _hashable_keys(keys[at : at + CHUNK])
        t = tick("hash: ASCII check of the keys", t)
        digests = np.fromiter(map(_hash_bytes, hashable), dtype="S16", count=len(hashable))
        t = tick("hash: mmh3 per key into one array", t)
        pairs = digests.view("<u8").reshape(-1, 2)
        for part in range(0, len(pairs), PART):
            h1, h2 = pairs[part : part + PART, 0], pairs[part : part + PART, 1]
            order = np.arange(len(h1), dtype=np.uint16)
            x, step = h1 % modulus, h2 % modulus
            t = tick("positions (double hashing)", t)
            for i in range(k):
                if i:
                    y = x + step
                    x = np.minimum(y, y - modulus)
                    t = tick("positions (double hashing)", t)
                xi = x.view(np.int64)
                region = array[(i >> 1) * cells : ((i >> 1) + 1) * cells]
                scratch[xi] = order
                sole = scratch[xi] == order
                t = tick("repeated positions: scatter + gather key numbers", t)
                v = region[xi]
                t = tick("counters: gather", t)
                if i & 1:
                    v = v + ((v < np.uint8(0xF0)).view(np.uint8) << np.uint8(4))
                else:
                    v = v + ((v & np.uint8(0x0F)) != np.uint8(0x0F)).view(np.uint8)
                t = tick("counters: saturating increment", t)
                region[xi] = v
                t = tick("counters: scatter", t)
                if not sole.all():
                    _add_counted(region, i & 1, xi[~sole])
                t = tick("repeated positions: counted exactly", t)
    return spent, k


def contains_steps(path: str, present: list[str], absent: list[str]) -> dict[str, float]:
    """Seconds per call of the pieces of one contains, on a read-only file."""
    r = ScalingCountingBloomFilter.open(path, readonly=True)
    view = r._view
    out = {}
    sample = present + absent
    out["file check (lseek + header words)"] = cpu(lambda: [view.check_file(path) for _ in sample])
    out["  of which lseek alone"] = cpu(lambda: [os.lseek(view.fd, 0, os.SEEK_END) for _ in sample])
    out["  a syscall that does nothing (getpid)"] = cpu(lambda: [os.getpid() for _ in sample])
    out["hash (encode + mmh3)"] = cpu(lambda: [hash_tuple(key.encode(), 0) for key in sample])
    out["probe, absent key"] = cpu(lambda: [probe(view, key) for key in absent]) * 2
    out["probe, present key"] = cpu(lambda: [probe(view, key) for key in present]) * 2
    out["whole contains, mean of both"] = cpu(lambda: [r.contains(key) for key in sample])
    r.close()
    return {label: seconds / len(sample) for label, seconds in out.items()}


# -- 2. the blocked prototype -----------------------------------------------------------
_INC = (
    (np.minimum((np.arange(256) & 15) + 1, 15) | (np.arange(256) & 0xF0)).astype(np.uint8),
    ((np.minimum((np.arange(256) >> 4) + 1, 15) << 4) | (np.arange(256) & 15)).astype(np.uint8),
)
_MASKS = (np.uint8(0x0F), np.uint8(0xF0))
_ROUND = 16_384  # keys per round of the blocked add: their blocks' lines stay in cache


def blocked_fpr(per_block: float, k: int, cells: int = 128) -> float:
    """False-positive rate of a blocked filter with Poisson(per_block) keys per block."""
    total = 0.0
    for i in range(int(per_block * 6 + 60)):
        weight = math.exp(-per_block + i * math.log(per_block) - math.lgamma(i + 1))
        total += weight * (1 - (1 - 1 / cells) ** (i * k)) ** k
    return total


def plan_blocked(n: int, rate: float) -> tuple[int, int]:
    """(k, blocks) with fewest blocks whose modelled rate is within ``rate``."""
    best: tuple[int, int] | None = None
    for k in range(2, 17, 2):
        low, high = 0.01, 200.0
        if blocked_fpr(low, k) > rate:
            continue
        for _ in range(50):
            mid = (low + high) / 2
            low, high = (mid, high) if blocked_fpr(mid, k) <= rate else (low, mid)
        blocks = math.ceil(n / low)
        if best is None or blocks < best[1]:
            best = (k, blocks)
    assert best is not None
    return best


def _block_starts(h1: np.ndarray, blocks: int) -> np.ndarray:
    return ((((h1 >> np.uint64(32)) * np.uint64(blocks)) >> np.uint64(32)) << np.uint64(6)).view(
        np.int64
    )


def _byte(h1: np.ndarray, h2: np.ndarray, i: int) -> np.ndarray:
    bits = h2 >> np.uint64(6 * i) if i < 10 else h1 >> np.uint64(6 * (i - 10))
    return (bits & np.uint64(63)).view(np.int64)


def blocked_add(array: np.ndarray, blocks: int, k: int, h1: np.ndarray, h2: np.ndarray) -> None:
    scratch = np.empty(blocks, np.uint32)
    for at in range(0, len(h1), _ROUND):
        a1, a2 = h1[at : at + _ROUND], h2[at : at + _ROUND]
        start = _block_starts(a1, blocks)
        todo = np.arange(len(a1), dtype=np.uint32)
        while len(todo):
            block = start[todo] >> 6
            scratch[block] = todo
            first = scratch[block] == todo
            rows = todo if first.all() else todo[first]
            todo = todo[~first]
            base, r1, r2 = start[rows], a1[rows], a2[rows]
            for i in range(k):
                at_byte = base + _byte(r1, r2, i)
                array[at_byte] = np.take(_INC[i & 1], np.take(array, at_byte))


def blocked_lookup(array: np.ndarray, blocks: int, k: int, keys: list[str]) -> np.ndarray:
    h1, h2 = hash_pairs(keys)
    base = _block_starts(h1, blocks)
    result = np.ones(len(keys), dtype=bool)
    alive = np.arange(len(keys))
    for i in range(k):
        hit = np.take(array, base + _byte(h1, h2, i)) & _MASKS[i & 1] != 0
        if hit.all():
            continue
        result[alive[~hit]] = False
        alive, h1, h2, base = alive[hit], h1[hit], h2[hit], base[hit]
    return result


def blocked_one(buf: memoryview, blocks: int, k: int, fd: int) -> Callable[[str], bool]:
    """One lookup in pure Python: the probes unrolled, as a tuned scalar path would be,
    after the size check a mapped file needs (one lseek of ``fd``, compared)."""
    if k not in (8, 10, 12):
        raise ValueError(f"the scalar prototype unrolls k of 8, 10 or 12, not {k}")
    limit = len(buf)
    lseek = os.lseek

    def one(key: str) -> bool:
        if lseek(fd, 0, 2) < limit:
            raise ValueError("truncated")
        h1, h2 = hash_tuple(key.encode(), 0)
        base = ((h1 >> 32) * blocks >> 32) << 6
        low = h2 & 0x3FFFFFFF
        if not buf[base + (low & 63)] & 0x0F:
            return False
        if not buf[base + (low >> 6 & 63)] & 0xF0:
            return False
        if not buf[base + (low >> 12 & 63)] & 0x0F:
            return False
        if not buf[base + (low >> 18 & 63)] & 0xF0:
            return False
        if not buf[base + (low >> 24 & 63)] & 0x0F:
            return False
        high = h2 >> 30
        if not buf[base + (high & 63)] & 0xF0:
            return False
        if not buf[base + (high >> 6 & 63)] & 0x0F:
            return False
        if not buf[base + (high >> 12 & 63)] & 0xF0:
            return False
        if k == 8:
            return True
        if not buf[base + (high >> 18 & 63)] & 0x0F:
            return False
        if not buf[base + (high >> 24 & 63)] & 0xF0:
            return False
        if k == 10:
            return True
        rest = h1 & 0xFFFFFFFF
        if not buf[base + (rest & 63)] & 0x0F:
            return False
        return bool(buf[base + (rest >> 6 & 63)] & 0xF0)

    return one


def compare_layouts(
    keys: list[str], present: list[str], absent: list[str], rate: float, repeat: int, tmp: str
) -> tuple[list[list[str]], str]:
    import fastbloom_rs

    n = len(keys)
    stage_rate = ff.stage_plan(
        ff.make_header(n, rate, DEFAULT_GROWTH, DEFAULT_TIGHTENING, seed=0, generation=1), 0, 0
    ).error_rate
    k, blocks = plan_blocked(n, stage_rate)
    ids = np.arange(n, dtype=np.int64)
    one_sample = present[:50_000], absent[:50_000]
    best: dict[str, float] = {}

    def keep(label: str, seconds: float, count: int) -> None:
        best[label] = min(best.get(label, math.inf), seconds / count * 1e9)

    def mean_one(fn: Callable[[str], object]) -> float:
        return sum(cpu(lambda s=s: [fn(key) for key in s]) for s in one_sample)

    for _ in range(repeat):
        path = os.path.join(tmp, "current.bin")
        if os.path.exists(path):
            os.unlink(path)
        f = ScalingCountingBloomFilter.create(path, capacity=n, error_rate=rate)

        def add_current(f: ScalingCountingBloomFilter = f) -> None:
            for at in range(0, n, CHUNK):
                f.add_many(keys[at : at + CHUNK], ids[at : at + CHUNK])

        keep("current add", cpu(add_current), n)
        keep("current present", cpu(lambda f=f: f.contains_many(present)), len(present))
        keep("current absent", cpu(lambda f=f: f.contains_many(absent)), len(absent))
        keep("current one", mean_one(f.contains), 100_000)
        current_fpr = float(f.contains_many(absent).mean())
        current_bytes = f.nbytes / n
        f.close()

        array = np.zeros(blocks * 64, np.uint8)

        def add_blocked(array: np.ndarray = array) -> None:
            for at in range(0, n, CHUNK):
                h1, h2 = hash_pairs(keys[at : at + CHUNK])
                blocked_add(array, blocks, k, h1, h2)

        keep("blocked add", cpu(add_blocked), n)
        keep(
            "blocked present",
            cpu(lambda a=array: blocked_lookup(a, blocks, k, present)),
            len(present),
        )
        keep(
            "blocked absent", cpu(lambda a=array: blocked_lookup(a, blocks, k, absent)), len(absent)
        )
        guard = os.path.join(tmp, "blocked.bin")
        with open(guard, "wb") as fh:
            fh.truncate(len(array))
        fd = os.open(guard, os.O_RDONLY)
        one = blocked_one(memoryview(array), blocks, k, fd)
        keep("blocked one", mean_one(one), 100_000)
        assert blocked_lookup(array, blocks, k, present).all(), "a false negative"
        assert [one(key) for key in absent[:20_000]] == blocked_lookup(
            array, blocks, k, absent[:20_000]
        ).tolist(), "the scalar and batch prototypes disagree"
        blocked_fpr_measured = float(blocked_lookup(array, blocks, k, absent).mean())
        os.close(fd)

        b = fastbloom_rs.FilterBuilder(n, rate).build_counting_bloom_filter()
        keep("fastbloom-rs add", cpu(lambda b=b: b.add_str_batch(keys)), n)
        keep("fastbloom-rs present", cpu(lambda b=b: b.contains_str_batch(present)), len(present))
        keep("fastbloom-rs absent", cpu(lambda b=b: b.contains_str_batch(absent)), len(absent))
        keep("fastbloom-rs one", mean_one(b.contains_str), 100_000)
        fast_fpr = sum(b.contains_str_batch(absent)) / len(absent)
        fast_bytes = len(b.get_bytes()) / n

    rows = []
    for name, label, fpr, per_key in (
        ("current layout (k slices, 1 stage)", "current", current_fpr, current_bytes),
        (
            f"blocked prototype (k={k}, {blocks:,} blocks)",
            "blocked",
            blocked_fpr_measured,
            blocks * 64 / n,
        ),
        ("fastbloom-rs", "fastbloom-rs", fast_fpr, fast_bytes),
    ):
        cells = [name]
        for what in ("add", "present", "absent", "one"):
            ours, peer = best[f"{label} {what}"], best[f"fastbloom-rs {what}"]
            if what == "one":
                cells.append(f"{ours / 1000:.2f} µs ({ours / peer:.2f}× its cost)")
            else:
                cells.append(f"{ours:.0f} ns ({peer / ours:.2f}×)")
        cells += [f"{per_key:.2f}", f"{fpr * 100:.3f}%"]
        rows.append(cells)
    note = (
        f"planned stage rate {stage_rate:g}; the blocked model sized for it, measured "
        f"{blocked_fpr_measured / stage_rate:.2f}× it"
    )
    return rows, note


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--rates", default="0.001,0.01")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n = args.keys
    keys = url_keys(n, "host")
    present = keys[:: max(1, n // 200_000)][:200_000]
    absent = url_keys(min(n, 200_000), "nohost")
    print(f"{n:,} keys, {os.cpu_count()} CPUs, load average {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        for rate in (float(r) for r in args.rates.split(",")):
            best: dict[str, float] = {}
            for _ in range(args.repeat):
                spent, k = add_steps(keys, rate)
                if sum(spent.values()) < sum(best.values()) or not best:
                    best = spent
            print(
                f"\nError rate {rate:g}: where add_many's time goes (one stage, k={k}), ns per key:"
            )
            rows = [[label, f"{s / n * 1e9:.0f}"] for label, s in best.items()]
            rows.append(["total", f"{sum(best.values()) / n * 1e9:.0f}"])
            print(table(["step", "ns per key"], rows))

            path = os.path.join(tmp, "steps.bin")
            with ScalingCountingBloomFilter.create(path, capacity=n, error_rate=rate) as f:
                f.add_many(keys, np.arange(n, dtype=np.int64))
            steps: dict[str, float] = {}
            for _ in range(args.repeat):
                for label, s in contains_steps(path, present[:50_000], absent[:50_000]).items():
                    steps[label] = min(steps.get(label, math.inf), s)
            os.unlink(path)
            print(
                f"\nError rate {rate:g}: one contains, ns per call (load {os.getloadavg()[0]:.2f}):"
            )
            print(table(["piece", "ns"], [[label, f"{s * 1e9:.0f}"] for label, s in steps.items()]))

            rows, note = compare_layouts(keys, present, absent, rate, args.repeat, tmp)
            print(
                f"\nError rate {rate:g}: layouts, CPU ns per key (× fastbloom-rs's speed; "
                f"'one contains' × its cost), load {os.getloadavg()[0]:.2f}; {note}:"
            )
            headers = ["layout", "add", "present", "absent", "one contains", "bytes/key", "FPR"]
            print(table(headers, rows))


if __name__ == "__main__":
    main()
