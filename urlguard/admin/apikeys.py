"""API keys of the batch check API: created here (the key shown once, on the page
that follows, and never stored), revoked by an action, last use shown."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from urlguard.models import APIKey
from urlguard.operations.apikeys import new_key, revoke
from urlguard.wording import counted


@admin.register(APIKey)
class APIKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "prefix", "created", "last_used_at", "revoked_at")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    search_fields = ("name", "prefix")
    readonly_fields = ("prefix", "created", "last_used_at", "revoked_at")
    actions = ["revoke_keys"]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Revoked, not deleted: the name and the last use stay for the record.
        return False

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return ["name"] if obj is None else ["name", *self.readonly_fields]

    def save_model(self, request: HttpRequest, obj: APIKey, form: Any, change: bool) -> None:
        if not change:
            secret, obj.prefix, obj.key_hash = new_key()
            request._urlguard_new_api_key = secret  # type: ignore[attr-defined]
        super().save_model(request, obj, form, change)

    def response_add(self, request: HttpRequest, obj: APIKey, *args: Any) -> HttpResponse:
        secret = getattr(request, "_urlguard_new_api_key", None)
        if secret is None:
            return super().response_add(request, obj, *args)
        response = TemplateResponse(
            request,
            "admin/urlguard/apikey/key_created.html",
            {**self.admin_site.each_context(request), "key": obj, "secret": secret},
        )
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description="Revoke the selected API keys", permissions=["change"])
    def revoke_keys(self, request: HttpRequest, queryset: Any) -> None:
        done = revoke(queryset)
        self.message_user(request, f"Revoked {counted(done, 'API key')}.", messages.SUCCESS)
