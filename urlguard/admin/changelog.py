"""The audit trail, read-only: every ChangeEvent (who, what, when) with the nodes
whose filter has applied it, and what each node last reported."""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils import formats, timezone
from django.utils.html import format_html, format_html_join

from urlguard.admin.pages import BatchAnnotatedChangeList
from urlguard.models import ChangeEvent, NodeStatus
from urlguard.wording import duration, micros_date


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows written only by the service: viewable, never added, edited or deleted here."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(ChangeEvent)
class ChangeEventAdmin(ReadOnlyAdmin):
    # "when" is compact and "applied on" comes right after what changed, so the row
    # fits beside the filter sidebar at 1280 px (the admin's own date format and this
    # order pushed "applied on" out of sight).
    list_display = (
        "seq",
        "action",
        "expression",
        "applied_on",
        "actor",
        "when",
        "category",
        "in_change_set",
    )
    list_filter = ("action", "category", "source", "created")
    search_fields = ("expression",)
    list_select_related = ("actor", "change_set")
    list_per_page = 100

    def get_changelist(self, request, **kwargs):
        return BatchAnnotatedChangeList

    def annotate_page(self, request, events: list[ChangeEvent]) -> None:
        nodes = list(NodeStatus.objects.order_by("node").values_list("node", "applied_seq"))
        for event in events:
            event.applied_nodes_ = [name for name, seq in nodes if seq >= event.seq]  # type: ignore[attr-defined]
            event.pending_nodes_ = [name for name, seq in nodes if seq < event.seq]  # type: ignore[attr-defined]

    def lookup_allowed(self, lookup, value, request=None):
        # A change set's page links here for its rules (too many sets for a filter).
        return lookup == "change_set__id__exact" or super().lookup_allowed(lookup, value, request)

    @admin.display(description="change set", ordering="change_set")
    def in_change_set(self, obj: ChangeEvent) -> str:
        if obj.change_set_id is None:
            return obj.source
        return format_html(
            '<a href="{}">#{}</a> {}',
            reverse("admin:urlguard_changeset_change", args=[obj.change_set_id]),
            obj.change_set_id,
            obj.change_set.get_kind_display() if obj.change_set else "",
        )

    @admin.display(description="when", ordering="created")
    def when(self, obj: ChangeEvent) -> str:
        return formats.date_format(timezone.localtime(obj.created), "Y-m-d H:i:s")

    @admin.display(description="applied on")
    def applied_on(self, obj: ChangeEvent) -> str:
        applied = getattr(obj, "applied_nodes_", None)
        if applied is None:  # the detail page: one object, one query is fine
            self.annotate_page(None, [obj])
            applied = obj.applied_nodes_  # type: ignore[attr-defined]
        pending = obj.pending_nodes_  # type: ignore[attr-defined]
        if not applied and not pending:
            return "no node has reported yet"
        parts = format_html_join(
            ", ", '<span class="node-applied">{}</span>', ((n,) for n in applied)
        )
        if pending:
            parts = format_html(
                '{}{}<span class="node-pending">pending: {}</span>',
                parts,
                "; " if applied else "",
                ", ".join(pending),
            )
        return parts

    readonly_fields = (
        "seq",
        "action",
        "expression",
        "added_at_text",
        "category",
        "note",
        "actor",
        "source",
        "change_set",
        "created",
        "applied_on",
    )

    @admin.display(description="rule added at", ordering="added_at")
    def added_at_text(self, obj: ChangeEvent) -> str:
        # added_at is the rule's filter id in microseconds: shown as the time it is.
        return f"{micros_date(obj.added_at)} (id {obj.added_at})"


@admin.register(NodeStatus)
class NodeStatusAdmin(ReadOnlyAdmin):
    list_display = (
        "node",
        "applied_seq",
        "is_clean",
        "last_rebuild_at",
        "rebuild_took",
        "reported_at",
        "last_error",
    )
    readonly_fields = (
        "node",
        "filter_path",
        "applied_seq",
        "is_clean",
        "info",
        "last_rebuild_at",
        "rebuild_took",
        "last_error",
        "reported_at",
    )

    @admin.display(description="rebuild took", ordering="last_rebuild_seconds")
    def rebuild_took(self, obj: NodeStatus) -> str:
        return duration(obj.last_rebuild_seconds)
