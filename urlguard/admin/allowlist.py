"""The Allowlist admin: hosts feeds may never block whole, each with its note and who
added it when. Adding a host withdraws at once the feed listings that block it (and
says which rules a person listed, left to them); deleting it lists them again. Hosts
an allowlist feed lists are shown beside them, read-only (the feed's refresh keeps
them)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from urlguard.models import AllowedHost, AllowlistRefusal
from urlguard.wording import counted
from urlguard.writepath.allowlist import AllowResult, allow_host, covering, host_of, unallow_host
from urlguard.writepath.rules import RuleError


class AllowedHostForm(forms.ModelForm):
    class Meta:
        model = AllowedHost
        fields = ("host", "note")
        labels = {"host": "Host"}
        help_texts = {
            "host": "A host, e.g. github.com (or paste a URL on it). Feeds may then not "
            "block it, or a parent domain of it, whole; rules on its paths stay.",
            "note": "Why: shown to whoever looks at this entry later.",
        }
        widgets = {"host": forms.TextInput(attrs={"size": 50, "autofocus": True})}

    def clean_host(self) -> str:
        if self.instance.pk is not None:  # the host of an entry is not edited
            return self.instance.host
        try:
            host = host_of(self.cleaned_data["host"])
        except RuleError as exc:
            raise forms.ValidationError(str(exc)) from None
        if AllowedHost.objects.filter(source=None, host=host).exists():
            raise forms.ValidationError(f"{host} is already on the allowlist.")
        return host


@admin.register(AllowedHost)
class AllowedHostAdmin(admin.ModelAdmin):
    form = AllowedHostForm
    list_display = ("host", "note", "listed_by", "added_by", "created", "keeps_out")
    list_filter = (("source", admin.EmptyFieldListFilter),)
    search_fields = ("host", "note")
    list_select_related = ("source", "added_by")
    readonly_fields = ("listed_by", "added_by", "created", "keeps_out")
    fieldsets = (
        (None, {"fields": ("host", "note")}),
        ("Who and when", {"fields": ("listed_by", "added_by", "created", "keeps_out")}),
    )

    def get_fieldsets(self, request, obj=None):
        return self.fieldsets[:1] if obj is None else self.fieldsets

    def get_readonly_fields(self, request, obj=None):
        if obj is not None:
            return ("host", *self.readonly_fields)
        return self.readonly_fields

    def has_change_permission(self, request, obj=None):
        if obj is not None and obj.source_id is not None:
            return False  # its feed's next refresh would undo the edit
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        if obj is not None and obj.source_id is not None:
            return False
        return super().has_delete_permission(request, obj)

    @admin.display(description="listed by", ordering="source__name")
    def listed_by(self, obj: AllowedHost) -> str:
        if obj.source_id is None:
            return "by hand"
        url = reverse("admin:urlguard_source_change", args=[obj.source_id])
        return format_html('the feed <a href="{}">{}</a>', url, obj.source.name)  # type: ignore[union-attr]

    @admin.display(description="feed listings it keeps out")
    def keeps_out(self, obj: AllowedHost) -> str:
        rows = AllowlistRefusal.objects.filter(expression__in=covering(obj.host)).select_related(
            "source"
        )
        pairs = [(row.expression, row.source.name) for row in rows[:20]]
        if not pairs:
            return "none"
        return format_html_join(", ", "{} <span class='help'>({})</span>", pairs)

    def save_model(self, request: HttpRequest, obj: AllowedHost, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        result = allow_host(obj.host, note=obj.note, actor=request.user)
        entry = result.entry
        assert entry is not None
        obj.pk, obj.created, obj.actor = entry.pk, entry.created, entry.actor
        obj._state.adding = False
        _report(request, result, f"Allowlisted {result.host}.")

    def delete_model(self, request: HttpRequest, obj: AllowedHost) -> None:
        result = unallow_host(obj.host, actor=request.user)
        _report(request, result, f"Took {result.host} off the allowlist.")

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for entry in queryset.filter(source=None):
            self.delete_model(request, entry)


def _report(request: HttpRequest, result: AllowResult, head: str) -> None:
    lines = result.lines(left=False)
    if result.change_set is not None:
        url = reverse("admin:urlguard_changeset_change", args=[result.change_set.pk])
        link = format_html(' <a href="{}">Change set #{}</a>.', url, result.change_set.pk)
    else:
        link = mark_safe("")
    if lines:
        messages.success(request, format_html("{} {}.{}", head, "; ".join(lines[:3]), link))
    else:
        messages.success(request, format_html("{} No feed listing changed.{}", head, link))
    for rule in result.left:
        url = reverse("admin:urlguard_spamrule_change", args=[rule.pk])
        messages.warning(
            request,
            format_html(
                '<a href="{}">{}</a> still blocks {}: a person or an import listed it, '
                "so it is left to you.",
                url,
                rule.expression,
                result.host,
            ),
        )
    if len(result.withdrawn) > 3:
        messages.info(request, f"{counted(len(result.withdrawn), 'feed listing')} withdrawn.")
