"""Check-a-URL page: every step of Guard.check laid open for one URL: the canonical
form, each roll-up expression, what the filter answers for it, what the spam table
holds for it, and the verdict with the rule that caused it. It also flags the one
thing that must never happen: a rule in the table that the filter does not hold."""

from __future__ import annotations

from dataclasses import dataclass

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

from urlguard.admin.forms import CheckUrlForm
from urlguard.admin.pages import render_tool
from urlguard.hotpath.canonical import canonicalize, expressions
from urlguard.hotpath.guard import get_guard
from urlguard.hotpath.rollup import rule_level
from urlguard.models import SpamRule
from urlguard.nodesync import registry


@dataclass(frozen=True)
class ExpressionRow:
    expression: str
    level: str
    filter_says: bool | None  # None: the filter could not be read
    rule: SpamRule | None

    @property
    def finding(self) -> str:
        if self.rule is not None and self.filter_says is False:
            return "stale"  # listed, but this node's filter does not know it yet
        if self.rule is not None:
            return "listed"
        if self.filter_says:
            return "false-positive"
        return "clean"


def url_report(url: str) -> dict:
    canonical = canonicalize(url)
    exprs = expressions(canonical)
    filt = registry.get_filter()
    filter_error = ""
    maybe: list[bool | None] = [None] * len(exprs)
    if filt is None:
        filter_error = "The filter file could not be opened on this node; see the filter dashboard."
    else:
        try:
            maybe = [bool(hit) for hit in filt.contains_many(exprs).tolist()]
        except Exception as exc:  # a damaged file must show up here, not as a 500
            filter_error = f"Reading the filter failed: {type(exc).__name__}: {exc}"
    rules = {r.expression: r for r in SpamRule.objects.filter(expression__in=exprs)}
    rows = []
    for expression, says in zip(exprs, maybe, strict=True):
        try:
            level = rule_level(expression)
        except ValueError:
            level = ""
        rows.append(ExpressionRow(expression, level, says, rules.get(expression)))
    verdict = get_guard().check(url)
    return {
        "url": url,
        "canonical": canonical,
        "rows": rows,
        "verdict": verdict,
        "filter_error": filter_error,
        "applied_seq": getattr(filt, "applied_seq", None),
        "stale": [r for r in rows if r.finding == "stale"],
    }


def check_view(model_admin, request: HttpRequest) -> HttpResponse:
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    form = CheckUrlForm(request.GET if "url" in request.GET else None)
    report = url_report(form.cleaned_data["url"]) if form.is_valid() else None
    return render_tool(
        model_admin,
        request,
        "admin/urlguard/spamrule/check_url.html",
        title="Check a URL",
        form=form,
        report=report,
    )
