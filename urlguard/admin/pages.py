"""Plumbing shared by the urlguard admin pages (their job pages too): extra views bound to their
ModelAdmin (with the admin's login, CSRF and never-cache wrapping), method restriction
for such views, rendering them in the admin's frame, and a change list that decorates a
whole page of objects in one batch (one Guard.check_many per page of short links, one
NodeStatus query per page of events); plus the ids they share."""

from __future__ import annotations

from collections.abc import Callable
from functools import update_wrapper, wraps

from django.contrib import messages
from django.contrib.admin.views.main import ChangeList
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import render
from django.urls import path

from urlguard.models import AdminJob

# The largest primary key a database integer column holds; a bigger number in a query
# string would make the database driver raise (OverflowError) instead of finding nothing.
MAX_ID = 2**63 - 1


def parse_id(text: str | None) -> int | None:
    """A primary key from a query string or form field, or None for anything else.
    str.isdigit() alone is not enough: it accepts "²", which int() refuses."""
    if not text or not text.isascii() or not text.isdigit():
        return None
    value = int(text)
    return value if 0 < value <= MAX_ID else None


def http_methods(*methods: str) -> Callable:
    """require_http_methods for views that take (model_admin, request, ...)."""

    def decorate(view: Callable) -> Callable:
        @wraps(view)
        def inner(model_admin, request, *args, **kwargs):
            if request.method not in methods:
                return HttpResponseNotAllowed(methods)
            return view(model_admin, request, *args, **kwargs)

        return inner

    return decorate


def render_tool(model_admin, request: HttpRequest, template: str, **context) -> HttpResponse:
    """A tool page in the admin's frame: the site context (sidebar, user links) and
    the model's opts that templates/admin/urlguard/_tool_base.html needs."""
    return render(
        request,
        template,
        {
            **model_admin.admin_site.each_context(request),
            "opts": model_admin.opts,
            **context,
        },
    )


def report_job_outcome(request, job, queued: str) -> None:
    """The message after starting an AdminJob: in-process (no broker) it has already
    run, so say how it ended; on a worker it is only queued, so say that."""
    job.refresh_from_db()
    if job.state == AdminJob.State.DONE:
        messages.success(request, job.message)
    elif job.state == AdminJob.State.FAILED:
        messages.error(request, job.message)
    else:
        messages.info(request, queued)


def tool_urls(model_admin, routes: list[tuple[str, Callable, str]]) -> list:
    """URL patterns for (route, view(model_admin, request, ...), name suffix); names
    are admin:<app>_<model>_<suffix> like the admin's own."""
    prefix = f"{model_admin.opts.app_label}_{model_admin.opts.model_name}"

    def bind(view: Callable) -> Callable:
        def bound(request, *args, **kwargs):
            return view(model_admin, request, *args, **kwargs)

        return model_admin.admin_site.admin_view(update_wrapper(bound, view))

    return [path(route, bind(view), name=f"{prefix}_{suffix}") for route, view, suffix in routes]


class BatchAnnotatedChangeList(ChangeList):
    def get_results(self, request):
        super().get_results(request)
        # Evaluated once here; the templates then iterate this list, so the
        # attributes set by annotate_page are the ones they display.
        self.result_list = list(self.result_list)
        self.model_admin.annotate_page(request, self.result_list)
