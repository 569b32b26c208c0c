"""Django validators for what people post: a model or form field with
`validators=[validate_no_listed_links]` (or `NoListedLinksValidator(categories=...,
message=...)`) refuses text that links to a listed URL, with one ValidationError
(code "listed_link") naming each listed link and its category. The links are found
and checked by urlguard.content.check_text: one batch through the guard."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core.exceptions import ValidationError
from django.utils.deconstruct import deconstructible

__all__ = ["NoListedLinksValidator", "validate_no_listed_links"]

DEFAULT_MESSAGE = "Links to sites on the spam list are not allowed here: %(links)s."
UNCHECKED_MESSAGE = (
    "The links in this text could not be checked right now (%(links)s). Please try again "
    "in a few minutes."
)


@deconstructible(path="urlguard.validators.NoListedLinksValidator")
class NoListedLinksValidator:
    """Refuses text with a link on the spam list.

    categories: only rules of these categories refuse (e.g. ["phishing", "malware"]);
    None: every category. message: the error's text, where "%(links)s" names the
    listed links, each with its category."""

    code = "listed_link"

    def __init__(self, categories: Iterable[str] | None = None, message: str | None = None):
        # A site's models.py imports this module before the app registry is ready.
        from urlguard.models.rules import Category

        if isinstance(categories, str):
            raise TypeError(f"categories must be a list of category names, not {categories!r}")
        self.categories = None if categories is None else tuple(categories)
        unknown = sorted(set(self.categories or ()) - set(Category.values))
        if unknown:
            raise ValueError(
                f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
                f"the categories are {', '.join(Category.values)}"
            )
        self.message = message

    def __call__(self, value: Any) -> None:
        if value is None:
            return
        # The guard and the models: not importable while a site's models.py loads.
        from urlguard.content import TextTooLong, check_text

        try:
            verdicts = check_text(str(value), where="validator")
        except TextTooLong as exc:
            raise ValidationError(
                "This text is too long to be checked for links: %(length)s characters, at "
                "most %(most)s.",
                code="text_too_long",
                params={"length": f"{exc.length:,}", "most": f"{exc.most:,}"},
            ) from None
        listed = []
        unchecked = []
        for verdict in verdicts:
            if not verdict.blocked:
                continue
            if verdict.rule is None:  # ON_FILTER_ERROR "closed": refused unchecked
                unchecked.append(verdict.url)
            elif self.categories is None or verdict.category in self.categories:
                listed.append(f"{verdict.url} ({verdict.category_label})")
        if listed:
            raise ValidationError(
                self.message or DEFAULT_MESSAGE, code=self.code, params={"links": ", ".join(listed)}
            )
        if unchecked:
            raise ValidationError(
                UNCHECKED_MESSAGE, code="unchecked_link", params={"links": ", ".join(unchecked)}
            )

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, NoListedLinksValidator)
            and self.categories == other.categories
            and self.message == other.message
        )

    def __hash__(self) -> int:
        return hash((self.categories, self.message))


validate_no_listed_links = NoListedLinksValidator()
