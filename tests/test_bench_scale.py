"""bench/scale.py's own arithmetic: sizes as typed, the table's ratios between sizes,
and a part past its time limit shown as such (never as a figure or a ratio)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def scale():
    spec = importlib.util.spec_from_file_location("bench_scale", ROOT / "bench" / "scale.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("text", "n"),
    [("100k", 100_000), ("1M", 1_000_000), ("10m", 10_000_000), ("2.5M", 2_500_000),
     ("5000", 5000), ("1_000", 1000)],
)  # fmt: skip
def test_sizes_are_read_as_typed(scale, text, n):
    assert scale.parse_size(text) == n


def test_size_labels(scale):
    assert [scale.size_label(n) for n in (100_000, 1_000_000, 10_000_000, 1234)] == [
        "100k",
        "1M",
        "10M",
        "1,234",
    ]


def rows_of(text: str) -> dict[str, list[str]]:
    lines = text.splitlines()
    return {
        cells[0]: cells[1:]
        for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:])
    }


def test_ratios_between_consecutive_sizes(scale):
    runs = [
        {"rebuild": 0.5, "bytes": 1_000_000, "check_median": 20.0},
        {"rebuild": 5.0, "bytes": 10_000_000, "check_median": 21.0},
        {"rebuild": 60.0, "bytes": 100_000_000, "check_median": 42.0},
    ]
    table = scale.table([100_000, 1_000_000, 10_000_000], runs)
    head = table.splitlines()[0]
    assert "| 1M/100k | 10M/1M |" in head
    rows = rows_of(table)
    assert rows["rebuild_filter, s"][:5] == ["0.5", "5.0", "60.0", "10.00×", "12.00×"]
    assert rows["rebuild_filter, s"][-1] == "≤ 12×"
    assert rows["filter file, bytes per rule"][:5] == ["10.00", "10.00", "10.00", "1.00×", "1.00×"]
    assert rows["Guard.check, clean URL, median µs"][3:] == ["1.05×", "2.00×", "flat", "≤ 1.5×"]
    # No figure measured at any size: no row.
    assert "verify_filter, s" not in rows


def test_a_part_past_its_limit_is_shown_as_a_timeout(scale):
    runs = [
        {"feed": {"first": {"seconds": 10.0}}},
        {"feed": {"first": {"seconds": 100.0}}},
        {"feed": {"first": scale.Timeout("timeout after 900 s")}},
    ]
    rows = rows_of(scale.table([100_000, 1_000_000, 10_000_000], runs))
    assert rows["feed first load, s"][:5] == [
        "10.0",
        "100.0",
        "timeout after 900 s",
        "10.00×",
        "—",
    ]


def test_time_limit_interrupts_a_part(scale):
    results: dict = {}

    def forever():
        while True:
            pass

    assert scale.timed_part(results, "verify", 0.05, forever) is None
    assert str(results["verify"]).startswith("timeout after ")
    assert scale.timed_part(results, "rebuild", 5, lambda: 42) == 42
    assert "rebuild" not in results


def test_ratios_to_1m_beside_consecutive_ones_with_targets_for_the_sizes(scale):
    runs = [
        {"feed": {"first": {"seconds": 10.0}}, "rebuild": 2.0},
        {"feed": {"first": {"seconds": 45.0}}, "rebuild": 8.0},
        {"feed": {"first": {"seconds": 130.0}}, "rebuild": 20.0},
    ]
    table = scale.table([1_000_000, 4_000_000, 10_000_000], runs)
    assert (
        "| 4M/1M | 10M/4M | 10M/1M | should grow | target (4M/1M, 10M/1M) |"
        in (table.splitlines()[0])
    )
    rows = rows_of(table)
    assert rows["feed first load, s"] == [
        "10.0", "45.0", "130.0", "4.50×", "2.89×", "13.00×", "× size", "≤ 4.8× / ≤ 12×"
    ]  # fmt: skip
    assert rows["rebuild_filter, s"][3:6] == ["4.00×", "2.50×", "10.00×"]


def test_feed_times_are_shown_per_floor_of_the_same_size(scale):
    runs = [
        {"feed": {"floor": {"seconds": 2.5}, "first": {"seconds": 10.0},
                  "churn": {"seconds": 0.5}}},
        {"feed": {"floor": scale.Timeout("timeout after 900 s")}},
    ]  # fmt: skip
    rows = rows_of(scale.table([1_000_000, 10_000_000], runs))
    assert rows["feed floor: psql \\copy of the lines, s"][:2] == ["2.5", "timeout after 900 s"]
    assert rows["feed first load, × floor"] == ["4.00", "—", "—", "flat", "≤ 4× (1M)"]
    assert rows["feed 1% churn, × floor"] == ["0.200", "—", "—", "flat", "≤ 0.25×"]


def test_a_shuffled_feed_holds_each_line_once_in_an_order_fixed_by_its_size(scale):
    shuffled = list(scale.feed_ids(250_000, shuffled=True))
    assert sorted(shuffled) == list(range(250_000))
    assert shuffled != sorted(shuffled)
    assert shuffled == list(scale.feed_ids(250_000, shuffled=True))
    assert list(scale.feed_ids(5, shuffled=False)) == [0, 1, 2, 3, 4]
