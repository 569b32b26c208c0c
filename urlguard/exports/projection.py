"""The spam list at one change-log position: its rules (expression, category) in a
fixed order, the allowlisted hosts it exports as exceptions, the position (the head
ChangeEvent seq) and the time of that change. Every export renders one of these, so
two renders of the same position are the same bytes."""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import router
from django.db.models import Max

from urlguard.hotpath.canonical import split_expression
from urlguard.models import ChangeEvent, SpamRule, database
from urlguard.writepath import allowlist

__all__ = [
    "Position",
    "Snapshot",
    "current_position",
    "host_rule",
    "is_address",
    "parent_rules",
    "read_allowlist",
    "snapshot",
]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def read_allowlist() -> tuple[tuple[str, ...], datetime | None]:
    """The hosts the allowlist names (sorted) and when it last gained one: the one
    place exports read the allowlist."""
    rows = allowlist.in_force()
    hosts = tuple(sorted(set(rows.values_list("host", flat=True))))
    latest = rows.aggregate(m=Max("created"))["m"] if hosts else None
    return hosts, latest


@dataclass(frozen=True)
class Position:
    seq: int
    time: datetime
    allowlist: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """Names this projection: the log position (allowlist changes are rows of the
        log too), and the allowlist itself, which the log's rows before they were
        logged (and a table edited by hand) do not name."""
        digest = hashlib.blake2b("\n".join(self.allowlist).encode(), digest_size=4).hexdigest()
        return f"{self.seq}-{digest}"


def current_position() -> Position:
    seq = ChangeEvent.objects.head()
    allowlist, modified = read_allowlist()
    changed = ChangeEvent.objects.filter(seq=seq).values_list("created", flat=True).first()
    return Position(seq=seq, time=max(changed or EPOCH, modified or EPOCH), allowlist=allowlist)


def is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def host_rule(expression: str) -> str | None:
    """The host of a whole-host rule (`host/`: it and its subdomains), else None."""
    host, path = split_expression(expression)
    return host if path == "/" else None


def parent_rules(host: str) -> list[str]:
    """The whole-host rules that would block `host`: `host/` and each parent's."""
    labels = host.split(".")
    return [".".join(labels[i:]) + "/" for i in range(len(labels))]


@dataclass
class Snapshot:
    """One position and the means to read its rules. `consistent()` says whether
    the rules read belong to `position` (always, where the database gives a snapshot)."""

    position: Position
    exceptions: list[str]
    _using: str
    _snapshot: bool

    def rules(self, chunk_size: int = 20_000) -> Iterator[tuple[str, str]]:
        rows = SpamRule.objects.using(self._using).order_by("expression")
        yield from rows.values_list("expression", "category").iterator(chunk_size=chunk_size)

    def consistent(self) -> bool:
        if self._snapshot:
            return True
        return current_position() == self.position


def _exceptions(allowlist: tuple[str, ...], using: str) -> list[str]:
    """Allowlisted hosts the list itself does not block whole: exporting an exception
    for one it blocks (an admin's deliberate rule) would unblock what the guard blocks."""
    if not allowlist:
        return []
    wanted = {rule for host in allowlist for rule in parent_rules(host)}
    listed = set(
        SpamRule.objects.using(using)
        .filter(expression__in=sorted(wanted))
        .values_list("expression", flat=True)
    )
    return [h for h in allowlist if not listed.intersection(parent_rules(h))]


@contextmanager
def snapshot() -> Iterator[Snapshot]:
    """The current projection. On PostgreSQL one REPEATABLE READ transaction holds
    it still; elsewhere the caller renders and then asks `consistent()` (a change
    committed meanwhile moves the position: render again)."""
    using = router.db_for_read(SpamRule)
    with database.read_snapshot(using) as held:
        position = current_position()
        yield Snapshot(position, _exceptions(position.allowlist, using), using, held)
