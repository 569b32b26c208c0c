"""The reason of a hold in the admin: a column and a field of the comments admin
(django_comments' own, extended), and the list of held comments on its own."""

from __future__ import annotations

from typing import Any

# django_comments.admin first: it registers the comments admin, which this extends.
import django_comments
import django_comments.admin
from django.contrib import admin
from django.contrib.contenttypes.models import ContentType
from django.db.models import CharField, OuterRef, QuerySet, Subquery
from django.db.models.functions import Cast
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html

from urlguard.contrib.comments.models import HeldComment

HOLD_LABEL = "held by urlguard"


@admin.register(HeldComment)
class HeldCommentAdmin(admin.ModelAdmin):
    list_display = ("held_at", "comment_link", "reason")
    readonly_fields = ("comment_type", "comment_pk", "held_at", "reason")
    search_fields = ("reason",)

    @admin.display(description="comment")
    def comment_link(self, hold: HeldComment) -> str:
        try:
            url = reverse(
                f"admin:{hold.comment_type.app_label}_{hold.comment_type.model}_change",
                args=[hold.comment_pk],
            )
        except NoReverseMatch:
            return hold.comment_pk
        return format_html('<a href="{}">{}</a>', url, hold.comment_pk)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


def _with_hold_reason(base: type[admin.ModelAdmin]) -> type[admin.ModelAdmin]:
    class CommentsAdminWithHold(base):  # type: ignore[valid-type, misc]
        def get_queryset(self, request: HttpRequest) -> QuerySet:
            holds = HeldComment.objects.filter(
                comment_type=ContentType.objects.get_for_model(self.model),
                comment_pk=Cast(OuterRef("pk"), CharField()),
            )
            return (
                super()
                .get_queryset(request)
                .annotate(urlguard_hold_reason=Subquery(holds.values("reason")[:1]))
            )

        def get_list_display(self, request: HttpRequest) -> Any:
            return (*super().get_list_display(request), "urlguard_hold")

        def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
            return (*super().get_readonly_fields(request, obj), "urlguard_hold")

        def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
            return (
                *super().get_fieldsets(request, obj),
                (HOLD_LABEL, {"fields": ["urlguard_hold"]}),
            )

        @admin.display(description=HOLD_LABEL)
        def urlguard_hold(self, comment: Any) -> str:
            return getattr(comment, "urlguard_hold_reason", None) or ""

    return CommentsAdminWithHold


_comment_model = django_comments.get_model()
if admin.site.is_registered(_comment_model):
    _base = type(admin.site.get_model_admin(_comment_model))
    admin.site.unregister(_comment_model)
    admin.site.register(_comment_model, _with_hold_reason(_base))
