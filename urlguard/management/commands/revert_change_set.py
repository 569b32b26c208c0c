"""`manage.py revert_change_set ID [--dry-run] [--reason TEXT]`: the admin's revert."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from urlguard.models import ChangeSet
from urlguard.writepath import revert


class Command(BaseCommand):
    help = (
        "Revert change set ID through the write path, as the admin's \"Revert this change "
        'set" does: the rules it added are withdrawn, the rules it removed come back. A '
        "revert that was interrupted (its process died) is finished: what it undid already "
        "is skipped. --dry-run prints what it would do and its impact on the short links, "
        "and writes nothing."
    )

    def add_arguments(self, parser):
        parser.add_argument("id", type=int, metavar="ID", help="the change set's number")
        parser.add_argument("--dry-run", action="store_true", help="print the plan only")
        parser.add_argument("--reason", default="", help="recorded on the revert's change set")

    def handle(self, *args, id: int, dry_run: bool, reason: str, **options):
        change_set = ChangeSet.objects.filter(pk=id).first()
        if change_set is None:
            raise CommandError(f"there is no change set #{id}")
        try:
            plan = revert.plan_revert(change_set)
        except revert.RevertError as exc:
            raise CommandError(str(exc)) from exc
        if plan.resumes is not None:
            self.stdout.write(
                f"{plan.resumes} of it was interrupted after {plan.resumes.removed:,} removed "
                f"and {plan.resumes.added:,} restored: reverting finishes it."
            )
        self.stdout.write(
            f"Reverting {change_set} ({change_set.get_kind_display()}, "
            f"{change_set.created:%Y-%m-%d %H:%M}) removes {plan.to_remove:,} rule(s) and "
            f"restores {plan.to_restore:,}; {plan.unchanged:,} change(s) have nothing left "
            "to undo."
        )
        for label, samples in (("remove", plan.remove_samples), ("restore", plan.restore_samples)):
            for expression in samples[:10]:
                self.stdout.write(f"  {label} {expression}")
        if dry_run:
            unblocks, blocks = revert.impact_of_reverting(change_set)
            if plan.to_remove:
                self.stdout.write(f"Removing: {unblocks.text()}")
            if plan.to_restore:
                self.stdout.write(f"Restoring: {blocks.text()}")
            self.stdout.write("Dry run: nothing was changed.")
            return
        try:
            done = revert.revert_change_set(change_set, reason=reason)
        except revert.RevertError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            self.style.SUCCESS(
                f"Reverted {change_set} in {done}: {done.removed:,} rule(s) removed, "
                f"{done.added:,} restored in all."
            )
        )
