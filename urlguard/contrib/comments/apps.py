"""The comments app's AppConfig: connects the hold to the comment model's saves."""

from __future__ import annotations

from django.apps import AppConfig


class CommentsConfig(AppConfig):
    name = "urlguard.contrib.comments"
    label = "urlguard_comments"
    verbose_name = "urlguard: held comments"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # In ready(): the comments app and our models are loaded only now.
        import django_comments
        from django.db.models.signals import post_delete, post_save, pre_save

        from urlguard.contrib.comments import holding

        # The site's comment model (COMMENTS_APP may name its own); saves, not the
        # posting view's signals, so a comment created in code is checked too.
        model = django_comments.get_model()
        pre_save.connect(holding.hold_if_listed, sender=model, dispatch_uid="urlguard-hold")
        post_save.connect(holding.record_hold, sender=model, dispatch_uid="urlguard-hold")
        post_delete.connect(holding.forget_hold, sender=model, dispatch_uid="urlguard-hold")
