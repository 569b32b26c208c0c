"""The log line format of the app's loggers (settings.LOGGING): plain text, or with
URLGUARD LOG_JSON one JSON object per line carrying the node name, for log shippers.

The choice is read per record rather than when logging is configured, so that
override_settings applies and a log line written before settings are ready is still
written (as plain text)."""

from __future__ import annotations

import json
import logging
import os
import socket
from datetime import UTC, datetime
from typing import Any

__all__ = ["Formatter"]


def _json_wanted() -> tuple[bool, str]:
    """(LOG_JSON, NODE_NAME), or (False, "") when settings cannot be read."""
    try:
        from urlguard.conf import conf  # here: LOGGING loads this module before settings exist

        return conf.LOG_JSON, conf.NODE_NAME
    except Exception:
        return False, ""


class Formatter(logging.Formatter):
    """`format` applies to plain lines; JSON lines always have the same keys:
    time (UTC, ISO 8601), level, logger, message, node, pid, and when present
    exception (the formatted traceback), status and path (django.request)."""

    def format(self, record: logging.LogRecord) -> str:
        wanted, node = _json_wanted()
        if not wanted:
            return super().format(record)
        data: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "node": node or socket.gethostname(),
            "pid": os.getpid(),
        }
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            data["exception"] = record.exc_text
        if record.stack_info:
            data["stack"] = self.formatStack(record.stack_info)
        status = getattr(record, "status_code", None)
        if status is not None:
            data["status"] = status
        request = getattr(record, "request", None)
        path = getattr(request, "path", None)
        if isinstance(path, str):
            data["path"] = path
        # default=str: a message argument that JSON cannot hold must not lose the line.
        return json.dumps(data, ensure_ascii=False, default=str)
