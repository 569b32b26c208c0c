"""The links people post: `find_links(text)` finds every link a reader could follow
in plain text, `check_text(text)` checks them all in one batch through the guard
(the redirect's canonicalization, roll-ups and confirmation). The validators
(urlguard.validators), the `guard_links` template filter, the comments app
(urlguard.contrib.comments) and `POST api/check-text` are built on these."""

from urlguard.content.check import check_text, listed_links
from urlguard.content.links import TextTooLong, find_links

__all__ = ["TextTooLong", "check_text", "find_links", "listed_links"]
