"""Bulk deletes of spam rules as jobs: the admin action only records which rules were
selected (however many) and opens a summary page (counts, a sample by name, what
the removal unblocks), never a page listing every object; "Delete" there runs the
removal as a job through urlguard.writepath.changes, with a progress bar and a result."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from urlguard import jobs
from urlguard.admin.pages import http_methods, render_tool, report_job_outcome
from urlguard.models import AdminJob, Category


def job_url(job: AdminJob) -> str:
    return reverse("admin:urlguard_spamrule_delete_job", args=[job.pk])


def _delete_job(job_id: int) -> AdminJob:
    job = (
        AdminJob.objects.filter(pk=job_id, kind=AdminJob.Kind.DELETE)
        .select_related("created_by")
        .first()
    )
    if job is None:
        raise Http404(f"There is no bulk delete #{job_id}.")
    return job


def start_from_action(model_admin, request: HttpRequest, queryset) -> HttpResponse:
    """The "delete selected" action: a job for the selection, and its summary page."""
    job = jobs.create_delete(queryset, actor=request.user)
    return HttpResponseRedirect(job_url(job))


@http_methods("GET")
def delete_job_view(model_admin, request: HttpRequest, job_id: int) -> HttpResponse:
    if not model_admin.has_delete_permission(request):
        raise PermissionDenied
    job = _delete_job(job_id)
    labels = dict(Category.choices)
    result = job.result
    return render_tool(
        model_admin,
        request,
        "admin/urlguard/spamrule/delete_job.html",
        title=f"Bulk delete #{job.number}",
        job=job,
        categories=[(labels.get(c, c), n) for c, n in sorted(result.get("categories", {}).items())],
        status_url=reverse("admin:urlguard_spamrule_job_status", args=[job.pk]),
    )


@http_methods("POST")
def delete_commit_view(model_admin, request: HttpRequest, job_id: int) -> HttpResponse:
    if not model_admin.has_delete_permission(request):
        raise PermissionDenied
    job = _delete_job(job_id)
    if job.state == AdminJob.State.FAILED and jobs.run_again(job):
        report_job_outcome(request, job, f"Bulk delete #{job.pk} is queued again to finish.")
    elif job.state != AdminJob.State.PREVIEWED:
        messages.warning(
            request, f"Bulk delete #{job.number} was already started ({job.get_state_display()})."
        )
    elif job.total == 0:
        messages.info(request, "Nothing to delete: the selected rules are already gone.")
    elif jobs.start_delete(job, reason=request.POST.get("reason", "")):
        report_job_outcome(
            request, job, f"Bulk delete #{job.number} is queued; this page shows its progress."
        )
    return HttpResponseRedirect(job_url(job))
