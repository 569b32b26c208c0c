"""Sources admin: feeds, allowlists and the manual sources with their health at a
glance, add/edit/disable, "refresh now" as an AdminJob with progress (started by
urlguard.feeds.adminjobs), accepting a held shrink, each source's refresh history and
allowlisted hosts; plus what the rules admin and the dashboard show of sources (a
rule's sources, the rules-list filter by source, the dashboard's feed health panel)."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import router, transaction
from django.db.models import Count
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from urlguard.admin.pages import http_methods, render_tool, tool_urls
from urlguard.conf import conf
from urlguard.feeds import holds
from urlguard.feeds.adminjobs import start_refresh, start_test_fetch
from urlguard.feeds.decoding import FeedError
from urlguard.feeds.fetching import file_feed_path
from urlguard.feeds.formats import NAMES
from urlguard.feeds.health import HEALTH_LABELS, health, in_words, refresh_state
from urlguard.feeds.interval import MAX_INTERVAL, MIN_INTERVAL, human_interval, parse_interval
from urlguard.feeds.refresh import held_for_impact
from urlguard.models import AdminJob, AllowedHost, FeedHold, FeedRefresh, Source
from urlguard.wording import counted
from urlguard.writepath import changes

HISTORY_SHOWN = 20


def age(when) -> str:
    if when is None:
        return "never"
    seconds = (timezone.now() - when).total_seconds()
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h ago"
    return f"{seconds / 86400:.0f} d ago"


def health_badge(source: Source) -> str:
    state = health(source)
    title = source.last_error[:300] if state in ("failing", "failed", "stale") else ""
    badge = format_html(
        '<span class="feed-health feed-{}" title="{}">{}</span>', state, title, HEALTH_LABELS[state]
    )
    running = refresh_state(source)
    if running:
        badge += format_html(' <span class="feed-refresh-state">{}</span>', running)
    return badge


class IntervalField(forms.CharField):
    """An interval typed as a person says it ("15 min", "1 h", "1 d", or seconds),
    stored in seconds: the parser and bounds of `add_feed --interval`."""

    def prepare_value(self, value):
        return human_interval(value) if isinstance(value, int) else value

    def to_python(self, value):
        text = str(super().to_python(value) or "").strip()
        if not text:
            return None
        try:
            return parse_interval(text)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None


class SourceForm(forms.ModelForm):
    # Set by SourceAdmin.get_form: a file:// URL reads a file on this server, which
    # only a superuser may point a feed at.
    may_read_files = False

    interval = IntervalField(
        initial="1 h",
        help_text=(
            f"How often the feed is fetched: 90 s, 15 min, 1 h, 1 d (at least "
            f"{human_interval(MIN_INTERVAL)}, at most {human_interval(MAX_INTERVAL)})."
        ),
        widget=forms.TextInput(attrs={"size": 10}),
    )

    class Meta:
        model = Source
        labels = {"url": "URL"}
        widgets = {"url": forms.URLInput(attrs={"size": 80})}
        fields = (
            "name",
            "kind",
            "url",
            "format",
            "category",
            "interval",
            "enabled",
            "is_allowlist",
        )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        kind, url = data.get("kind"), (data.get("url") or "").strip()
        if kind == Source.Kind.FEED:
            if not url.lower().startswith(("http://", "https://", "file:///")):
                self.add_error("url", "A feed needs an http://, https:// or file:///path URL.")
            elif url.lower().startswith("file:") and (refusal := self._file_url_refusal(url)):
                self.add_error("url", refusal)
        elif url:
            self.add_error("url", "A manual source has no URL (its rules are added by hand).")
        if data.get("is_allowlist") and kind != Source.Kind.FEED:
            self.add_error(
                "is_allowlist",
                "Hosts a person allowlists go on the Allowlist (its own admin page); "
                "a source is an allowlist only when it is a feed of hosts.",
            )
        if data.get("format") not in ("auto", *NAMES):
            self.add_error("format", "Unknown format.")
        return data

    def _file_url_refusal(self, url: str) -> str:
        unchanged = self.instance.pk is not None and self.instance.url == url
        if not self.may_read_files and not unchanged:
            return (
                "Only a superuser may set a file:// URL: it reads a file on this server. "
                "Use an http:// or https:// URL."
            )
        try:
            file_feed_path(url, conf.FEED_FILE_ROOT, must_exist=False)
        except FeedError as exc:
            return str(exc)
        return ""


class AllowedHostInline(admin.TabularInline):
    """The hosts an allowlist feed lists: its refreshes write them, so read-only."""

    model = AllowedHost
    extra = 0
    fields = ("host", "note", "created")
    readonly_fields = ("host", "note", "created")
    verbose_name = "allowlisted host"
    verbose_name_plural = "allowlisted hosts (from the feed)"

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


# The source page's "Last refresh" section, all read-only.
_REFRESH_STATUS_FIELDS = (
    "health",
    "last_refresh",
    "last_status",
    "last_http_status",
    "last_bytes",
    "last_entries",
    "last_added",
    "last_removed",
    "last_unchanged",
    "last_refused",
    "last_duration",
    "failures",
    "last_error",
    "etag",
    "last_modified",
    "held",
)


@admin.register(Source)
class SourceAdmin(admin.ModelAdmin):
    form = SourceForm
    change_form_template = "admin/urlguard/source/change_form.html"
    list_display = (
        "name",
        "url_short",
        "health",
        "entries",
        "last_success",
        "next_refresh",
        "rules",
        "last_change",
        "held",
    )
    list_filter = ("kind", "enabled", "is_allowlist", "last_status")
    search_fields = ("name", "url")
    actions = ["refresh_now", "accept_held_shrink", "disable", "enable"]
    readonly_fields = (*_REFRESH_STATUS_FIELDS, "history")
    fieldsets = (
        (None, {"fields": ("name", "kind", "url", "format", "category", "interval")}),
        (None, {"fields": ("enabled", "is_allowlist")}),
        (
            "Last refresh",
            {"fields": _REFRESH_STATUS_FIELDS},
        ),
        ("Refresh history", {"fields": ("history",)}),
    )

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(rules_listed=Count("listings"))

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        form.may_read_files = request.user.is_superuser
        return form

    def get_inlines(self, request, obj=None):
        return [AllowedHostInline] if obj is not None and obj.is_allowlist else []

    def get_fieldsets(self, request, obj=None):
        # The add form asks only what a new source needs.
        return self.fieldsets[:2] if obj is None else self.fieldsets

    @admin.display(description="health")
    def health(self, obj: Source) -> str:
        return health_badge(obj)

    @admin.display(description="last refresh", ordering="last_refresh_at")
    def last_refresh(self, obj: Source) -> str:
        return age(obj.last_refresh_at)

    @admin.display(description="URL", ordering="url")
    def url_short(self, obj: Source) -> str:
        if not obj.url:
            return ""
        text = obj.url if len(obj.url) <= 60 else obj.url[:57] + "…"
        return format_html('<span class="feed-url" title="{}">{}</span>', obj.url, text)

    @admin.display(description="last success", ordering="last_success_at")
    def last_success(self, obj: Source) -> str:
        return age(obj.last_success_at) if obj.is_feed else ""

    @admin.display(description="next refresh")
    def next_refresh(self, obj: Source) -> str:
        if not obj.is_feed:
            return ""
        if not obj.enabled:
            return "disabled"
        every = f"every {human_interval(obj.interval)}"
        if obj.last_refresh_at is None:
            return f"due now ({every})"
        due = obj.last_refresh_at + timedelta(seconds=obj.interval)
        seconds = (due - timezone.now()).total_seconds()
        if seconds <= 0:
            return f"due now ({every})"
        return f"in {human_interval(max(math.ceil(seconds / 60), 1) * 60)} ({every})"

    @admin.display(description="entries", ordering="last_entries")
    def entries(self, obj: Source) -> str:
        return "" if obj.last_entries is None else f"{obj.last_entries:,}"

    @admin.display(description="rules listed", ordering="rules_listed")
    def rules(self, obj: Source):
        count = getattr(obj, "rules_listed", None)
        if count is None:
            count = obj.listings.count()
        if obj.is_allowlist:
            return f"{obj.allowed_hosts.count():,} hosts"
        url = reverse("admin:urlguard_spamrule_changelist") + f"?listed_by={obj.pk}"
        return format_html('<a href="{}">{}</a>', url, f"{count:,}")

    @admin.display(description="last change")
    def last_change(self, obj: Source) -> str:
        if obj.last_added is None:
            return ""
        return in_words(obj.last_added, obj.last_removed, obj.last_refused)

    @admin.display(description="held")
    def held(self, obj: Source) -> str:
        if obj.held_at is None:
            return ""
        if held_for_impact(obj.held_reason):
            return format_html(
                '<strong class="feed-held" title="held {}">{}</strong>',
                age(obj.held_at),
                obj.held_reason,
            )
        return format_html(
            '<strong class="feed-held" title="held {}; leaves {} entries">would remove {}</strong>',
            age(obj.held_at),
            f"{obj.held_entries or 0:,}",
            f"{obj.held_removed or 0:,}",
        )

    @admin.display(description="recent refreshes")
    def history(self, obj: Source) -> str:
        rows = list(obj.refreshes.all()[:HISTORY_SHOWN])
        if not rows:
            return "none yet"
        body = format_html_join(
            "",
            "<tr class='refresh-{}'><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
            "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    r.status,
                    timezone.localtime(r.at).strftime("%Y-%m-%d %H:%M:%S"),
                    r.get_status_display(),
                    f"{r.entries:,}",
                    f"{r.added:,}",
                    f"{r.removed:,}",
                    f"{r.refused:,}",
                    in_words(r.rules_added, r.rules_removed),
                    _links_blocked(r),
                    f"{r.duration:.2f} s",
                    _why(r),
                )
                for r in rows
            ),
        )
        return format_html(
            "<table class='feed-history'><thead><tr><th>When</th><th>Status</th><th>Entries"
            "</th><th>Added</th><th>Removed</th><th>Refused</th><th>Rules written</th>"
            "<th>Short links newly blocked</th><th>Took</th><th>Why / refused samples</th>"
            "</tr></thead><tbody>{}</tbody></table>",
            body,
        )

    # --- actions ----------------------------------------------------------------------
    @admin.action(description="Refresh selected feeds now", permissions=["change"])
    def refresh_now(self, request, queryset):
        feeds = [s for s in queryset if s.is_feed]
        jobs = [start_refresh(s, actor=request.user) for s in feeds]
        if len(jobs) == 1:
            return HttpResponseRedirect(
                reverse("admin:urlguard_source_refresh_job", args=[feeds[0].pk, jobs[0].pk])
            )
        self.message_user(request, f"Refreshing {counted(len(jobs), 'feed')}.", messages.INFO)
        return None

    @admin.action(description="Accept the held refresh of selected feeds", permissions=["change"])
    def accept_held_shrink(self, request, queryset):
        held = [s for s in queryset if s.held_at is not None]
        if not held:
            self.message_user(request, "None of them has a held shrink.", messages.WARNING)
            return None
        # Each accepts what its own refresh was held for (a shrink, or its impact).
        jobs = [
            start_refresh(
                s,
                actor=request.user,
                accept_shrink=not held_for_impact(s.held_reason),
                accept_impact=held_for_impact(s.held_reason),
            )
            for s in held
        ]
        if len(jobs) == 1:
            return HttpResponseRedirect(
                reverse("admin:urlguard_source_refresh_job", args=[held[0].pk, jobs[0].pk])
            )
        self.message_user(request, f"Applying {counted(len(jobs), 'held shrink')}.")
        return None

    @admin.action(description="Disable selected sources", permissions=["change"])
    def disable(self, request, queryset):
        n = _set_enabled(queryset, False, request.user)
        self.message_user(request, f"Disabled {counted(n, 'source')}; their rules stay listed.")

    @admin.action(description="Enable selected sources", permissions=["change"])
    def enable(self, request, queryset):
        n = _set_enabled(queryset, True, request.user)
        self.message_user(request, f"Enabled {counted(n, 'source')}.")

    def save_model(self, request, obj, form, change):
        with transaction.atomic(using=router.db_for_write(Source)):
            super().save_model(request, obj, form, change)
            if change and {"enabled", "is_allowlist"} & set(form.changed_data):
                _log_allowlist([obj.pk], request.user)

    def changelist_view(self, request, extra_context=None):
        if request.GET.get("kind__exact") == Source.Kind.FEED:
            extra_context = {**(extra_context or {}), "title": "Feeds"}
        return super().changelist_view(request, extra_context)

    # --- refresh now with progress ----------------------------------------------------
    def get_urls(self):
        return (
            tool_urls(
                self,
                [
                    ("<int:source_id>/refresh/", refresh_view, "refresh"),
                    ("<int:source_id>/refresh/<int:job_id>/", refresh_job_view, "refresh_job"),
                    ("refresh-status/<int:job_id>/", refresh_status_view, "refresh_status"),
                    ("test-fetch/", test_fetch_start_view, "test_fetch_start"),
                    ("test-fetch/<int:job_id>/", test_fetch_view, "test_fetch"),
                ],
            )
            + super().get_urls()
        )


def _set_enabled(queryset: Any, enabled: bool, actor: Any) -> int:
    # The selection's keys are read first: a changelist filtered on `enabled` would
    # select nothing once the update has run.
    with transaction.atomic(using=router.db_for_write(Source)):
        pks = list(queryset.values_list("pk", flat=True))
        n = Source.objects.filter(pk__in=pks).update(enabled=enabled)
        _log_allowlist(pks, actor)
    return n


def _allowlisted_hosts(source_pks: list[int]) -> list[str]:
    hosts = AllowedHost.objects.filter(source__in=source_pks)
    return list(hosts.values_list("host", flat=True).distinct())


def _log_allowlist(source_pks: list[int], actor: Any) -> None:
    """The hosts of sources just enabled, disabled or made (no longer) an allowlist
    entered or left the allowlist: into the change log with them, in the same
    transaction (the exports' positions carry it). record_allowlist writes rows only
    for hosts whose standing changed."""
    names = _allowlisted_hosts(source_pks)
    if names:
        changes.record_allowlist(names, actor=actor)


def _links_blocked(refresh: FeedRefresh) -> str:
    impact = refresh.impact
    if not impact:
        return ""
    if not impact.get("exact", True):
        return "not known"
    slugs = ", ".join(f"/{sample['slug']}" for sample in impact.get("samples", [])[:3])
    changed = int(impact.get("changed", 0))
    return f"{changed:,}" + (f": {slugs}" if slugs else "") + (" …" if changed > 3 else "")


def _why(refresh: FeedRefresh) -> str:
    if refresh.error:
        return refresh.error[:300]
    samples = "; ".join(f"line {n}: {reason[:120]}" for n, _, reason in refresh.refusals[:3])
    return samples


def _form_query(data: Any) -> str:
    fields = ("name", "kind", "url", "format", "category", "interval")
    return urlencode({name: data.get(name, "") for name in fields if data.get(name)})


@http_methods("POST")
def test_fetch_start_view(model_admin: SourceAdmin, request: HttpRequest) -> HttpResponse:
    """The subscribe form's "Test fetch" button: the form checked as for saving, then
    the fetch queued as a job; nothing is saved. A form with mistakes goes back, filled
    in, with them."""
    if not model_admin.has_add_permission(request):
        raise PermissionDenied
    form = model_admin.get_form(request)(request.POST)
    back = reverse("admin:urlguard_source_add") + "?" + _form_query(request.POST)
    if not form.is_valid():
        for field, errors in form.errors.items():
            label = (form.fields[field].label or field) if field in form.fields else ""
            for error in errors:
                messages.error(request, f"{label}: {error}" if label else str(error))
        return HttpResponseRedirect(back)
    if form.cleaned_data.get("kind") != Source.Kind.FEED:
        messages.error(request, "Only a feed has something to fetch.")
        return HttpResponseRedirect(back)
    job = start_test_fetch(form.cleaned_data, actor=request.user)
    return HttpResponseRedirect(reverse("admin:urlguard_source_test_fetch", args=[job.pk]))


@http_methods("GET")
def test_fetch_view(model_admin: SourceAdmin, request: HttpRequest, job_id: int) -> HttpResponse:
    if not model_admin.has_add_permission(request):
        raise PermissionDenied
    job = AdminJob.objects.filter(pk=job_id, kind=AdminJob.Kind.TEST_FETCH).first()
    if job is None:
        raise Http404(f"There is no test fetch #{job_id}.")
    params = job.params
    subscribe = (
        reverse("admin:urlguard_source_add")
        + "?"
        + _form_query(
            {
                **params,
                "kind": Source.Kind.FEED,
                "interval": human_interval(int(params.get("interval") or 3600)),
            }
        )
    )
    return render_tool(
        model_admin,
        request,
        "admin/urlguard/source/test_fetch.html",
        title=f"Test fetch #{job.number}: {params['url']}",
        job=job,
        status_url=reverse("admin:urlguard_source_refresh_status", args=[job.pk]),
        subscribe_url=subscribe,
    )


def _source(source_id: int) -> Source:
    source = Source.objects.filter(pk=source_id).first()
    if source is None:
        raise Http404(f"There is no source #{source_id}.")
    return source


@http_methods("POST")
def refresh_view(model_admin: SourceAdmin, request: HttpRequest, source_id: int) -> HttpResponse:
    source = _source(source_id)
    if not model_admin.has_change_permission(request, source):
        raise PermissionDenied
    if not source.is_feed:
        messages.error(request, f"{source.name} is a manual source: there is nothing to fetch.")
        return HttpResponseRedirect(reverse("admin:urlguard_source_change", args=[source.pk]))
    job = start_refresh(
        source,
        actor=request.user,
        accept_shrink="accept_shrink" in request.POST,
        accept_impact="accept_impact" in request.POST,
    )
    return HttpResponseRedirect(
        reverse("admin:urlguard_source_refresh_job", args=[source.pk, job.pk])
    )


def _job(source: Source, job_id: int) -> AdminJob:
    job = AdminJob.objects.filter(pk=job_id, kind=AdminJob.Kind.REFRESH).first()
    if job is None or job.params.get("source") != source.pk:
        raise Http404(f"There is no refresh job #{job_id} of {source.name}.")
    return job


@http_methods("GET")
def refresh_job_view(
    model_admin: SourceAdmin, request: HttpRequest, source_id: int, job_id: int
) -> HttpResponse:
    source = _source(source_id)
    if not model_admin.has_view_permission(request, source):
        raise PermissionDenied
    job = _job(source, job_id)
    return render_tool(
        model_admin,
        request,
        "admin/urlguard/source/refresh_job.html",
        title=f"Refresh of {source.name}",
        source=source,
        job=job,
        health=health_badge(source),
        status_url=reverse("admin:urlguard_source_refresh_status", args=[job.pk]),
        can_change=model_admin.has_change_permission(request, source),
        # The body's own lines only to a superuser: whoever can edit a feed's URL
        # must not be able to read what another address answers through this page.
        show_entries=request.user.is_superuser,
    )


@http_methods("GET")
def refresh_status_view(model_admin: SourceAdmin, request: HttpRequest, job_id: int):
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    job = AdminJob.objects.filter(
        pk=job_id, kind__in=(AdminJob.Kind.REFRESH, AdminJob.Kind.TEST_FETCH)
    ).first()
    if job is None:
        raise Http404(f"There is no refresh job #{job_id}.")
    return JsonResponse(
        {
            "id": job.pk,
            "kind": job.kind,
            "state": job.state,
            "done": job.done,
            "total": job.total,
            "message": job.message,
            "finished": job.state in (AdminJob.State.DONE, AdminJob.State.FAILED),
        }
    )


@admin.register(FeedHold)
class FeedHoldAdmin(admin.ModelAdmin):
    """New feed entries held for a person's yes (urlguard.feeds.holds): accepting one
    refreshes its feed, which then applies it."""

    list_display = ("expression", "source", "reasons", "held_at", "accepted_at")
    list_filter = ("source", ("accepted_at", admin.EmptyFieldListFilter))
    search_fields = ("expression",)
    readonly_fields = (
        "source",
        "expression",
        "category",
        "codes",
        "reasons",
        "held_at",
        "accepted_at",
        "accepted_by",
    )
    fields = readonly_fields
    actions = ["accept_holds"]

    def has_add_permission(self, request, obj=None):
        return False

    @admin.action(
        description="Accept: block them anyway (refreshes their feeds)", permissions=["change"]
    )
    def accept_holds(self, request, queryset):
        accepted = 0
        sources = Source.objects.filter(pk__in=queryset.values("source"))
        for source in sources:
            accepted += holds.accept(
                source,
                actor=request.user,
                expressions=queryset.filter(source=source).values_list("expression", flat=True),
            )
            start_refresh(source, actor=request.user)
        self.message_user(
            request,
            f"Accepted {counted(accepted, 'held entry')}; refreshing "
            f"{counted(len(sources), 'feed')} to apply them.",
            messages.INFO,
        )


# --- what the rules admin and the dashboard show of sources ---------------------------


class ListedByFilter(admin.SimpleListFilter):
    """The rules list filtered by the source that lists them."""

    title = "listed by"
    parameter_name = "listed_by"

    def lookups(self, request, model_admin):
        return [(str(pk), name) for pk, name in Source.objects.values_list("pk", "name")]

    def queryset(self, request, queryset):
        value = self.value()
        if value and value.isdigit():
            return queryset.filter(listings__source_id=int(value))
        return queryset


def listed_by(rule: Any) -> str:
    """A rule's sources, each linked to its page."""
    sources = list(Source.objects.filter(listings__rule=rule).order_by("name"))
    if not sources:
        return "no source (it stays until removed by hand)"
    return format_html_join(
        ", ",
        '<a href="{}">{}</a> <span class="help">({})</span>',
        (
            (reverse("admin:urlguard_source_change", args=[s.pk]), s.name, s.get_kind_display())
            for s in sources
        ),
    )


def feed_health_rows() -> list[dict[str, Any]]:
    """The dashboard's feed panel: every feed with its health and last numbers."""
    rows = []
    for source in Source.objects.filter(kind=Source.Kind.FEED).annotate(
        rules_listed=Count("listings")
    ):
        rows.append(
            {
                "source": source,
                "health": health_badge(source),
                "state": health(source),
                "age": age(source.last_refresh_at),
                "url": reverse("admin:urlguard_source_change", args=[source.pk]),
            }
        )
    return rows
