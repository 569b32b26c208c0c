"""Hosts that feeds may never block whole: every host on the allowlist (entered by a
person, or listed by an enabled allowlist feed), and each parent domain of one. A
feed's rule at domain or subdomain level (`host/`) on such a host is refused; a rule
on a path or page of it is accepted (URLhaus lists malware on big hosting platforms
that way). A person adding such a rule by hand gets a warning instead (see `warning`).

The allowlist acts at once: allowing a host withdraws, in one change set, every feed
listing it refuses (a rule a person or an import listed stays, and is reported), and
records each refused listing per feed (AllowlistRefusal), so that the feed's next
refresh, whether its server answers 304 or not, keeps it out; removing the host lists
those again at once."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db import router, transaction
from django.db.models import QuerySet

from urlguard.hotpath.canonical import split_expression
from urlguard.models import (
    Actor,
    AllowedHost,
    AllowlistRefusal,
    ChangeSet,
    RuleSource,
    Source,
    SpamRule,
    database,
    row_user,
)
from urlguard.writepath import changes
from urlguard.writepath.rules import RuleError, normalize_rule

__all__ = [
    "AllowResult",
    "Allowlist",
    "allow_host",
    "covering",
    "enforce",
    "host_of",
    "load",
    "record_refusals",
    "release",
    "unallow_host",
    "warning",
]


class Allowlist:
    """The protected hosts, loaded once per refresh: lookups are set membership."""

    def __init__(self, hosts: dict[str, str]):
        # host -> the allowlisted host (and its source) it protects
        self._protected: dict[str, str] = {}
        for host, why in sorted(hosts.items()):
            labels = host.split(".")
            for i in range(len(labels) - 1):
                parent = ".".join(labels[i:])
                self._protected.setdefault(parent, why if i == 0 else f"{why} (a parent of it)")
            self._protected.setdefault(host, why)

    def __len__(self) -> int:
        return len(self._protected)

    def digest(self) -> str:
        """Names the set of protected hosts (a memo made under another is stale)."""
        digest = hashlib.blake2b(digest_size=16)
        for host in sorted(self._protected):
            digest.update(host.encode("utf-8", "surrogatepass") + b"\n")
        return digest.hexdigest()

    def refusal(self, expression: str) -> str | None:
        """Why a feed may not list `expression` (None: it may)."""
        if not self._protected:
            return None
        host, path = split_expression(expression)
        if path != "/":
            return None
        why = self._protected.get(host)
        if why is None:
            return None
        return (
            f"{host}/ would block a whole host the allowlist protects: {why}; "
            "only rules on a path or page of it are accepted from feeds"
        )


def in_force() -> QuerySet[AllowedHost]:
    """The entries that protect their host now: a person's, and those of enabled
    allowlist feeds."""
    return AllowedHost.objects.in_force()


def load() -> Allowlist:
    rows = in_force()
    hosts: dict[str, str] = {}
    for host, source in rows.values_list("host", "source__name").iterator(chunk_size=5000):
        if source is None:
            hosts[host] = f"{host} is on the allowlist"
        else:
            hosts.setdefault(host, f"{host} is allowlisted by {source!r}")
    return Allowlist(hosts)


def warning(expression: str) -> str | None:
    """For a rule added by hand: the allowlist's objection, to show (not enforce)."""
    return load().refusal(expression)


# -- acting at once -------------------------------------------------------------------


def host_of(text: str) -> str:
    """The host `text` names (a host, or a URL pasted whole: its host), normalized as
    a rule's; RuleError if it is no host, or is an expression of a path or page (an
    allowlist names whole hosts)."""
    expression = normalize_rule(text)
    host, path = split_expression(expression)
    if path != "/" and "://" not in text:
        raise RuleError(
            f"{text.strip()[:200]!r} names a path or page; an allowlist names hosts (example.com)"
        )
    return host


def covering(host: str) -> list[str]:
    """The rule expressions the allowlist refuses because of `host`: the host's own
    rule and each parent domain's (any of them blocks the host whole)."""
    labels = host.split(".")
    return [".".join(labels[i:]) + "/" for i in range(max(len(labels) - 1, 1))]


@dataclass
class AllowResult:
    """What allowing a host, or taking it off the allowlist, did."""

    host: str
    entry: AllowedHost | None = None
    created: bool = False
    # (expression, feed name) of the feed listings withdrawn (allowing) or listed
    # again (taking the host off).
    withdrawn: list[tuple[str, str]] = field(default_factory=list)
    relisted: list[tuple[str, str]] = field(default_factory=list)
    rules_removed: int = 0
    rules_added: int = 0
    # Rules that still block the host: listed by a person or an import, left to them.
    left: list[SpamRule] = field(default_factory=list)
    change_set: ChangeSet | None = None

    def lines(self, *, left: bool = True) -> list[str]:
        """The outcome in words (the command prints them, the admin shows them);
        `left`: with the rules left to a person."""
        out = []
        for verb, pairs in (("withdrawn", self.withdrawn), ("listed again", self.relisted)):
            if pairs:
                feeds = ", ".join(sorted({name for _, name in pairs}))
                rules = ", ".join(sorted({expression for expression, _ in pairs}))
                out.append(f"{_count(len(pairs), 'feed listing')} {verb} ({feeds}): {rules}")
        if self.rules_removed:
            out.append(f"{_count(self.rules_removed, 'rule')} removed: no source lists it now")
        if self.rules_added:
            out.append(f"{_count(self.rules_added, 'rule')} added back")
        for rule in self.left if left else ():
            out.append(
                f"{rule.expression} still blocks {self.host}: listed by hand or an import "
                f"(rule #{rule.pk}); remove it yourself if it is a mistake"
            )
        return out


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _feed_listings(expressions: list[str]) -> dict[Source, list[SpamRule]]:
    """The rules among `expressions` that a feed lists, per feed."""
    per_source: dict[Source, list[SpamRule]] = defaultdict(list)
    for batch in database.in_batches(expressions):
        # Joined, not prefetched: a listing whose source or rule is gone (no database
        # constraint keeps them; dangling_references counts them) drops out of the join.
        rows = RuleSource.objects.filter(
            rule__expression__in=batch, source__kind=Source.Kind.FEED
        ).select_related("rule", "source")
        for row in rows:
            per_source[row.source].append(row.rule)
    return per_source


def enforce(hosts: Iterable[str], *, change_set: ChangeSet, actor: Actor = None) -> AllowResult:
    """Withdraw every feed listing the allowlist (as it is now) refuses because of
    `hosts`, recording each as an AllowlistRefusal of its feed. Inside a transaction."""
    protected = load()
    hosts = _list(hosts)
    result = AllowResult(host=", ".join(hosts[:5]))
    expressions = sorted(
        {e for host in hosts for e in covering(host) if protected.refusal(e) is not None}
    )
    per_source = _feed_listings(expressions)
    for source, rules in sorted(per_source.items(), key=lambda item: item[0].name):
        AllowlistRefusal.objects.bulk_create(
            [
                AllowlistRefusal(source=source, expression=rule.expression, category=rule.category)
                for rule in rules
            ],
            ignore_conflicts=True,
        )
        result.withdrawn.extend((rule.expression, source.name) for rule in rules)
        withdrawn = changes.withdraw_rules(
            source, [rule.pk for rule in rules], actor=actor, change_set=change_set
        )
        result.rules_removed += withdrawn.removed
    if len(hosts) == 1:  # a person's allowlisting: show what still blocks the host
        result.left = list(
            SpamRule.objects.filter(expression__in=expressions).order_by("expression")
        )
    return result


def release(hosts: Iterable[str], *, change_set: ChangeSet, actor: Actor = None) -> AllowResult:
    """List again every feed listing kept out because of `hosts` that the allowlist
    (as it is now, without them) no longer refuses. Inside a transaction."""
    protected = load()
    hosts = _list(hosts)
    result = AllowResult(host=", ".join(hosts[:5]))
    expressions = sorted({e for host in hosts for e in covering(host)})
    per_source: dict[Source, list[AllowlistRefusal]] = defaultdict(list)
    for batch in database.in_batches(expressions):
        refusals = AllowlistRefusal.objects.filter(expression__in=batch).select_related("source")
        for refusal in refusals:
            if protected.refusal(refusal.expression) is None:
                per_source[refusal.source].append(refusal)
    for source, rows in sorted(per_source.items(), key=lambda item: item[0].name):
        added = changes.add_rules(
            [(row.expression, row.category) for row in rows],
            source=source,
            actor=actor,
            change_set=change_set,
            normalized=True,
            keep_names=False,
        )
        result.rules_added += added.added_count
        result.relisted.extend((row.expression, source.name) for row in rows)
        for batch in database.in_batches([row.pk for row in rows]):
            AllowlistRefusal.objects.filter(pk__in=batch).delete()
    return result


def _list(hosts: Iterable[str]) -> list[str]:
    return [hosts] if isinstance(hosts, str) else list(hosts)


def allow_host(text: str, *, note: str = "", actor: Actor = None) -> AllowResult:
    """Put a host on the allowlist (or update its note) and withdraw at once the feed
    listings it refuses, in one change set. RuleError for a text that is no host."""
    host = host_of(text)
    using = router.db_for_write(AllowedHost)
    with transaction.atomic(using=using):
        entry, created = AllowedHost.objects.get_or_create(
            source=None,
            host=host,
            defaults={"note": note[:200], "added_by": row_user(actor)},
        )
        if not created and note and note != entry.note:
            entry.note = note[:200]
            entry.save(update_fields=["note"])
        with changes.change_set(
            kind=ChangeSet.Kind.ALLOWLIST,
            actor=actor,
            reason=f"allowlisted {host}" + (f": {note}" if note else ""),
        ) as cs:
            changes.record_allowlist([host], change_set=cs, actor=actor)
            result = enforce([host], change_set=cs, actor=actor)
        result.host, result.entry, result.created = host, entry, created
        result.change_set = _kept(cs)
    return result


def unallow_host(text: str, *, actor: Actor = None) -> AllowResult:
    """Take a host off the allowlist and list again, at once, the feed listings it
    kept out. LookupError if no person allowlisted it."""
    host = host_of(text)
    using = router.db_for_write(AllowedHost)
    with transaction.atomic(using=using):
        deleted, _ = AllowedHost.objects.filter(source=None, host=host).delete()
        if not deleted:
            feeds = sorted(
                AllowedHost.objects.filter(host=host).values_list("source__name", flat=True)
            )
            also = f" (the allowlist feed(s) {', '.join(feeds)} list it)" if feeds else ""
            raise LookupError(f"{host} is not on the allowlist{also}")
        with changes.change_set(
            kind=ChangeSet.Kind.ALLOWLIST, actor=actor, reason=f"removed {host} from the allowlist"
        ) as cs:
            changes.record_allowlist([host], change_set=cs, actor=actor)
            result = release([host], change_set=cs, actor=actor)
        result.host = host
        result.change_set = _kept(cs)
    return result


def _kept(cs: ChangeSet) -> ChangeSet | None:
    """The change set, or None (and gone) if nothing was written in it."""
    if cs.added or cs.removed or cs.refused or cs.events.exists():
        return cs
    cs.delete()
    return None


def record_refusals(source: Source, refused: dict[str, str], *, forget: bool = True) -> None:
    """After a refresh applied a body: `source`'s listings the allowlist kept out are
    exactly `refused` (expression -> category). `forget=False` (the allowlist changed
    while the refresh ran, and what it withdrew meanwhile is on record): add only."""
    with transaction.atomic(using=router.db_for_write(AllowlistRefusal)):
        rows = AllowlistRefusal.objects.filter(source=source)
        present = dict(rows.values_list("expression", "pk"))
        stale = [pk for expression, pk in present.items() if expression not in refused]
        if not forget:
            stale = []
        for batch in database.in_batches(stale):
            AllowlistRefusal.objects.filter(pk__in=batch).delete()
        AllowlistRefusal.objects.bulk_create(
            [
                AllowlistRefusal(source=source, expression=expression, category=category)
                for expression, category in sorted(refused.items())
                if expression not in present
            ],
            ignore_conflicts=True,
        )
