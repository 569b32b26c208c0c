"""SpamRule admin: the change list, adding a rule from a pasted URL (pick the roll-up
level, preview what it blocks), editing category and note, and removals that go
through urlguard.writepath.changes. The import, check-a-URL and dashboard pages hang off
this admin's URLs (see get_urls)."""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.urls import reverse
from django.utils import formats, timezone
from django.utils.html import format_html

from urlguard.admin import bulk, checkurl, dashboard, imports
from urlguard.admin.forms import SpamRuleAddForm, SpamRuleChangeForm, proposed_expression
from urlguard.admin.pages import (
    BatchAnnotatedChangeList,
    http_methods,
    parse_id,
    render_tool,
    tool_urls,
)
from urlguard.admin.preview import rule_preview
from urlguard.admin.sources import ListedByFilter, listed_by
from urlguard.hotpath import hitlog
from urlguard.hotpath.canonical import expressions
from urlguard.hotpath.rollup import rule_level
from urlguard.models import MistakeReport, SpamRule
from urlguard.nodesync import nudge
from urlguard.reports import queue
from urlguard.wording import breakable_expression, micros_date
from urlguard.writepath import allowlist, changes
from urlguard.writepath.impact import impact_of_removing
from urlguard.writepath.rules import RuleError


@admin.register(SpamRule)
class SpamRuleAdmin(admin.ModelAdmin):
    list_display = (
        "expression",
        "level",
        "category",
        "added",
        "source",
        "hits",
        "last_hit",
        "continued",
        "disputes",
    )
    # "Listed by" is the sources filter (the rule's `source` label only repeats it).
    list_filter = ("category", ListedByFilter, "created")
    search_fields = ("expression",)
    search_help_text = (
        "Part of an expression (example.com), or a whole URL to find the rules that block it."
    )
    list_select_related = ("added_by", "hit_total")
    list_per_page = 100
    form = SpamRuleChangeForm
    readonly_fields = (
        "expression",
        "level",
        "added_at_text",
        "source",
        "listed_by",
        "added_by",
        "created",
        "updated",
        "hit_log",
    )
    fields = (
        "expression",
        "level",
        "category",
        "note",
        "added_at_text",
        "source",
        "listed_by",
        "added_by",
        "created",
        "updated",
        "hit_log",
    )
    # Django's delete_selected renders every selected object on one page (584,336
    # rules: 105 MB, 44 s); ours sums up the selection and deletes as a job.
    actions = ["delete_selected_rules"]

    @admin.display(description="expression", ordering="expression")
    def expression(self, obj: SpamRule) -> str:
        return breakable_expression(obj.expression)

    @admin.display(description="added", ordering="added_at")
    def added(self, obj: SpamRule) -> str:
        when = formats.date_format(timezone.localtime(obj.created), "Y-m-d H:i")
        if obj.actor is None:
            return when
        return format_html('{}<br><span class="help">by {}</span>', when, obj.actor)

    @admin.display(description="added at (filter id)")
    def added_at_text(self, obj: SpamRule) -> str:
        # added_at is the rule's filter id in microseconds: shown as the time it is.
        return f"{micros_date(obj.added_at)} (id {obj.added_at})"

    @admin.display(description="listed by")
    def listed_by(self, obj: SpamRule) -> str:
        return listed_by(obj)

    # --- the hit log: warnings shown, last one, "continue anyway", disputes ----------
    def _total(self, obj: SpamRule):
        try:
            return obj.hit_total
        except SpamRule.hit_total.RelatedObjectDoesNotExist:
            return None

    @admin.display(description="hits", ordering="hit_total__hits")
    def hits(self, obj: SpamRule) -> str:
        total = self._total(obj)
        return f"{total.hits:,}" if total is not None else "0"

    @admin.display(description="last hit", ordering="hit_total__last_at")
    def last_hit(self, obj: SpamRule) -> str:
        total = self._total(obj)
        if total is None or total.last_at is None:
            return "never"
        return formats.date_format(timezone.localtime(total.last_at), "Y-m-d H:i")

    @admin.display(description="continued", ordering="hit_total__continued")
    def continued(self, obj: SpamRule) -> str:
        total = self._total(obj)
        return f"{total.continued:,}" if total is not None else "0"

    @admin.display(description="disputes")
    def disputes(self, obj: SpamRule) -> str:
        count = getattr(obj, "disputes_", None)
        if count is None:
            count = MistakeReport.objects.filter(rule=obj).count()
        if not count:
            return "0"
        return format_html(
            '<a href="{}?rule__id__exact={}">{}</a>',
            reverse("admin:urlguard_mistakereport_changelist"),
            obj.pk,
            count,
        )

    def get_changelist(self, request, **kwargs):
        return BatchAnnotatedChangeList

    def annotate_page(self, request, rules: list[SpamRule]) -> None:
        # One query per page for the disputes column (a join over every rule to sort
        # by it would cost the whole table).
        counts = dict(
            MistakeReport.objects.filter(rule__in=[r.pk for r in rules])
            .values_list("rule")
            .annotate(n=Count("pk"))
            .values_list("rule", "n")
        )
        for rule in rules:
            rule.disputes_ = counts.get(rule.pk, 0)  # type: ignore[attr-defined]

    @admin.display(description="hit log")
    def hit_log(self, obj: SpamRule) -> str:
        total = self._total(obj)
        week = hitlog.rule_days(obj.pk, 7)
        return format_html(
            '<span class="hit-log">{} warnings shown since listed, the last {}; {} visitors '
            "continued anyway; {} mistake report(s). Last 7 days: {}</span>",
            f"{total.hits:,}" if total else "0",
            self.last_hit(obj),
            f"{total.continued:,}" if total else "0",
            self.disputes(obj),
            ", ".join(f"{day:%a} {n:,}" for day, n in week),
        )

    @admin.display(description="level")
    def level(self, obj: SpamRule) -> str:
        try:
            return rule_level(obj.expression)
        except ValueError:
            return "?"

    # --- search: a pasted URL finds the rules that block it --------------------------
    def get_search_results(self, request, queryset, search_term):
        results, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        term = search_term.strip()
        if "/" in term or "." in term:
            try:
                covering = expressions(term)
            except ValueError:
                covering = []
            if covering:
                results = results | queryset.filter(expression__in=covering)
        return results, may_have_duplicates

    # --- writes go through urlguard.writepath.changes ------------------------------------------
    def save_model(self, request, obj, form, change):
        if change:
            # Only category and note are editable (the form has no other field); the
            # filter holds expressions only, so this needs no ChangeEvent.
            obj.save(update_fields=["category", "note", "updated"])
        else:
            # Not reached through add_view below; kept so that nothing that calls
            # save_model can write a rule without its ChangeEvent.
            saved = changes.add_rule(
                obj.expression,
                category=obj.category,
                note=obj.note,
                actor=request.user,
                source="admin",
            )
            obj.pk, obj.added_at = saved.pk, saved.added_at

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    @admin.action(description="Delete selected spam rules…", permissions=["delete"])
    def delete_selected_rules(self, request, queryset):
        return bulk.start_from_action(self, request, queryset)

    def delete_view(self, request, object_id, extra_context=None):
        # The confirmation page says what the removal unblocks (and what another rule
        # keeps blocked) before anyone clicks "Yes".
        rule = self.get_object(request, object_id)
        if rule is not None and request.method == "GET":
            extra_context = {
                **(extra_context or {}),
                "impact": impact_of_removing([rule.expression]).as_dict(),
            }
        return super().delete_view(request, object_id, extra_context)

    def delete_model(self, request, obj):
        changes.remove_rule(obj, actor=request.user, source="admin")

    def delete_queryset(self, request, queryset):
        changes.remove_rules(queryset, actor=request.user, source="admin")

    # --- the add page: paste, pick a level, preview, save ----------------------------
    def add_view(self, request: HttpRequest, form_url: str = "", extra_context=None):
        if not self.has_add_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            previewing = "_preview" in request.POST
            data = request.POST.copy()
            if previewing and not data.get("expression"):
                # Without JavaScript the first round trip only knows the URL: propose
                # the narrowest level that covers it, so the preview has something to show.
                proposed = proposed_expression(data.get("url", ""))
                if proposed:
                    data["expression"] = proposed
            form = SpamRuleAddForm(data, preview=previewing, request_host=request.get_host())
            if form.is_valid() and not previewing:
                report_id = (
                    form.cleaned_data.get("report") if form.cleaned_data.get("replace") else None
                )
                try:
                    # Narrowing from a mistake report: one change set, the report its reason.
                    with queue.acting_on(parse_id(report_id), request.user) as cs:
                        rule = changes.add_rule(
                            form.cleaned_data["expression"],
                            category=form.cleaned_data["category"],
                            note=form.cleaned_data["note"],
                            actor=request.user,
                            source="admin",
                            change_set=cs,
                        )
                        self._replace(request, form, rule, cs)
                except RuleError as exc:  # includes RuleExists from a concurrent add
                    form.add_error("expression", str(exc))
                else:
                    self.log_addition(request, rule, [{"added": {}}])
                    self.message_user(
                        request,
                        format_html(
                            "Rule “{}” added ({}). {}; the "
                            '<a href="{}">filter dashboard</a> shows their progress.',
                            rule.expression,
                            rule.get_category_display(),
                            nudge.when_applied(),
                            reverse("admin:urlguard_spamrule_dashboard"),
                        ),
                        messages.SUCCESS,
                    )
                    objection = allowlist.warning(rule.expression)
                    if objection:
                        # Feeds are refused such rules; a person is trusted, but told.
                        self.message_user(request, objection, messages.WARNING)
                    if "_addanother" in request.POST:
                        return HttpResponseRedirect(request.path)
                    # Like the admin's own add view: back to the list if it may be seen.
                    if self.has_view_or_change_permission(request):
                        return HttpResponseRedirect(reverse("admin:urlguard_spamrule_changelist"))
                    return HttpResponseRedirect(reverse("admin:index"))
        else:
            form = SpamRuleAddForm(
                initial={
                    "url": request.GET.get("url", ""),
                    "samples": request.GET.get("samples", ""),
                    "replace": request.GET.get("replace", ""),
                    "report": request.GET.get("report", ""),
                }
            )
        preview = None
        text = form.data.get("url", "") if form.is_bound else form.initial.get("url", "")
        if text:
            preview = rule_preview(
                text,
                form.data.get("expression") if form.is_bound else None,
                form.sample_lines(),
                request_host=request.get_host(),
            )
        return render_tool(
            self,
            request,
            "admin/urlguard/spamrule/add_rule.html",
            **{
                "title": "Add a spam rule",
                "form": form,
                "preview": preview,
                "preview_url": reverse("admin:urlguard_spamrule_preview"),
                "has_view_permission": self.has_view_permission(request),
                **(extra_context or {}),
            },
        )

    def _replace(self, request, form, rule: SpamRule, change_set=None) -> None:
        """ "Narrow" from a mistake report: the new rule replaces the broad one."""
        old = form.cleaned_data.get("replace")
        if old is None or old.pk == rule.pk or not self.has_delete_permission(request):
            return
        # Closed first: removing the rule unlinks its reports (SET_NULL).
        closed = queue.resolve(old, MistakeReport.Status.NARROWED, request.user, change_set)
        changes.remove_rule(old, actor=request.user, source="admin", change_set=change_set)
        self.message_user(
            request,
            f"It replaces {old.expression}, now removed ({closed} mistake report"
            f"{'' if closed == 1 else 's'} closed).",
            messages.SUCCESS,
        )

    # --- extra pages -----------------------------------------------------------------
    def get_urls(self):
        return (
            tool_urls(
                self,
                [
                    ("preview/", preview_view, "preview"),
                    ("import/", imports.upload_view, "import"),
                    ("import/<int:job_id>/", imports.job_view, "import_job"),
                    ("import/<int:job_id>/commit/", imports.commit_view, "import_commit"),
                    ("import/<int:job_id>/refused/", imports.refused_view, "import_refused"),
                    ("jobs/<int:job_id>/status/", imports.status_view, "job_status"),
                    ("delete/<int:job_id>/", bulk.delete_job_view, "delete_job"),
                    ("delete/<int:job_id>/commit/", bulk.delete_commit_view, "delete_commit"),
                    ("check/", checkurl.check_view, "check"),
                    ("dashboard/", dashboard.dashboard_view, "dashboard"),
                    ("dashboard/sync/", dashboard.sync_view, "dashboard_sync"),
                    ("dashboard/rebuild/", dashboard.rebuild_view, "dashboard_rebuild"),
                    ("dashboard/status/", dashboard.status_view, "dashboard_status"),
                ],
            )
            + super().get_urls()
        )

    def changelist_view(self, request, extra_context=None):
        extra_context = {
            **(extra_context or {}),
            "can_rebuild": request.user.has_perm("urlguard.rebuild_filter"),
        }
        return super().changelist_view(request, extra_context)


@http_methods("GET")
def preview_view(model_admin: SpamRuleAdmin, request: HttpRequest) -> HttpResponse:
    """JSON for the add form's live preview: the candidate expressions for the pasted
    text and, for the chosen one, which sample URLs it would and would not block."""
    if not model_admin.has_add_permission(request):
        raise PermissionDenied
    preview = rule_preview(
        request.GET.get("url", ""),
        request.GET.get("expression") or None,
        request.GET.getlist("sample"),
        request_host=request.get_host(),
    )
    return JsonResponse(preview, status=200 if preview["error"] is None else 400)
