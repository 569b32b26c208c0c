"""`manage.py verify_filter`: prove that the filter holds every rule of the spam table."""

from __future__ import annotations

from django.core.management.base import CommandError

from urlguard.conf import conf
from urlguard.models import SpamRule
from urlguard.nodesync import registry, sync
from urlguard.writepath import changes

from ._filterfile import DiagnosticCommand, add_path_argument, open_readonly
from ._progress import Progress

BATCH = 50_000


class Command(DiagnosticCommand):
    help = (
        "Check that every rule in the spam table is present in this node's filter file (a "
        "missing one would let a listed link through), and that the file holds no more "
        "entries than the table has rules (removals not applied), and that no listing or "
        "change-log row refers to a row that is gone (references the database does not "
        "check). Reports mismatches and exits non-zero if there are any; `rebuild_filter` "
        "repairs the filter's. With --sync, pending changes are applied first, so a "
        "lagging node is not reported as broken."
    )

    def add_arguments(self, parser):
        add_path_argument(parser)
        parser.add_argument(
            "--sync", action="store_true", help="apply the pending change log before verifying"
        )
        parser.add_argument(
            "--show",
            type=int,
            default=20,
            metavar="N",
            help="list at most N missing rules (default 20)",
        )

    def handle(self, *args, path: str | None = None, show: int = 20, **options):
        path = path or conf.FILTER_PATH
        if options.get("sync"):
            try:
                sync.sync(path=path)
            except registry.WriterBusy as exc:
                raise CommandError(f"--sync: {exc}") from exc
        filt = open_readonly(path)
        progress = Progress(self.stdout, "rules checked")
        missing: list[str] = []
        checked = 0
        try:
            applied, head = filt.applied_seq, sync.log_head()
            total = SpamRule.objects.count()
            batch: list[str] = []
            rules = SpamRule.objects.order_by("added_at").values_list("expression", flat=True)
            for expression in rules.iterator(chunk_size=BATCH):
                batch.append(expression)
                if len(batch) == BATCH:
                    missing.extend(_absent(filt, batch))
                    checked += len(batch)
                    batch = []
                    progress(checked, total)
            missing.extend(_absent(filt, batch))
            checked += len(batch)
            progress(checked, total)
            held = _held(filt)
            clean = filt.is_clean
        finally:
            progress.end()
            filt.close()

        problems = []
        if not clean:
            problems.append("the file is dirty (a writer died mid-change)")
        if missing:
            problems.append(f"{len(missing):,} rule(s) of the table are not in the filter")
        if held is not None and held > checked:
            problems.append(
                f"the filter holds {held:,} entries but the table has "
                f"{checked:,} rules (removals not applied)"
            )
        # Not the filter's doing and not repaired by a rebuild: a bug in the write path.
        problems.extend(
            f"{count:,} {what} (a write-path bug; a rebuild does not repair it)"
            for what, count in changes.dangling_references().items()
            if count
        )
        lag = f"file at change #{applied}, log head #{head}"
        if not problems:
            self.stdout.write(
                self.style.SUCCESS(f"OK: all {checked:,} rules are in {path} ({lag}).")
            )
            return
        for expression in missing[:show]:
            self.stderr.write(f"  missing: {expression}")
        if len(missing) > show:
            self.stderr.write(f"  ... and {len(missing) - show:,} more")
        hint = (
            "; changes are pending, so try `sync_filter` (or --sync) first"
            if applied < head
            else "; run `manage.py rebuild_filter`"
        )
        raise CommandError(f"{path}: " + "; ".join(problems) + f" ({lag}){hint}.")


def _absent(filt, batch: list[str]) -> list[str]:
    if not batch:
        return []
    hits = filt.contains_many(batch)
    return [e for e, hit in zip(batch, hits.tolist(), strict=True) if not hit]


def _held(filt) -> int | None:
    """Entries the file says it holds (sum of stage counts), if info() tells."""
    info = filt.info()
    stages = info.get("stages")
    if stages and all("count" in s for s in stages):
        return int(sum(s["count"] for s in stages))
    return info.get("count")
