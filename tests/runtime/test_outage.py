"""OutageLog: a failure repeated every second is one line with its traceback, then a
count a minute, then one line when it recovers (an injected clock, no waiting)."""

from __future__ import annotations

import logging

from urlguard.runtime.outage import OutageLog

LOGGER = "urlguard.tests.outage"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def records(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER]


def test_an_outage_is_logged_once_then_counted_a_minute_then_its_recovery(caplog):
    caplog.set_level(logging.INFO, LOGGER)
    clock = Clock()
    log = OutageLog(logging.getLogger(LOGGER), "writing statistics", clock=clock)
    log.recovered()  # nothing failed: nothing said
    assert not records(caplog) and not log.failing
    for second in range(150):  # a failure a second for two and a half minutes
        clock.now = 1000.0 + second
        log.failed(ConnectionRefusedError(f"refused #{second}"))
    lines = records(caplog)
    assert len(lines) == 3
    first, *counts = lines
    assert first.levelno == logging.ERROR and first.exc_info is not None
    assert first.getMessage().startswith("writing statistics failed: ConnectionRefusedError: ")
    assert [c.exc_info for c in counts] == [None, None]
    still = "writing statistics still failing: 60 more failure(s) in the last 60 s, 60 s in all"
    assert counts[0].getMessage().startswith(still)
    assert "(last: ConnectionRefusedError: refused #120)" in counts[1].getMessage()
    assert log.failing
    clock.now = 1200.0
    log.recovered()
    log.recovered()
    *_, back = records(caplog)
    assert len(records(caplog)) == 4
    assert back.getMessage() == "writing statistics works again after 200 s and 150 failure(s)"
    assert not log.failing
    # A second outage is logged anew.
    log.failed(OSError("disk full"))
    assert records(caplog)[-1].getMessage().startswith("writing statistics failed: OSError: ")
