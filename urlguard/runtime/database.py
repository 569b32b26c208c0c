"""Moved to urlguard.models.database, beneath every package that uses it (the models
among them). This path re-exports it for the modules other branches were editing when
it moved, until they import it from there."""

from urlguard.models.database import *  # noqa: F403
from urlguard.models.database import __all__ as __all__
