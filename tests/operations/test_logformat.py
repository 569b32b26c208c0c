"""The app's log lines: every 5xx reaches the log with its traceback (django.request
is configured), and URLGUARD LOG_JSON makes each line one JSON object with the node."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from urlguard.operations.logformat import Formatter
from urlguard_service import views

pytestmark = pytest.mark.django_db


@pytest.fixture
def log_output() -> Iterator[io.StringIO]:
    """What the configured handlers of settings.LOGGING write (for both loggers)."""
    handlers = {
        h
        for name in ("urlguard", "django.request")
        for h in logging.getLogger(name).handlers
        if isinstance(h.formatter, Formatter)
    }
    assert handlers, "settings.LOGGING configures no stream handler"
    stream = io.StringIO()
    old = {h: h.setStream(stream) for h in handlers}
    yield stream
    for handler, previous in old.items():
        handler.setStream(previous)


@pytest.fixture
def failing_view(client, monkeypatch):
    """The home page raises (any view would do: it is Django's handling that counts)."""

    def explode(*args, **kwargs):
        raise RuntimeError("the database is gone")

    monkeypatch.setattr(views, "render", explode)
    client.raise_request_exception = False
    return client


def test_a_500_is_logged_with_its_traceback(failing_view, log_output):
    assert failing_view.get("/").status_code == 500
    text = log_output.getvalue()
    assert "ERROR django.request: Internal Server Error: /" in text
    assert "Traceback (most recent call last)" in text
    assert "RuntimeError: the database is gone" in text


def test_4xx_stay_out_of_the_log(client, log_output):
    assert client.get("/api/check").status_code == 400
    assert log_output.getvalue() == ""


def test_json_lines_carry_the_node(failing_view, log_output, settings):
    settings.URLGUARD = {**settings.URLGUARD, "LOG_JSON": True, "NODE_NAME": "node-7"}
    assert failing_view.get("/").status_code == 500
    logging.getLogger("urlguard.nodesync.sync").warning("filter %s is %s", "f.bin", "stale")
    lines = log_output.getvalue().splitlines()
    assert len(lines) == 2, lines  # one object per line, the traceback inside it
    error, warning = (json.loads(line) for line in lines)
    assert error["level"] == "ERROR" and error["logger"] == "django.request"
    assert error["node"] == "node-7" and error["status"] == 500 and error["path"] == "/"
    assert "RuntimeError: the database is gone" in error["exception"]
    assert warning == {
        "time": warning["time"],
        "level": "WARNING",
        "logger": "urlguard.nodesync.sync",
        "message": "filter f.bin is stale",
        "node": "node-7",
        "pid": warning["pid"],
    }
    assert warning["time"].endswith("+00:00")
