"""`manage.py import_rules FILE`: list many rules at once from a file."""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from urlguard.models import Category, ChangeSet
from urlguard.writepath import changes
from urlguard.writepath.apply import apply_listing
from urlguard.writepath.importing import parse_rules, plan_import
from urlguard.writepath.rulelists import ParsedLine

from ._progress import Progress


class Command(BaseCommand):
    help = (
        "Import spam rules from FILE ('-' for standard input): one URL, host or rule "
        "expression per line, a hosts file (0.0.0.0 host), or CSV with a category column. "
        "Each rule is normalized and checked like one added in the admin (public suffixes "
        "are refused). Prints how many were added, skipped (already listed) and refused, "
        "with the reason for each refusal. --dry-run changes nothing."
    )

    def add_arguments(self, parser):
        parser.add_argument("file", help="the file to read, or - for standard input")
        parser.add_argument(
            "--category",
            default=Category.SPAM,
            choices=Category.values,
            help="category for lines that do not name one (default: spam)",
        )
        parser.add_argument(
            "--source", default=None, help="recorded on each rule (default: import:<file name>)"
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="report what would be added, skipped and refused; write nothing",
        )
        parser.add_argument(
            "--show",
            type=int,
            default=50,
            metavar="N",
            help="print at most N refusals (default 50)",
        )

    def handle(
        self,
        *args,
        file: str,
        category: str,
        source: str | None,
        dry_run: bool,
        show: int,
        **options,
    ):
        if file == "-":
            name = "stdin"
            # Decoded like a file (strictly, a BOM dropped), whatever the locale says:
            # sys.stdin would turn bad bytes into surrogates, i.e. odd refusals.
            stream = io.TextIOWrapper(
                sys.stdin.buffer, encoding="utf-8-sig", errors="strict", newline=""
            )
        else:
            path = Path(file)
            if path.is_dir():
                raise CommandError(f"{file} is a directory; name the file to import")
            if not path.exists():
                raise CommandError(f"{file}: no such file")
            try:
                # utf-8-sig: spreadsheets like to start CSV exports with a BOM.
                stream = path.open(encoding="utf-8-sig", errors="strict", newline="")
            except OSError as exc:
                raise CommandError(f"{file}: {exc}") from exc
            name = path.name
        progress = Progress(self.stdout, "lines")
        label = source or f"import:{name}"[:200]
        note = f"import_rules {name}"[:1000]
        try:
            lines = (line.rstrip("\r\n") for line in stream)
            parsed = _shown(parse_rules(lines, default_category=category), progress)
            if dry_run:
                result = changes.add_rules(parsed, source=label, category=category, dry_run=True)
                added, skipped, refused = len(result.added), len(result.skipped), result.refused
            else:
                planned = plan_import(parsed, label=label)
        except UnicodeDecodeError as exc:
            what = "stdin" if file == "-" else file
            raise CommandError(f"{what} is not UTF-8 text ({exc}); re-save it as UTF-8.") from exc
        finally:
            progress.end()
            if file == "-":
                stream.detach()  # leave sys.stdin open
            else:
                stream.close()
        if not dry_run:
            try:
                with changes.change_set(
                    kind=ChangeSet.Kind.IMPORT,
                    source=label,
                    note=note,
                    # An import of this file killed half-way: rules it listed are skipped.
                    resume=changes.interrupted(kind=ChangeSet.Kind.IMPORT, note=note),
                ) as change_set:
                    applied = apply_listing(planned.plan, change_set=change_set)
            finally:
                planned.plan.close()
            added, refused = applied.rules_added, planned.refusals
            skipped = applied.skipped + planned.repeated
        for refusal in refused[:show]:
            self.stderr.write(f"  refused {refusal}")
        if len(refused) > show:
            self.stderr.write(f"  ... and {len(refused) - show:,} more refused")
        style = self.style.SUCCESS if not refused else self.style.WARNING
        prefix = "Dry run: " if dry_run else ""
        verb = "would be added" if dry_run else "added"
        self.stdout.write(
            style(
                f"{prefix}{added} {verb}, {skipped} skipped (already listed), "
                f"{len(refused)} refused."
            )
        )


def _shown(parsed: Iterator[ParsedLine], progress: Progress) -> Iterator[ParsedLine]:
    """`parsed`, the lines read shown on a terminal as they go."""
    for line in parsed:
        if line.lineno % 5000 == 0:
            progress(line.lineno)
        yield line
