"""The hold: before a public comment is saved, new or with its text changed, its text
and the commenter's website are checked (urlguard.content.check_text); one with a
listed link, or one that could not be checked, is saved not public, and after the
save the reason is recorded (HeldComment). Posting never fails for it: at worst the
comment waits for a moderator."""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import models

from urlguard.content import TextTooLong, check_text
from urlguard.contrib.comments.models import HeldComment

logger = logging.getLogger(__name__)

_REASON = "_urlguard_hold_reason"


def hold_reason(text: str, *, where: str) -> str:
    """Why a comment with `text` must wait for a moderator; "" if it need not."""
    try:
        verdicts = check_text(text, where=where)
    except TextTooLong as exc:
        return f"not checked for links: {exc}"
    except Exception:
        logger.exception("urlguard: checking the links of a %s failed; it is held", where)
        return "its links could not be checked (the error is in the log)"
    reasons = []
    for verdict in verdicts:
        if not verdict.blocked:
            continue
        if verdict.rule is None:
            reasons.append(f"{verdict.url} could not be checked ({verdict.reason})")
        else:
            reasons.append(
                f"links to {verdict.url}, listed as {verdict.category_label} "
                f"(rule {verdict.rule.expression})"
            )
    return "; ".join(reasons)


def _linked_text(comment: Any) -> str:
    """What of a comment a page shows as links: its text, and the commenter's website
    (the form's "url", which most sites link the name to)."""
    return "\n".join(str(getattr(comment, name, "") or "") for name in ("comment", "user_url"))


def hold_if_listed(sender: type[models.Model], instance: Any, raw: bool = False, **kwargs: Any):
    """pre_save of the comment model: a public comment with a listed link is held when
    it is new or its text changed (an edit after publication); one a moderator
    approved as it stands is not held again."""
    if raw or not getattr(instance, "is_public", False):
        return
    text = _linked_text(instance)
    if not instance._state.adding:
        saved = sender._default_manager.filter(pk=instance.pk).first()
        if saved is not None and _linked_text(saved) == text:
            return
    on = (
        ContentType.objects.get_for_id(instance.content_type_id) if instance.content_type_id else ""
    )
    reason = hold_reason(text, where=f"comment on {on} {instance.object_pk}")
    if reason:
        instance.is_public = False
        setattr(instance, _REASON, reason)


def record_hold(sender: type[models.Model], instance: Any, created: bool = False, **kwargs: Any):
    """post_save of the comment model: the reason of a hold, kept for the admin."""
    reason = getattr(instance, _REASON, "")
    if not reason:
        return
    delattr(instance, _REASON)
    HeldComment.objects.update_or_create(
        comment_type=ContentType.objects.get_for_model(sender),
        comment_pk=str(instance.pk),
        defaults={"reason": reason},
    )


def forget_hold(sender: type[models.Model], instance: Any, **kwargs: Any) -> None:
    """post_delete of the comment model: its hold goes with it."""
    HeldComment.objects.filter(
        comment_type=ContentType.objects.get_for_model(sender), comment_pk=str(instance.pk)
    ).delete()
