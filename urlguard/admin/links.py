"""ShortLink admin: each destination's current verdict (one Guard.check_many per page),
click counts, and the rescan page that lists links now pointing to spam, with bulk
disabling."""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Sum
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils import formats, timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from urlguard import jobs, shortlinks
from urlguard.admin.forms import ShortLinkForm
from urlguard.admin.pages import (
    BatchAnnotatedChangeList,
    http_methods,
    parse_id,
    render_tool,
    report_job_outcome,
    tool_urls,
)
from urlguard.conf import conf
from urlguard.hotpath.guard import get_guard
from urlguard.models import AdminJob, Category, ShortLink, StatsLoss, database
from urlguard.shortlinks.rescan import was_checked
from urlguard.shortlinks.slugs import SlugError, create_short_link
from urlguard.wording import counted

# Disabling a link records why, so a later "why is my link dead?" has an answer.
DISABLED_REASON = "destination blocked by spam rule {expression}"
HITS_SHOWN = 500
# Messages the "check selected" action shows, one per blocked link, before it sums up.
CHECK_MESSAGES = 20


def _is(n: int) -> str:
    return "is" if n == 1 else "are"


def disable_links(reasons: dict[int, str]) -> int:
    """Disable the links {id: why} that are still enabled, in one transaction of
    batched UPDATEs (a rescan may find thousands); returns how many changed."""
    changed = 0
    with transaction.atomic():
        for batch in database.in_batches(list(reasons)):
            links = list(ShortLink.objects.filter(pk__in=batch, disabled=False).only("pk"))
            for link in links:
                link.disabled = True
                link.disabled_reason = reasons[link.pk][:200]
            ShortLink.objects.bulk_update(links, ["disabled", "disabled_reason"])
            changed += len(links)
    return changed


# Registered below, where the site runs short links (they are opt-in).
class ShortLinkAdmin(admin.ModelAdmin):
    # Short enough to fit beside the filter sidebar at 1280 px: with separate click and
    # visitor columns, "disabled" was scrolled out of sight.
    list_display = ("slug", "destination_short", "verdict", "disabled", "clicks", "created_on")
    list_filter = ("disabled", "created")
    search_fields = ("slug", "destination")
    readonly_fields = ("click_count", "unique_visitors", "created", "current_verdict")
    list_per_page = 100
    actions = ["disable_selected", "enable_selected", "check_selected"]
    form = ShortLinkForm

    def get_readonly_fields(self, request, obj=None):
        # A slug in circulation must keep pointing somewhere: it is not renamed here.
        return (*self.readonly_fields, "slug") if obj is not None else self.readonly_fields

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
            return
        # New links go through urlguard.shortlinks.slugs (slug allocation, destination checks).
        try:
            link = create_short_link(obj.destination, slug=obj.slug or None)
        except SlugError:
            # Taken between the form's check and now: allocate another, and say so.
            link = create_short_link(obj.destination)
            self.message_user(
                request,
                f"The slug {obj.slug!r} was taken meanwhile; the link got /{link.slug} instead.",
                messages.WARNING,
            )
        if obj.disabled:
            link.disabled, link.disabled_reason = True, obj.disabled_reason
            link.save(update_fields=["disabled", "disabled_reason"])
        obj.pk, obj.slug, obj.created = link.pk, link.slug, link.created
        obj._state.adding = False

    def get_changelist(self, request, **kwargs):
        return BatchAnnotatedChangeList

    def annotate_page(self, request, links: list[ShortLink]) -> None:
        verdicts = get_guard().check_many([link.destination for link in links])
        for link, verdict in zip(links, verdicts, strict=True):
            link.verdict_ = verdict  # type: ignore[attr-defined]

    @admin.display(description="destination", ordering="destination")
    def destination_short(self, obj: ShortLink) -> str:
        text = obj.destination
        return text if len(text) <= 60 else text[:57] + "…"

    @admin.display(description="created", ordering="created")
    def created_on(self, obj: ShortLink) -> str:
        return formats.date_format(timezone.localtime(obj.created), "Y-m-d")

    @admin.display(description="clicks", ordering="click_count")
    def clicks(self, obj: ShortLink) -> str:
        return format_html(
            '<span title="{} clicks, {} unique visitors">{}<br>'
            '<span class="help">{} unique</span></span>',
            f"{obj.click_count:,}",
            f"{obj.unique_visitors:,}",
            f"{obj.click_count:,}",
            f"{obj.unique_visitors:,}",
        )

    @admin.display(description="verdict")
    def verdict(self, obj: ShortLink) -> str:
        verdict = getattr(obj, "verdict_", None)
        if verdict is None:  # not on a change list page (e.g. the change form)
            verdict = get_guard().check_many([obj.destination])[0]
        if verdict.error:
            return format_html(
                '<span class="verdict verdict-invalid" title="{}">invalid URL</span>', verdict.error
            )
        if not was_checked(verdict, get_guard()):
            return format_html(
                '<span class="verdict verdict-degraded" title="{}">not checked '
                "(filter unreadable)</span>",
                verdict.reason,
            )
        if verdict.blocked and verdict.rule is not None:
            # The whole verdict, on two lines: the word, then the rule (wrapping
            # anywhere), never cut off by the column.
            return format_html(
                '<span class="verdict verdict-blocked">blocked ({})<br><code>{}</code></span>',
                verdict.rule.get_category_display(),
                verdict.rule.expression,
            )
        return mark_safe('<span class="verdict verdict-ok">ok</span>')

    @admin.display(description="current verdict")
    def current_verdict(self, obj: ShortLink) -> str:
        return self.verdict(obj)

    # --- actions ---------------------------------------------------------------------
    @admin.action(description="Disable selected short links", permissions=["change"])
    def disable_selected(self, request, queryset):
        links = list(queryset.filter(disabled=False).only("pk", "destination"))
        verdicts = get_guard().check_many([link.destination for link in links])
        changed = disable_links(
            {
                link.pk: (
                    DISABLED_REASON.format(expression=verdict.rule.expression)
                    if verdict.rule is not None
                    else "disabled by an administrator"
                )
                for link, verdict in zip(links, verdicts, strict=True)
            }
        )
        self.message_user(request, f"Disabled {counted(changed, 'short link')}.", messages.SUCCESS)

    @admin.action(description="Enable selected short links", permissions=["change"])
    def enable_selected(self, request, queryset):
        changed = queryset.filter(disabled=True).update(disabled=False, disabled_reason="")
        self.message_user(request, f"Enabled {counted(changed, 'short link')}.", messages.SUCCESS)

    @admin.action(description="Check selected destinations now", permissions=["view"])
    def check_selected(self, request, queryset):
        links = list(queryset.only("pk", "slug", "destination"))
        guard = get_guard()
        blocked, unchecked, invalid = [], 0, 0
        for link, verdict in zip(
            links, guard.check_many([x.destination for x in links]), strict=True
        ):
            if verdict.error:
                invalid += 1
            elif not was_checked(verdict, guard):
                unchecked += 1
            elif verdict.blocked and verdict.rule is not None:
                blocked.append((link, verdict))
        # One message per blocked link, up to a screenful; the rescan page lists all.
        for link, verdict in blocked[:CHECK_MESSAGES]:
            self.message_user(
                request,
                format_html(
                    "/{} → {} is blocked by {} ({}).",
                    link.slug,
                    link.destination,
                    verdict.rule.expression,
                    verdict.rule.get_category_display(),
                ),
                messages.WARNING,
            )
        if len(blocked) > CHECK_MESSAGES:
            self.message_user(
                request,
                f"… and {len(blocked) - CHECK_MESSAGES} more blocked "
                "destinations: a rescan lists them all.",
                messages.WARNING,
            )
        if unchecked:
            self.message_user(
                request,
                f"{counted(unchecked, 'destination')} could not be "
                "checked: the filter file is unreadable (see the filter "
                "dashboard).",
                messages.ERROR,
            )
        if invalid:
            self.message_user(
                request,
                f"{counted(invalid, 'destination')} {_is(invalid)} not a usable URL.",
                messages.WARNING,
            )
        clean = len(links) - len(blocked) - unchecked - invalid
        if clean:
            self.message_user(
                request, f"{counted(clean, 'destination')} {_is(clean)} clean.", messages.SUCCESS
            )

    def changelist_view(self, request, extra_context=None):
        # Clicks are written in batches (urlguard.runtime.stats): say how far the counts may
        # lag, and any clicks a node had to drop while its database was away.
        lost = StatsLoss.objects.filter(kind="clicks").aggregate(n=Sum("lost"))["n"] or 0
        context = {"clicks_lag": conf.STATS_FLUSH_INTERVAL, "clicks_lost": lost}
        return super().changelist_view(request, {**(extra_context or {}), **context})

    # --- the rescan page -------------------------------------------------------------
    def get_urls(self):
        return (
            tool_urls(
                self,
                [
                    ("rescan/", rescan_view, "rescan"),
                    ("rescan/disable/", rescan_disable_view, "rescan_disable"),
                ],
            )
            + super().get_urls()
        )


def rescan_view(model_admin: ShortLinkAdmin, request: HttpRequest) -> HttpResponse:
    """GET: the latest rescan (running: its progress; done: the links that point to
    spam). POST: start a new rescan (needs the change permission)."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    if request.method == "POST":
        # Starting one is a change: the job first applies pending changes to the filter
        # file and then writes its findings, so viewing is not enough.
        if not model_admin.has_change_permission(request):
            raise PermissionDenied
        started = jobs.start_rescan(actor=request.user)
        report_job_outcome(request, started, "Rescan queued; this page shows its progress.")
        return HttpResponseRedirect(
            reverse("admin:urlguard_shortlink_rescan") + f"?job={started.pk}"
        )
    rescans = AdminJob.objects.filter(kind=AdminJob.Kind.RESCAN)
    job_id = parse_id(request.GET.get("job"))
    job = (rescans.filter(pk=job_id).first() if job_id else None) or rescans.first()
    hits = []
    hit_count = 0
    if job is not None and job.state == AdminJob.State.DONE:
        hit_count = len(job.result.get("hits", []))
        # One page of checkboxes (a form with thousands of fields exceeds Django's
        # DATA_UPLOAD_MAX_NUMBER_FIELDS); "disable all" covers the rest.
        hits = job.result.get("hits", [])[:HITS_SHOWN]
        # The disabled flag may have changed since the scan: show it as it is now.
        current = dict(
            ShortLink.objects.filter(pk__in=[h["link_id"] for h in hits]).values_list(
                "pk", "disabled"
            )
        )
        labels = dict(Category.choices)
        hits = [
            {
                **h,
                "disabled": current.get(h["link_id"], True),
                "gone": h["link_id"] not in current,
                "category_label": labels.get(h["category"], h["category"]),
            }
            for h in hits
        ]
    return render_tool(
        model_admin,
        request,
        "admin/urlguard/shortlink/rescan.html",
        title="Rescan short links",
        job=job,
        hits=hits,
        hit_count=hit_count,
        can_change=model_admin.has_change_permission(request),
        status_url=(
            reverse("admin:urlguard_spamrule_job_status", args=[job.pk]) if job is not None else ""
        ),
    )


@http_methods("POST")
def rescan_disable_view(model_admin: ShortLinkAdmin, request: HttpRequest) -> HttpResponse:
    if not model_admin.has_change_permission(request):
        raise PermissionDenied
    job_id = parse_id(request.POST.get("job"))
    job = AdminJob.objects.filter(pk=job_id, kind=AdminJob.Kind.RESCAN).first() if job_id else None
    every = "all" in request.POST  # the "Disable all … found" button
    selected = {pk for pk in map(parse_id, request.POST.getlist("link")) if pk}
    if job is None or not (selected or every):
        messages.warning(request, "Select the links to disable first.")
    else:
        # Only links the scan found: a forged id cannot disable an unrelated link.
        changed = disable_links(
            {
                h["link_id"]: DISABLED_REASON.format(expression=h["expression"])
                for h in job.result.get("hits", [])
                if every or h["link_id"] in selected
            }
        )
        messages.success(request, f"Disabled {counted(changed, 'short link')}.")
    target = reverse("admin:urlguard_shortlink_rescan")
    return HttpResponseRedirect(f"{target}?job={job.pk}" if job is not None else target)


# Only a site that runs short links has their admin (and their URLs it links to).
if shortlinks.installed():
    admin.site.register(ShortLink, ShortLinkAdmin)
