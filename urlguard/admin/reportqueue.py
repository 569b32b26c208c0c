"""The mistake-report queue: what visitors reported from the warning page, newest
first, each beside the rule that blocked it, with one-click actions per report:
remove the rule (through urlguard.changes), narrow it (the add form, prefilled, that
replaces it) or dismiss the report. Acting needs the permission to change reports
(and, for the rule, to delete or add rules); viewing alone changes nothing."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from urlguard import changes
from urlguard.admin.pages import http_methods, tool_urls
from urlguard.impact import impact_of_removing
from urlguard.models import MistakeReport, SpamRule

CHANGELIST = "admin:urlguard_mistakereport_changelist"


def resolve(rule_or_report, status: str, user) -> int:
    """Close the open reports about the report's rule (or about `rule`)."""
    if isinstance(rule_or_report, MistakeReport):
        reports = MistakeReport.objects.filter(pk=rule_or_report.pk)
        if rule_or_report.rule_id is not None:
            reports = MistakeReport.objects.filter(rule_id=rule_or_report.rule_id)
    else:
        reports = MistakeReport.objects.filter(rule=rule_or_report)
    return reports.filter(status=MistakeReport.Status.OPEN).update(
        status=status, resolved_by=user, resolved_at=timezone.now()
    )


@admin.register(MistakeReport)
class MistakeReportAdmin(admin.ModelAdmin):
    list_display = (
        "created_on",
        "destination_short",
        "blocked_by",
        "status",
        "comment_short",
        "act",
    )
    list_filter = ("status", "created")
    search_fields = ("destination", "expression", "comment", "email")
    list_select_related = ("rule",)
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

    @admin.display(description="act")
    def act(self, obj: MistakeReport) -> str:
        if obj.status != MistakeReport.Status.OPEN or not getattr(self, "_can_act", False):
            return ""
        # Buttons of the change list's own form (its CSRF token comes along), each
        # posting to its action's URL: one click, no nested forms.
        buttons = []
        if obj.rule_id is not None:
            buttons.append(("remove", "Remove rule", "report-remove"))
            buttons.append(("narrow", "Narrow…", "report-narrow"))
        buttons.append(("dismiss", "Dismiss", "report-dismiss"))
        return format_html(
            "".join(
                f'<button type="submit" class="button {css}" formaction="{{}}" formmethod="post">'
                f"{label}</button> "
                for _, label, css in buttons
            ),
            *[
                reverse(f"admin:urlguard_mistakereport_{name}", args=[obj.pk])
                for name, _, _ in buttons
            ],
        )

    def changelist_view(self, request, extra_context=None):
        self._can_act = self.has_change_permission(request)
        return super().changelist_view(request, extra_context)

    def get_urls(self):
        return (
            tool_urls(
                self,
                [
                    ("<int:report_id>/remove/", remove_view, "remove"),
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


@http_methods("POST")
def remove_view(model_admin, request: HttpRequest, report_id: int) -> HttpResponse:
    if not (
        model_admin.has_change_permission(request)
        and _rules_admin(model_admin).has_delete_permission(request)
    ):
        raise PermissionDenied
    report = _report(report_id)
    rule = report.rule
    if rule is None:
        messages.warning(request, "The rule of this report is already gone.")
    else:
        impact = impact_of_removing([rule.expression])
        # Closed first: removing the rule unlinks its reports (SET_NULL).
        closed = resolve(report, MistakeReport.Status.REMOVED, request.user)
        changes.remove_rule(rule, user=request.user, source="admin")
        messages.success(
            request,
            f"Removed the rule {rule.expression} ({closed} report{'s' if closed != 1 else ''} "
            f"closed). {impact.text()}",
        )
    return HttpResponseRedirect(reverse(CHANGELIST))


@http_methods("POST")
def dismiss_view(model_admin, request: HttpRequest, report_id: int) -> HttpResponse:
    if not model_admin.has_change_permission(request):
        raise PermissionDenied
    report = _report(report_id)
    MistakeReport.objects.filter(pk=report.pk, status=MistakeReport.Status.OPEN).update(
        status=MistakeReport.Status.DISMISSED, resolved_by=request.user, resolved_at=timezone.now()
    )
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
