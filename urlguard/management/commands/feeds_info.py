"""`manage.py feeds_info [NAME ...]`: every source's state, or the named ones'."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Count
from django.utils import timezone

from urlguard.feeds.health import HEALTH_LABELS, health, refresh_state
from urlguard.feeds.refresh import held_for_impact
from urlguard.models import Source


class Command(BaseCommand):
    help = (
        "Show every source (feeds, allowlists, manual sources), or only the NAMEd ones: "
        "health, last refresh and its numbers, rules it lists, failures in a row, a held shrink."
    )

    def add_arguments(self, parser):
        parser.add_argument("names", nargs="*", metavar="NAME", help="only these sources")
        parser.add_argument(
            "--json", action="store_true", dest="as_json", help="print one JSON array"
        )

    def handle(self, *args, names: list[str] | None = None, as_json: bool = False, **options):
        rows: list[dict[str, Any]] = []
        sources = Source.objects.annotate(
            listed=Count("listings", distinct=True), allowed=Count("allowed_hosts", distinct=True)
        )
        if names:
            sources = sources.filter(name__in=names)
            missing = sorted(set(names) - {s.name for s in sources})
            if missing:
                known = ", ".join(Source.objects.values_list("name", flat=True))
                raise CommandError(
                    f"no source named {', '.join(map(repr, missing))} (sources: {known or 'none'})"
                )
        now = timezone.now()
        for source in sources:
            age = (now - source.last_refresh_at).total_seconds() if source.last_refresh_at else None
            rows.append(
                {
                    "name": source.name,
                    "kind": source.kind,
                    "url": source.url,
                    "format": source.format,
                    "enabled": source.enabled,
                    "allowlist": source.is_allowlist,
                    "health": health(source),
                    "status": source.last_status,
                    "last_refresh_age_seconds": None if age is None else round(age),
                    "entries": source.last_entries,
                    "added": source.last_added,
                    "removed": source.last_removed,
                    "refused": source.last_refused,
                    "rules_listed": source.listed,
                    "allowed_hosts": source.allowed,
                    "failures": source.failures,
                    "error": source.last_error,
                    "held_removed": source.held_removed,
                    "held_reason": source.held_reason,
                    "refresh": refresh_state(source),
                }
            )
        if as_json:
            self.stdout.write(json.dumps(rows, indent=2))
            return
        if not rows:
            self.stdout.write("No sources yet: `manage.py add_feed NAME URL` subscribes to one.")
            return
        for row in rows:
            age = row["last_refresh_age_seconds"]
            when = "never" if age is None else f"{_age(age)} ago"
            listed = (
                f"{row['allowed_hosts']:,} allowed hosts"
                if row["allowlist"]
                else f"{row['rules_listed']:,} rules"
            )
            self.stdout.write(
                f"{row['name']:<24} {row['kind']:<6} {HEALTH_LABELS[row['health']]:<16} "
                f"{listed:<20} last refresh {when} ({row['status']})"
            )
            if row["kind"] == "feed":
                self.stdout.write(f"    {row['url']} [{row['format']}]")
            if row["refresh"]:
                self.stdout.write(f"    {row['refresh']}")
            if row["held_removed"] is not None and held_for_impact(row["held_reason"]):
                self.stdout.write(
                    f"    refresh held: {row['held_reason']}; "
                    f"`manage.py refresh_feeds {row['name']} --accept-impact` applies it"
                )
            elif row["held_removed"] is not None:
                self.stdout.write(
                    f"    shrink held: would remove {row['held_removed']:,}; "
                    f"`manage.py refresh_feeds {row['name']} --accept-shrink` applies it"
                )
            if row["error"]:
                self.stdout.write(f"    last error ({row['failures']} in a row): {row['error']}")


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"
