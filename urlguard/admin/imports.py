"""The import pages: upload a rule file, see the dry run (new / already present /
repeated / refused with each line's reason), commit it, watch its progress and the
rescan that follows. The work itself is in urlguard.jobs."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.urls import reverse

from urlguard import jobs
from urlguard.admin.forms import ImportForm, decoded
from urlguard.admin.pages import http_methods, render_tool, report_job_outcome
from urlguard.models import AdminJob, ShortLink
from urlguard.runtime import ownership


def _job(job_id: int, kind: str) -> AdminJob:
    job = AdminJob.objects.filter(pk=job_id, kind=kind).select_related("created_by").first()
    if job is None:
        raise Http404(f"There is no {kind} job #{job_id}.")
    return job


def upload_view(model_admin, request: HttpRequest) -> HttpResponse:
    if not model_admin.has_add_permission(request):
        raise PermissionDenied
    if request.method == "POST":
        form = ImportForm(request.POST, request.FILES)
        if form.is_valid():
            upload = form.cleaned_data["file"]
            # Streamed into the job's chunks; the dry run itself runs as a job, so
            # this request returns in well under a second whatever the file's size.
            job = jobs.create_import(
                decoded(upload),
                default_category=form.cleaned_data["default_category"],
                filename=upload.name,
                actor=request.user,
            )
            jobs.start_preview(job)
            return HttpResponseRedirect(
                reverse("admin:urlguard_spamrule_import_job", args=[job.pk])
            )
    else:
        form = ImportForm()
    recent = AdminJob.objects.filter(kind=AdminJob.Kind.IMPORT).select_related("created_by")[:10]
    return render_tool(
        model_admin,
        request,
        "admin/urlguard/spamrule/import.html",
        title="Import spam rules",
        form=form,
        recent=recent,
    )


def job_view(model_admin, request: HttpRequest, job_id: int) -> HttpResponse:
    """The dry-run preview (with the commit button), then the progress, then the result."""
    if not model_admin.has_add_permission(request):
        raise PermissionDenied
    job = _job(job_id, AdminJob.Kind.IMPORT)
    rescan = None
    if rescan_id := job.result.get("rescan_job"):
        rescan = AdminJob.objects.filter(pk=rescan_id).first()
    return render_tool(
        model_admin,
        request,
        "admin/urlguard/spamrule/import_job.html",
        title=f"Import #{job.number}: {job.params.get('filename', '')}",
        job=job,
        rescan=rescan,
        status_url=reverse("admin:urlguard_spamrule_job_status", args=[job.pk]),
        rescan_status_url=(
            reverse("admin:urlguard_spamrule_job_status", args=[rescan.pk]) if rescan else ""
        ),
    )


@http_methods("POST")
def commit_view(model_admin, request: HttpRequest, job_id: int) -> HttpResponse:
    if not model_admin.has_add_permission(request):
        raise PermissionDenied
    job = _job(job_id, AdminJob.Kind.IMPORT)
    if job.state == AdminJob.State.FAILED and jobs.run_again(job):
        report_job_outcome(request, job, f"Import #{job.number} is queued again to finish.")
    elif job.state != AdminJob.State.PREVIEWED:
        messages.warning(
            request, f"Import #{job.number} was already committed ({job.get_state_display()})."
        )
    elif job.total == 0:
        messages.info(request, "Nothing to import: every line is already present or refused.")
    elif jobs.start_import(job, actor=request.user):
        report_job_outcome(
            request, job, f"Import #{job.number} is queued; this page shows its progress."
        )
    return HttpResponseRedirect(reverse("admin:urlguard_spamrule_import_job", args=[job.pk]))


@http_methods("GET")
def status_view(model_admin, request: HttpRequest, job_id: int) -> HttpResponse:
    """Progress of any admin job, polled by the import and rescan pages."""
    job = AdminJob.objects.filter(pk=job_id).first()
    if job is None:
        raise Http404(f"There is no job #{job_id}.")
    # The permission of the page that shows the job: the import page shows its
    # import and the rescan that follows it; the rescan page shows any rescan; a bulk
    # delete or a revert needs the permission to delete rules. Asked of the
    # ModelAdmins, as those pages do (change implies view there).
    if job.kind in (AdminJob.Kind.DELETE, AdminJob.Kind.REVERT):
        allowed = model_admin.has_delete_permission(request)
    else:
        allowed = model_admin.has_add_permission(request)
    site = model_admin.admin_site
    if job.kind == AdminJob.Kind.RESCAN and not allowed and site.is_registered(ShortLink):
        links_admin = site.get_model_admin(ShortLink)
        allowed = links_admin.has_view_permission(request)
    if not allowed:
        raise PermissionDenied
    if job.state in ownership.ACTIVE_JOB_STATES and ownership.recover_orphans()["jobs"]:
        job.refresh_from_db()  # its runner died: the page says so now
    return JsonResponse(
        {
            "id": job.pk,
            "kind": job.kind,
            "state": job.state,
            "done": job.done,
            "total": job.total,
            "message": job.message,
            "finished": job.state
            in (AdminJob.State.DONE, AdminJob.State.FAILED, AdminJob.State.PREVIEWED),
            "rescan_job": job.result.get("rescan_job"),
        }
    )


@http_methods("GET")
def refused_view(model_admin, request: HttpRequest, job_id: int) -> HttpResponse:
    """The refused lines of an import as a text file, each under its reason."""
    if not model_admin.has_add_permission(request):
        raise PermissionDenied
    job = _job(job_id, AdminJob.Kind.IMPORT)
    response = HttpResponse(job.refused, content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="import-{job.pk}-refused.txt"'
    return response
