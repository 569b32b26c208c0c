"""The mistake-report queue: what visitors reported from the warning page, newest
first, each beside the rule that blocked it and who listed that rule and when (feeds,
a person, an import), with actions per report: remove the rule (after a page with its
impact, and a warning when a feed will list it again), allowlist the host (a feed's
rule on a whole host), narrow it (the add form, prefilled, that replaces it) or
dismiss the report. The change set an action makes carries the report as its reason,
and the report links it. Acting needs the permission to change reports (and, for the
rule, to delete or add rules, or to add allowlisted hosts); viewing changes nothing.
The actions' work is urlguard.reports.queue's; this module shows and asks."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from urlguard.admin.pages import http_methods, render_tool, tool_urls
from urlguard.hotpath.canonical import split_expression
from urlguard.models import AllowedHost, MistakeReport, SpamRule
from urlguard.reports.queue import (
    allowlist_host_of,
    allowlist_reported_host,
    dismiss,
    listings,
    remove_reported_rule,
)
from urlguard.writepath.impact import impact_of_removing

CHANGELIST = "admin:urlguard_mistakereport_changelist"


def provenance(rule: SpamRule) -> str:
    """ "the feed hosts since 2026-11-25; by hand (admin) since …" with links."""
    rows = listings(rule)
    if not rows:
        return "no source lists it (it stays until removed by hand)"
    return format_html_join(
        "; ",
        '{} <a href="{}">{}</a> <span class="help">since {}</span>',
        (
            (
                "the feed" if row.source.is_feed else "by hand:",
                reverse("admin:urlguard_source_change", args=[row.source.pk]),
                row.source.name,
                timezone.localtime(row.created).strftime("%Y-%m-%d %H:%M"),
            )
            for row in rows
        ),
    )


@admin.register(MistakeReport)
class MistakeReportAdmin(admin.ModelAdmin):
    list_display = (
        "created_on",
        "destination_short",
        "blocked_by",
        "listed_by",
        "status_and_change",
        "comment_short",
        "act",
    )
    list_filter = ("status", "created")
    search_fields = ("destination", "expression", "comment", "email")
    list_select_related = ("rule", "change_set")
    list_per_page = 100
    readonly_fields = (
        "destination",
        "expression",
        "rule",
        "email",
        "comment",
        "created",
        "status",
        "resolved_by",
        "resolved_at",
        "change_set",
    )
    fields = readonly_fields
    actions = None

    def has_add_permission(self, request, obj=None):
        return False  # reports come from visitors only

    @admin.display(description="reported", ordering="created")
    def created_on(self, obj: MistakeReport) -> str:
        return timezone.localtime(obj.created).strftime("%Y-%m-%d %H:%M")

    @admin.display(description="destination", ordering="destination")
    def destination_short(self, obj: MistakeReport) -> str:
        text = obj.destination
        return text if len(text) <= 70 else text[:67] + "…"

    @admin.display(description="comment")
    def comment_short(self, obj: MistakeReport) -> str:
        text = obj.comment
        return text if len(text) <= 80 else text[:77] + "…"

    @admin.display(description="blocked by")
    def blocked_by(self, obj: MistakeReport) -> str:
        if obj.rule is None:
            return format_html("<code>{}</code> (gone)", obj.expression) if obj.expression else "—"
        return format_html(
            '<a href="{}"><code>{}</code></a>',
            reverse("admin:urlguard_spamrule_change", args=[obj.rule.pk]),
            obj.rule.expression,
        )

    @admin.display(description="listed by")
    def listed_by(self, obj: MistakeReport) -> str:
        return provenance(obj.rule) if obj.rule is not None else ""

    @admin.display(description="status", ordering="status")
    def status_and_change(self, obj: MistakeReport) -> str:
        if obj.change_set_id is None:
            return obj.get_status_display()
        return format_html(
            '{} (<a href="{}">change set #{}</a>)',
            obj.get_status_display(),
            reverse("admin:urlguard_changeset_change", args=[obj.change_set_id]),
            obj.change_set_id,
        )

    @admin.display(description="act")
    def act(self, obj: MistakeReport) -> str:
        if obj.status != MistakeReport.Status.OPEN or not getattr(self, "_can_act", False):
            return ""
        # "Remove…" opens a page with the impact and the confirmation; the others are
        # buttons of the change list's own form (its CSRF token comes along), each
        # posting to its action's URL: one click, no nested forms.
        parts = []
        if obj.rule is not None:
            parts.append(
                format_html(
                    '<a class="button report-remove" href="{}">Remove…</a>',
                    reverse("admin:urlguard_mistakereport_remove", args=[obj.pk]),
                )
            )
        buttons = []
        if obj.rule is not None and allowlist_host_of(obj.rule):
            host = split_expression(obj.rule.expression)[0]
            buttons.append(("allowlist", f"Allowlist {host}", "report-allowlist"))
        if obj.rule is not None:
            buttons.append(("narrow", "Narrow…", "report-narrow"))
        buttons.append(("dismiss", "Dismiss", "report-dismiss"))
        for name, label, css in buttons:
            parts.append(
                format_html(
                    '<button type="submit" class="button {}" formaction="{}" formmethod="post">'
                    "{}</button>",
                    css,
                    reverse(f"admin:urlguard_mistakereport_{name}", args=[obj.pk]),
                    label,
                )
            )
        return format_html_join(" ", "{}", ((part,) for part in parts))

    def changelist_view(self, request, extra_context=None):
        self._can_act = self.has_change_permission(request)
        return super().changelist_view(request, extra_context)

    def get_urls(self):
        return (
            tool_urls(
                self,
                [
                    ("<int:report_id>/remove/", remove_view, "remove"),
                    ("<int:report_id>/allowlist/", allowlist_view, "allowlist"),
                    ("<int:report_id>/narrow/", narrow_view, "narrow"),
                    ("<int:report_id>/dismiss/", dismiss_view, "dismiss"),
                ],
            )
            + super().get_urls()
        )


def _report(report_id: int) -> MistakeReport:
    report = MistakeReport.objects.select_related("rule").filter(pk=report_id).first()
    if report is None:
        raise Http404(f"There is no mistake report #{report_id}.")
    return report


def _rules_admin(model_admin):
    return model_admin.admin_site.get_model_admin(SpamRule)


@http_methods("GET", "POST")
def remove_view(model_admin, request: HttpRequest, report_id: int) -> HttpResponse:
    """GET: what removing the report's rule would unblock, who listed it (and a warning
    when a feed will list it again), and the confirmation. POST with `confirm`: remove
    it, in a change set whose reason is the report."""
    if not (
        model_admin.has_change_permission(request)
        and _rules_admin(model_admin).has_delete_permission(request)
    ):
        raise PermissionDenied
    report = _report(report_id)
    rule = report.rule
    if rule is None:
        messages.warning(request, "The rule of this report is already gone.")
        return HttpResponseRedirect(reverse(CHANGELIST))
    feeds = [row.source for row in listings(rule) if row.source.is_feed]
    if request.method == "POST" and request.POST.get("confirm"):
        impact = impact_of_removing([rule.expression])
        cs, closed = remove_reported_rule(report, rule, request.user)
        messages.success(
            request,
            f"Removed the rule {rule.expression} ({closed} report{'s' if closed != 1 else ''} "
            f"closed; change set #{cs.pk}). {impact.text()}",
        )
        if feeds:
            messages.warning(
                request,
                f"Still listed by {'the feed' if len(feeds) == 1 else 'the feeds'} "
                f"{', '.join(f.name for f in feeds)}: {rule.expression} comes back at the "
                "next refresh that is not a 304. Allowlist the host to keep it out.",
            )
        return HttpResponseRedirect(reverse(CHANGELIST))
    host = allowlist_host_of(rule)
    return render_tool(
        model_admin,
        request,
        "admin/urlguard/mistakereport/remove.html",
        title=f"Remove the rule {rule.expression}?",
        report=report,
        rule=rule,
        provenance=provenance(rule),
        feeds=feeds,
        impact=impact_of_removing([rule.expression]).as_dict(),
        allowlist_host=host,
        can_allowlist=host is not None and _may_allowlist(model_admin, request),
    )


def _may_allowlist(model_admin, request: HttpRequest) -> bool:
    allowlist_admin = model_admin.admin_site.get_model_admin(AllowedHost)
    return bool(allowlist_admin.has_add_permission(request))


@http_methods("POST")
def allowlist_view(model_admin, request: HttpRequest, report_id: int) -> HttpResponse:
    """Allowlist the host a feed's rule blocks whole: the feeds' listings are withdrawn
    at once and stay out at their next refreshes (urlguard.writepath.allowlist)."""
    if not (model_admin.has_change_permission(request) and _may_allowlist(model_admin, request)):
        raise PermissionDenied
    report = _report(report_id)
    rule = report.rule
    host = allowlist_host_of(rule) if rule is not None else None
    if rule is None or host is None:
        messages.warning(
            request, "Only a feed's rule on a whole host can be lifted by the allowlist."
        )
        return HttpResponseRedirect(reverse(CHANGELIST))
    result, closed = allowlist_reported_host(report, rule, host, request.user)
    messages.success(
        request,
        f"Allowlisted {host}: {'; '.join(result.lines(left=False)) or 'no feed listing changed'} "
        f"({closed} report{'s' if closed != 1 else ''} closed).",
    )
    for left in result.left:
        messages.warning(
            request,
            f"{left.expression} still blocks {host}: a person or an import listed it; "
            "remove it if it is a mistake.",
        )
    return HttpResponseRedirect(reverse(CHANGELIST))


@http_methods("POST")
def dismiss_view(model_admin, request: HttpRequest, report_id: int) -> HttpResponse:
    if not model_admin.has_change_permission(request):
        raise PermissionDenied
    report = _report(report_id)
    dismiss(report, request.user)
    messages.success(request, f"Dismissed report #{report.pk}; the rule stays.")
    return HttpResponseRedirect(reverse(CHANGELIST))


@http_methods("POST")
def narrow_view(model_admin, request: HttpRequest, report_id: int) -> HttpResponse:
    """The add form, prefilled: a destination the rule rightly blocks (if a short link
    has one) to pick a narrower level of, the reported URL among the samples (the
    preview must show it "not blocked"), and the rule it replaces when saved."""
    rules_admin = _rules_admin(model_admin)
    if not (
        model_admin.has_change_permission(request)
        and rules_admin.has_add_permission(request)
        and rules_admin.has_delete_permission(request)
    ):
        raise PermissionDenied
    report = _report(report_id)
    if report.rule is None:
        messages.warning(request, "The rule of this report is already gone.")
        return HttpResponseRedirect(reverse(CHANGELIST))
    others = [
        s["destination"]
        for s in impact_of_removing([report.rule.expression]).samples
        if s["destination"] != report.destination
    ]
    query = urlencode(
        {
            "url": others[0] if others else report.rule.expression,
            "samples": report.destination,
            "replace": report.rule.pk,
            "report": report.pk,
        }
    )
    return HttpResponseRedirect(reverse("admin:urlguard_spamrule_add") + "?" + query)
