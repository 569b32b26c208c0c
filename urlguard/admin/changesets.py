"""The change log as change sets: one row per admin action, import, feed refresh,
bulk delete or revert (who, when, what, note, reason, counts), opening into its
rules, with "Revert this change set" (a summary of what the revert does, then a job
that applies the inverse through urlguard.writepath.changes)."""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import BooleanField, Value
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils import formats, timezone
from django.utils.html import format_html, format_html_join

from urlguard import jobs
from urlguard.admin.changelog import ReadOnlyAdmin
from urlguard.admin.pages import http_methods, render_tool, report_job_outcome, tool_urls
from urlguard.models import AdminJob, ChangeEvent, ChangeSet, SpamRule
from urlguard.runtime import ownership
from urlguard.writepath.revert import RevertError, check_revertible

EVENTS_SHOWN = 50


def can_revert(model_admin, request) -> bool:
    rules = model_admin.admin_site.get_model_admin(SpamRule)
    return rules.has_add_permission(request) and rules.has_delete_permission(request)


@admin.register(ChangeSet)
class ChangeSetAdmin(ReadOnlyAdmin):
    list_display = (
        "number",
        "kind",
        "actor",
        "when",
        "what",
        "note_short",
        "reason_short",
        "source",
        "undo",
    )
    list_filter = ("kind", "source", "created")
    search_fields = ("note", "reason")
    list_select_related = ("actor", "source", "reverts")
    list_per_page = 100
    readonly_fields = (
        "kind",
        "actor",
        "created",
        "note",
        "reason",
        "source",
        "added",
        "removed",
        "refused",
        "reverts",
        "reverted_by_link",
        "reports_link",
    )
    fields = readonly_fields

    def has_view_permission(self, request, obj=None):
        # The history of the rules is part of the rules: whoever may see them may see it.
        rules = self.admin_site.get_model_admin(SpamRule)
        return super().has_view_permission(request, obj) or rules.has_view_permission(request)

    @admin.display(description="#", ordering="pk")
    def number(self, obj: ChangeSet) -> int:
        return obj.pk

    @admin.display(description="when", ordering="created")
    def when(self, obj: ChangeSet) -> str:
        return formats.date_format(timezone.localtime(obj.created), "Y-m-d H:i:s")

    @admin.display(description="what")
    def what(self, obj: ChangeSet) -> str:
        parts = []
        if obj.added:
            parts.append(f"+{obj.added:,} added")
        if obj.removed:
            parts.append(f"−{obj.removed:,} removed")
        if obj.refused:
            parts.append(f"{obj.refused:,} refused")
        text = ", ".join(parts) or "no change"
        link = format_html(
            '<a href="{}?change_set__id__exact={}">{}</a>',
            reverse("admin:urlguard_changeevent_changelist"),
            obj.pk,
            text,
        )
        unfinished = _unfinished(obj)
        if unfinished:
            link += format_html(' <strong class="changeset-partial">{}</strong>', unfinished)
        return link

    @admin.display(description="mistake reports")
    def reports_link(self, obj: ChangeSet) -> str:
        """The visitors' reports this change set acted on."""
        reports = list(obj.reports.order_by("pk")[:20])
        if not reports:
            return "none"
        return format_html_join(
            ", ",
            '<a href="{}">report #{}</a> ({})',
            (
                (
                    reverse("admin:urlguard_mistakereport_change", args=[r.pk]),
                    r.pk,
                    r.destination[:80],
                )
                for r in reports
            ),
        )

    @admin.display(description="note")
    def note_short(self, obj: ChangeSet) -> str:
        return obj.note if len(obj.note) <= 60 else obj.note[:57] + "…"

    @admin.display(description="reason")
    def reason_short(self, obj: ChangeSet) -> str:
        return obj.reason if len(obj.reason) <= 60 else obj.reason[:57] + "…"

    def _history(self, obj: ChangeSet) -> str:
        """What reverted this set, or what it reverts ("" for neither)."""
        # all(), not first(): the prefetched reverts, no query per row.
        done = next(iter(obj.reverted_by.all()), None)
        if done is not None:
            return format_html(
                '{} by <a href="{}">#{}</a>',
                "reverted" if done.finished is not None else "being reverted",
                reverse("admin:urlguard_changeset_change", args=[done.pk]),
                done.pk,
            )
        if obj.reverts_id is not None:
            return format_html(
                'reverts <a href="{}">#{}</a>',
                reverse("admin:urlguard_changeset_change", args=[obj.reverts_id]),
                obj.reverts_id,
            )
        return ""

    @admin.display(description="undo")
    def undo(self, obj: ChangeSet) -> str:
        """The history, then an "Undo…" button to the revert's summary (nothing changes
        before it is confirmed there), or why this set cannot be undone."""
        history = self._history(obj)
        why = _why_not_revertible(obj)
        if why:
            # "reverted by #N" and "being reverted by #N" say why already.
            if history.startswith(("reverted by", "being reverted")):
                return history
            return format_html('{} <span class="help changeset-no-undo">{}</span>', history, why)
        if not getattr(obj, "may_revert", False):
            return format_html(
                '{} <span class="help changeset-no-undo">{}</span>',
                history,
                "undo needs the permissions to add and delete spam rules",
            )
        return format_html(
            '{} <button type="submit" class="button changeset-undo" formaction="{}" '
            'formmethod="post" title="{}">{}</button>',
            history,
            reverse("admin:urlguard_changeset_revert", args=[obj.pk]),
            f"Revert change set #{obj.pk}: what it does (and the short links it affects) "
            "is shown first; nothing changes until you confirm",
            "Finish the undo…" if history.startswith("being reverted") else "Undo…",
        )

    @admin.display(description="reverted by")
    def reverted_by_link(self, obj: ChangeSet) -> str:
        return self._history(obj)

    def get_queryset(self, request):
        # Whether this user may revert, once per page, not once per row.
        may = Value(can_revert(self, request), output_field=BooleanField())
        return (
            super().get_queryset(request).prefetch_related("reverted_by").annotate(may_revert=may)
        )

    def change_view(self, request, object_id, form_url="", extra_context=None):
        change_set = self.get_object(request, object_id)
        extra = {}
        if change_set is not None:
            events = ChangeEvent.objects.filter(change_set=change_set).order_by("seq")
            revertible = ""
            try:
                check_revertible(change_set)
            except RevertError as exc:
                revertible = str(exc)
            extra = {
                "events": list(events[:EVENTS_SHOWN]),
                "event_count": events.count(),
                "events_url": reverse("admin:urlguard_changeevent_changelist")
                + f"?change_set__id__exact={change_set.pk}",
                "can_revert": can_revert(self, request) and not revertible,
                "not_revertible": revertible,
            }
        return super().change_view(request, object_id, form_url, {**extra, **(extra_context or {})})

    def get_urls(self):
        return (
            tool_urls(
                self,
                [
                    ("<int:change_set_id>/revert/", revert_start_view, "revert"),
                    ("revert/<int:job_id>/", revert_job_view, "revert_job"),
                    ("revert/<int:job_id>/commit/", revert_commit_view, "revert_commit"),
                ],
            )
            + super().get_urls()
        )


def _why_not_revertible(change_set: ChangeSet) -> str:
    """Why check_revertible refuses `change_set` ("" when it may be reverted)."""
    if change_set.finished is not None and not change_set.reverted_by.all():
        # Finished, and nothing reverts it (prefetched): check_revertible has nothing to
        # refuse, so a page of such sets costs no query each.
        return ""
    try:
        check_revertible(change_set)
    except RevertError as exc:
        return str(exc)
    return ""


def _unfinished(change_set: ChangeSet) -> str:
    """ "running" or "partial (interrupted)" for a set whose writes did not all commit."""
    if change_set.finished is not None:
        return ""
    if ownership.gone_reason(change_set.owner, change_set.heartbeat, change_set.created):
        return "partial (interrupted): running it again finishes it"
    return "running"


def _revert_job(job_id: int) -> AdminJob:
    job = AdminJob.objects.filter(pk=job_id, kind=AdminJob.Kind.REVERT).first()
    if job is None:
        raise Http404(f"There is no revert #{job_id}.")
    return job


@http_methods("POST")
def revert_start_view(model_admin, request: HttpRequest, change_set_id: int) -> HttpResponse:
    if not can_revert(model_admin, request):
        raise PermissionDenied
    change_set = ChangeSet.objects.filter(pk=change_set_id).first()
    if change_set is None:
        raise Http404(f"There is no change set #{change_set_id}.")
    try:
        check_revertible(change_set)
    except RevertError as exc:
        messages.error(request, str(exc))
        return HttpResponseRedirect(
            reverse("admin:urlguard_changeset_change", args=[change_set.pk])
        )
    job = jobs.create_revert(change_set, actor=request.user)
    return HttpResponseRedirect(reverse("admin:urlguard_changeset_revert_job", args=[job.pk]))


@http_methods("GET")
def revert_job_view(model_admin, request: HttpRequest, job_id: int) -> HttpResponse:
    if not can_revert(model_admin, request):
        raise PermissionDenied
    job = _revert_job(job_id)
    change_set = ChangeSet.objects.filter(pk=job.params.get("change_set")).first()
    return render_tool(
        model_admin,
        request,
        "admin/urlguard/changeset/revert_job.html",
        title=f"Revert {change_set or 'change set'}",
        job=job,
        change_set=change_set,
        status_url=reverse("admin:urlguard_spamrule_job_status", args=[job.pk]),
    )


@http_methods("POST")
def revert_commit_view(model_admin, request: HttpRequest, job_id: int) -> HttpResponse:
    if not can_revert(model_admin, request):
        raise PermissionDenied
    job = _revert_job(job_id)
    if job.state != AdminJob.State.PREVIEWED:
        messages.warning(
            request, f"Revert #{job.number} was already started ({job.get_state_display()})."
        )
    elif jobs.start_revert(job, reason=request.POST.get("reason", "")):
        report_job_outcome(
            request, job, f"Revert #{job.number} is queued; this page shows its progress."
        )
    return HttpResponseRedirect(reverse("admin:urlguard_changeset_revert_job", args=[job.pk]))
