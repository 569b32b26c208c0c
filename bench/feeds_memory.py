"""Peak RSS and time of the Python side of a 1% churn refresh at N entries, without the
database (so 10M entries take a minute, not the first load's write): a first read is
staged and resolved and its memo saved, then a churned body (bench/feeds.py's lines)
is staged against that memo and the first read's keys as the listing, resolved, the
memo merged and the diff taken, each as refresh_source does (in partitions above
urlguard.feeds.partitions.PARTITION_ENTRIES). VmHWM is reset before the churn, so the
peak is the churn's own.

    .venv/bin/python bench/feeds_memory.py [--entries 10000000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def status(field: str) -> int:
    """A /proc/self/status figure in MB (VmRSS, VmHWM)."""
    with open("/proc/self/status") as lines:
        for line in lines:
            if line.startswith(field + ":"):
                return int(line.split()[1]) // 1024
    return 0


def write_feed(path: Path, ids: range | list[int]) -> None:
    with path.open("w") as out:
        for i in ids:
            out.write(f"http://host{i}.bench-feed{i % 977}.example/path/{i}/x.html\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--entries", type=int, default=10_000_000)
    n = parser.parse_args().entries
    folder = Path(tempfile.mkdtemp(prefix="urlguard-feeds-memory-"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "urlguard_service.settings")
    os.environ["URLGUARD_VAR_DIR"] = str(folder / "var")  # the memo is saved there
    import django
    from django.conf import settings

    django.setup()
    settings.URLGUARD = {**settings.URLGUARD, "FEED_MAX_ENTRIES": 4 * n, "FEED_MAX_BYTES": 1 << 40}
    import numpy as np

    from urlguard.feeds import partitions, staging
    from urlguard.feeds.outcome import RefreshResult
    from urlguard.feeds.refresh import _give_back_memory, _stage
    from urlguard.models import Source
    from urlguard.writepath import allowlist

    def stage(listed: np.ndarray) -> tuple[staging.Staged, object]:
        """The feed staged as refresh_source stages it (the memo saved as "bench")."""
        result = RefreshResult(source="bench")
        with feed.open("rb") as body:
            size = partitions.estimate(body, feed.stat().st_size)
            with staging.opened(body, source, result) as text:
                return _stage(text, source, result, "bench", listed, size)

    try:
        feed = folder / "feed.txt"
        write_feed(feed, range(n))
        source = Source(name="bench", kind="feed", url="file:///bench", format="urls")
        source.pk = 1
        protected = allowlist.Allowlist({})
        baseline = status("VmRSS")
        started, cpu = time.perf_counter(), time.process_time()
        first, _ = stage(np.zeros(0, dtype=np.int64))
        first.resolve(protected, RefreshResult(source="bench"))
        first_peak = status("VmHWM")
        first.remember(source.pk, "bench", None)  # as a first load saves its memo
        save_peak = status("VmHWM")
        if isinstance(first, partitions.Partitioned):
            listed = first.sorted_keys()
        else:
            listed = first.unique_keys.copy()
        first.close()
        del first
        _give_back_memory()
        first_s, first_cpu = time.perf_counter() - started, time.process_time() - cpu
        parts = partitions.partitions_for(len(listed))
        held = (len(listed) * 4 * 8) >> 20
        before = status("VmRSS")
        churn = n // 100
        write_feed(feed, [*range(churn, n), *range(n, n + churn)])
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        started, cpu = time.perf_counter(), time.process_time()
        staged, remembered = stage(listed)
        del listed  # as refresh_source lets it go (a Staged keeps it)
        read_peak = status("VmHWM")
        staged.resolve(protected, RefreshResult(source="bench"))
        resolve_peak = status("VmHWM")
        staged.remember(source.pk, "bench", remembered)  # type: ignore[arg-type]
        remember_peak = status("VmHWM")
        del remembered
        gone = len(staged.diff().gone)
        churn_s, churn_cpu = time.perf_counter() - started, time.process_time() - cpu
        load = os.getloadavg()
        print(f"{n:,} entries; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        print(
            f"RSS: Django {baseline} MB; memo + listing {held} MB (whole); before the churn "
            f"{before} MB; {parts} partition(s)"
        )
        print(
            f"first read (stage + resolve + memo) {first_s:.1f} s ({first_cpu:.1f} s of CPU), "
            f"peak RSS {first_peak} MB, "
            f"{save_peak} MB once its memo is saved"
        )
        print(
            f"1% churn: {churn_s:.2f} s ({churn_cpu:.2f} s of CPU; {staged.known:,} known, "
            f"{len(staged) - staged.known:,} normalized, {gone:,} gone); peak RSS after "
            f"reading {read_peak} MB, resolving {resolve_peak} MB, "
            f"saving the memo {remember_peak} MB, "
            f"at the end {status('VmHWM')} MB"
        )
        staged.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
