"""Injecting a fault into one call of a function the code under test calls."""

from __future__ import annotations

from typing import Any


def fail_on_call(monkeypatch: Any, owner: object, name: str, call: int, error: Exception) -> None:
    """`owner.name` raises `error` on its `call`-th call (from 1) and works as before on
    every other, for the rest of the test."""
    real = getattr(owner, name)
    calls = 0

    def failing(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == call:
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, failing)
