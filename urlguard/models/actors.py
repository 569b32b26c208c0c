"""Who did it: `actor` everywhere in the Python code (keyword arguments, attributes),
the name the change log's rows (ChangeSet.actor, ChangeEvent.actor) already give it;
and the user a row may name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias, cast

if TYPE_CHECKING:
    # User: the model settings.AUTH_USER_MODEL names, as django-stubs resolves the
    # foreign keys to it under the settings mypy runs with.
    from django.contrib.auth.models import AnonymousUser, User

#: A user a row refers to (ChangeSet.actor, AdminJob.created_by, ...), or None.
UserOrNone: TypeAlias = "User | None"
#: Who acts, as callers of the write path name them: a user, request.user of a request
#: nobody logged into (AnonymousUser), or None (a task, a command). Only a logged-in
#: user becomes a row's actor.
Actor: TypeAlias = "User | AnonymousUser | None"


def row_user(actor: Actor) -> UserOrNone:
    """The user a row may name for `actor`: a logged-in user, else None."""
    if actor is None or not getattr(actor, "is_authenticated", False):
        return None
    return cast(UserOrNone, actor)  # AnonymousUser is never authenticated


def actor_alias(column: str) -> Any:
    """`actor` on a model whose who-did-it column has another name (read, set, and a
    keyword of the model's constructor); queries name the column itself."""
    # The column keeps its name: nodes of two releases share the table.

    def get(row: Any) -> UserOrNone:
        return cast(UserOrNone, getattr(row, column))

    def set_(row: Any, value: UserOrNone) -> None:
        setattr(row, column, value)

    return property(get, set_, doc=f"Who did it: the `{column}` column.")
