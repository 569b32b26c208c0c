"""The hit log: each warning shown and each "continue anyway", newest first, with
where the redirect came from, the destination, the rule (its expression kept after
the rule is gone) and its category; filtered by rule, link or host (each a click in
its row), and from an event on to the rule, its removal, a narrower rule, or the
allowlist. Read-only: events are written by urlguard.hotpath.hitlog."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from urlguard.admin.pages import BatchAnnotatedChangeList
from urlguard.models import HitEvent, SpamRule


@admin.register(HitEvent)
class HitEventAdmin(admin.ModelAdmin):
    list_display = ("when", "action", "from_where", "host_link", "rule", "category", "act")
    list_filter = ("action", "category")
    search_fields = ("where", "host", "expression", "destination")
    date_hierarchy = "at"
    list_per_page = 100
    show_full_result_count = False  # a count of 100,000 rows on every page is waste

    def get_changelist(self, request, **kwargs):
        return BatchAnnotatedChangeList

    def annotate_page(self, request: HttpRequest, events: list[HitEvent]) -> None:
        """Which of the page's rules still exist: one query a page."""
        ids = {e.rule_id for e in events if e.rule_id is not None}
        live = set(SpamRule.objects.filter(pk__in=ids).values_list("pk", flat=True))
        for event in events:
            event.rule_live = event.rule_id in live  # type: ignore[attr-defined]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def lookup_allowed(self, lookup, value, request=None):
        if lookup in ("rule_id", "where", "host"):
            return True
        return super().lookup_allowed(lookup, value, request)

    def _filtered(self, **query: object) -> str:
        return reverse("admin:urlguard_hitevent_changelist") + "?" + urlencode(query)

    @admin.display(description="when", ordering="at")
    def when(self, obj: HitEvent) -> str:
        return timezone.localtime(obj.at).strftime("%Y-%m-%d %H:%M:%S")

    @admin.display(description="from", ordering="where")
    def from_where(self, obj: HitEvent) -> str:
        if not obj.where:
            return "—"
        return format_html('<a href="{}">{}</a>', self._filtered(where=obj.where), obj.where)

    @admin.display(description="destination host", ordering="host")
    def host_link(self, obj: HitEvent) -> str:
        return format_html(
            '<a href="{}" title="{}">{}</a>',
            self._filtered(host=obj.host),
            obj.destination,
            obj.host,
        )

    @admin.display(description="rule")
    def rule(self, obj: HitEvent) -> str:
        if obj.rule_id is None:
            return "—"
        removed = "" if getattr(obj, "rule_live", True) else " (removed)"
        return format_html(
            '<a href="{}"><code class="expression">{}</code></a>{}',
            self._filtered(rule_id=obj.rule_id),
            obj.expression or f"rule #{obj.rule_id}",
            removed,
        )

    @admin.display(description="act")
    def act(self, obj: HitEvent) -> str:
        links: list[tuple[str, str, str]] = []
        if obj.rule_id is not None and getattr(obj, "rule_live", False):
            links.append(
                (reverse("admin:urlguard_spamrule_change", args=[obj.rule_id]), "hit-rule", "Rule")
            )
            links.append(
                (
                    reverse("admin:urlguard_spamrule_delete", args=[obj.rule_id]),
                    "hit-remove",
                    "Remove…",
                )
            )
            narrow = {"url": obj.destination, "replace": obj.rule_id}
            links.append(
                (
                    reverse("admin:urlguard_spamrule_add") + "?" + urlencode(narrow),
                    "hit-narrow",
                    "Narrow…",
                )
            )
        if obj.host:
            allow = reverse("admin:urlguard_allowedhost_add") + "?" + urlencode({"host": obj.host})
            links.append((allow, "hit-allowlist", "Allowlist…"))
        return format_html_join(
            " ", '<a class="button {}" href="{}">{}</a>', ((c, u, t) for u, c, t in links)
        )

    def changelist_view(self, request: HttpRequest, extra_context=None):
        extra_context = {**(extra_context or {}), "title": "Hit log: warnings shown, newest first"}
        return super().changelist_view(request, extra_context)
