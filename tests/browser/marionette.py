"""A small client of Firefox's Marionette protocol (the WebDriver commands over TCP,
each message `length:json`): enough to drive a headless Firefox in the tests."""

from __future__ import annotations

import contextlib
import json
import socket
from typing import Any


class MarionetteError(RuntimeError):
    pass


class Marionette:
    def __init__(self, port: int, timeout: float = 30.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buffer = b""
        self.next_id = 0
        self._read()  # the server's greeting
        self.command("WebDriver:NewSession", {"capabilities": {}})

    def _read(self) -> Any:
        while b":" not in self.buffer:
            self._fill()
        length, _, rest = self.buffer.partition(b":")
        size = int(length)
        self.buffer = rest
        while len(self.buffer) < size:
            self._fill()
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return json.loads(data)

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise MarionetteError("Firefox closed the connection")
        self.buffer += chunk

    def command(self, name: str, params: dict[str, Any] | None = None) -> Any:
        self.next_id += 1
        data = json.dumps([0, self.next_id, name, params or {}]).encode()
        self.sock.sendall(str(len(data)).encode() + b":" + data)
        while True:
            kind, message_id, error, result = self._read()
            if kind == 1 and message_id == self.next_id:
                break
        if error:
            raise MarionetteError(f"{name}: {error.get('error')}: {error.get('message')}")
        return result

    def script(self, source: str, *args: Any, chrome: bool = False) -> Any:
        self.command("Marionette:SetContext", {"value": "chrome" if chrome else "content"})
        result = self.command("WebDriver:ExecuteScript", {"script": source, "args": list(args)})
        return result.get("value") if isinstance(result, dict) else result

    def navigate(self, url: str) -> None:
        self.command("Marionette:SetContext", {"value": "content"})
        try:
            self.command("WebDriver:Navigate", {"url": url})
        except MarionetteError as exc:
            # An error page (Firefox's block page among them) still loads.
            if "about:" not in str(exc) and "Reached error page" not in str(exc):
                raise

    def close(self) -> None:
        with contextlib.suppress(OSError, MarionetteError):
            self.command("Marionette:Quit", {"flags": ["eForceQuit"]})
        self.sock.close()
