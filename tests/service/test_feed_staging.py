"""urlguard.feeds.staging: a body's units read back from the spool, close together
or scattered."""

from __future__ import annotations

import numpy as np
import pytest

from urlguard.feeds import staging


@pytest.mark.parametrize("span_bytes", [1 << 23, 8])
def test_units_read_back_are_the_lines_staged(monkeypatch, span_bytes):
    monkeypatch.setattr(staging, "_SPAN_UNITS", 3)
    monkeypatch.setattr(staging, "_SPAN_BYTES", span_bytes)  # 8: each unit on its own
    lines = [f"http://h{i}.example/{'x' * i}\n" for i in range(10)] + ["caf\u00e9.example\n"]
    staged = staging.Staged("urls", "spam")
    try:
        staged.add_lines(enumerate(lines, start=1))
        staged.finish()
        staged.units.flush()
        ends = staged.ends
        wanted = np.array([0, 2, 3, 4, 9, 10], dtype=np.int64)
        got = list(staged._texts(wanted, ends))
        assert got == [(i, lines[i].rstrip("\n")) for i in wanted.tolist()]
        assert list(staged._texts(np.zeros(0, dtype=np.int64), ends)) == []
    finally:
        staged.close()
