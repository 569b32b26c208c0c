"""urlguard.runtime.outage: an outage logged once with its traceback, then a count at
most once a minute, then its recovery, whatever the number of failures."""

from __future__ import annotations

import logging
import threading

from urlguard.runtime.outage import OutageLog


def outage_log(caplog):
    now = [100.0]
    log = OutageLog(logging.getLogger("test.outage"), "the database", clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="test.outage")
    return log, now


def test_an_outage_is_one_line_with_its_traceback_then_a_count_a_minute_then_its_end(caplog):
    log, now = outage_log(caplog)
    log.recovered()  # nothing wrong: nothing said
    assert caplog.records == []
    for _ in range(400):
        log.failed(ConnectionError("connection refused\n\tIs the server running?"))
    (first,) = caplog.records
    assert first.levelno == logging.ERROR and first.exc_info is not None
    assert first.getMessage() == (
        "the database failed: ConnectionError: connection refused Is the server running?"
    )
    now[0] += 60
    log.failed(ConnectionError("connection refused"))
    log.failed(ConnectionError("connection refused"))  # within the minute: counted
    assert len(caplog.records) == 2
    assert caplog.records[1].getMessage() == (
        "the database still failing after 60 s: 400 more failure(s) since the last report"
        " (ConnectionError: connection refused)"
    )
    assert caplog.records[1].exc_info is None
    now[0] += 30
    log.recovered()
    log.recovered()
    assert [r.getMessage() for r in caplog.records[2:]] == [
        "the database works again after 90 s (402 failure(s) in all)"
    ]
    assert caplog.records[2].levelno == logging.WARNING
    log.failed(OSError("again"))  # a new outage is told again, traceback and all
    assert caplog.records[3].getMessage() == "the database failed: OSError: again"


def test_failures_from_many_threads_are_one_outage(caplog):
    log, _now = outage_log(caplog)
    threads = [
        threading.Thread(target=lambda: [log.failed(OSError("down")) for _ in range(100)])
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    log.recovered()
    assert [r.getMessage() for r in caplog.records] == [
        "the database failed: OSError: down",
        "the database works again after 0 s (800 failure(s) in all)",
    ]
