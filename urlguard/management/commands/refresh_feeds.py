"""`manage.py refresh_feeds [NAME ...] [--dry-run] [--accept-shrink] [--accept-impact]
[--accept-held]`."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from urlguard.feeds import holds
from urlguard.feeds.outcome import rules_left
from urlguard.feeds.refresh import RefreshStatus, held_for_impact, refresh_source
from urlguard.jobs.dispatch import runner
from urlguard.models import AdminJob, Source


def _rescan_outcome(job_id: int) -> str:
    """The rescan a refresh started: its outcome once this process's runner thread (the
    embedded default) has run it, or where it waits (a Celery worker runs it)."""
    runner.join()
    job = AdminJob.objects.filter(pk=job_id).first()
    if job is None or job.state not in (AdminJob.State.DONE, AdminJob.State.FAILED):
        return f"rescan of the short links: job #{job_id} queued for a worker"
    return f"rescan of the short links: {job.message}"


class Command(BaseCommand):
    help = (
        "Refresh feeds now: the named sources (whether enabled or not), or every enabled "
        "feed. Each is fetched (a conditional GET: unchanged costs nothing), diffed against "
        "what it listed last time, and only the difference is written. A failed refresh "
        "changes nothing; a refresh that would remove more than FEED_SHRINK_THRESHOLD of a "
        "source's entries is held unless --accept-shrink; one that would block more than "
        "CONFIRM_IMPACT_LINKS short links is held unless --accept-impact (each accepts only "
        "its own hold: a refresh that is both needs both). Each refresh prints what it "
        "newly blocks of the short links, and one that blocks any is followed by a rescan "
        "of them. A new "
        "entry the safety policy would ask a person to confirm (a popular host, a "
        "shortener, this service's own host, too many short links) is held, the rest "
        "applied; --accept-held accepts the held entries of the named sources first. "
        "--dry-run prints the numbers and writes nothing. Exits non-zero if any refresh "
        "failed."
    )

    def add_arguments(self, parser):
        parser.add_argument("names", nargs="*", metavar="NAME")
        parser.add_argument("--dry-run", action="store_true", help="write nothing")
        parser.add_argument(
            "--accept-shrink", action="store_true", help="apply a shrink that would be held"
        )
        parser.add_argument(
            "--accept-impact",
            action="store_true",
            help="apply a refresh held for blocking more than CONFIRM_IMPACT_LINKS short links",
        )
        parser.add_argument(
            "--accept-held",
            action="store_true",
            help="accept the entries held for confirmation (needs NAMEs), then refresh",
        )

    def handle(self, *args, names, dry_run, accept_shrink, accept_impact, accept_held, **options):
        if accept_held and (not names or dry_run):
            raise CommandError("--accept-held needs the NAMEs of the feeds, and no --dry-run")
        if names:
            found = {s.name: s for s in Source.objects.filter(name__in=names)}
            missing = [n for n in names if n not in found]
            if missing:
                known = ", ".join(Source.objects.filter(kind="feed").values_list("name", flat=True))
                raise CommandError(
                    f"no source named {', '.join(map(repr, missing))} (feeds: {known or 'none'})"
                )
            not_feeds = [n for n in names if not found[n].is_feed]
            if not_feeds:
                raise CommandError(
                    f"{', '.join(map(repr, not_feeds))}: a manual source has nothing to fetch"
                )
            sources = [found[n] for n in dict.fromkeys(names)]
        else:
            sources = list(Source.objects.filter(kind=Source.Kind.FEED, enabled=True))
            if not sources:
                self.stdout.write("No enabled feeds: add one with `manage.py add_feed NAME URL`.")
                return
        failed = []
        rescans: list[int] = []
        for source in sources:
            if accept_held:
                accepted = holds.accept(source)
                self.stdout.write(f"{source.name}: accepted {accepted:,} held entries")
            result = refresh_source(
                source, dry_run=dry_run, accept_shrink=accept_shrink, accept_impact=accept_impact
            )
            self.stdout.write(result.summary())
            for line in result.impact_lines():
                self.stdout.write(f"  short links: {line}")
            for lineno, raw, reason in result.refusals[:5]:
                self.stdout.write(f"  refused line {lineno}: {raw[:80]!r}: {reason}")
            for expression, reason in result.holds[:5]:
                self.stdout.write(f"  held {expression}: {reason}")
            if result.held:
                self.stdout.write(
                    f"  {result.held:,} entries held for confirmation; to apply them: "
                    f"`manage.py refresh_feeds {source.name} --accept-held`"
                )
            if result.status == RefreshStatus.HELD:
                # The flag for this hold, with those given (a refresh can be both).
                impact = accept_impact or held_for_impact(result.held_reason)
                shrink = accept_shrink or not held_for_impact(result.held_reason)
                flags = " --accept-shrink" * shrink + " --accept-impact" * impact
                self.stdout.write(
                    f"  held: {result.held_reason}; to apply it: "
                    f"`manage.py refresh_feeds {source.name}{flags}`"
                )
            if result.rescan_job is not None:
                rescans.append(result.rescan_job)
            if result.status == RefreshStatus.FAILED:
                left = rules_left(result)
                self.stdout.write(f"  {left}")
                failed.append(f"{source.name}: {left}")
        for job_id in rescans:
            self.stdout.write(_rescan_outcome(job_id))
        if failed:
            raise CommandError(
                f"{len(failed)} of {len(sources)} refresh(es) failed: {'; '.join(failed)}"
            )
