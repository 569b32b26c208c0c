"""`manage.py check_url URL`: show every step of the guard's decision for one URL."""

from __future__ import annotations

from django.core.management.base import CommandError

from urlguard.hotpath.canonical import expressions
from urlguard.hotpath.guard import InvalidURL, get_guard
from urlguard.models import SpamRule

from ._filterfile import DiagnosticCommand


class Command(DiagnosticCommand):
    help = (
        "Explain the guard's verdict for URL: its canonical form, every roll-up expression, "
        "what the filter answers for each, which of them the spam table lists, and the verdict. "
        "An expression the table lists but the filter does not means this node's filter is "
        "behind: run `manage.py sync_filter`."
    )

    def add_arguments(self, parser):
        parser.add_argument("url", help="the URL to check, e.g. https://login.example.com/a?b=1")

    def handle(self, *args, url: str, **options):
        guard = get_guard()
        try:
            verdict = guard.check(url)
        except InvalidURL as exc:
            raise CommandError(str(exc)) from exc
        canonical = verdict.canonical
        exprs = expressions(canonical)

        filt = guard.get_filter()
        maybe: list[bool | None] = [None] * len(exprs)
        filter_line = "unreadable (see the log; `manage.py filter_info` says more)"
        if filt is not None:
            try:
                maybe = [bool(x) for x in filt.contains_many(exprs).tolist()]
                filter_line = (
                    f"{getattr(filt, 'path', '?')} (applied_seq "
                    f"{getattr(filt, 'applied_seq', '?')}, generation "
                    f"{getattr(filt, 'generation', '?')})"
                )
            except Exception as exc:  # the verdict above already followed ON_FILTER_ERROR
                filter_line = (
                    f"unreadable: {exc} (`manage.py filter_info` says more; "
                    "`rebuild_filter` repairs it)"
                )
        listed = {r.expression: r for r in SpamRule.objects.filter(expression__in=exprs)}

        out = self.stdout
        out.write(f"url        {url}")
        out.write(f"canonical  {canonical}")
        out.write(f"filter     {filter_line}")
        width = max(len(e) for e in exprs)
        out.write("")
        out.write(f"  {'expression':<{width}}  filter  table")
        stale = []
        for expr, hit in zip(exprs, maybe, strict=True):
            rule = listed.get(expr)
            fcol = "?" if hit is None else ("maybe" if hit else "no")
            tcol = f"listed: {rule.category} (rule #{rule.pk})" if rule else "-"
            out.write(f"  {expr:<{width}}  {fcol:<6}  {tcol}")
            if rule is not None and hit is False:
                stale.append(expr)
        out.write("")
        if stale:
            out.write(
                self.style.WARNING(
                    f"the table lists {', '.join(stale)} but this node's filter does not: it is "
                    "behind the change log. Run `manage.py sync_filter` (or `rebuild_filter`)."
                )
            )
        if verdict.blocked:
            out.write(self.style.ERROR(f"verdict    BLOCKED: {verdict.reason}"))
        else:
            note = f" ({verdict.reason})" if verdict.reason else ""
            out.write(self.style.SUCCESS(f"verdict    allowed{note}"))
