"""Moved to urlguard.models.database, beneath every package that uses it (the models
among them); this path re-exports it for the modules that still import it here."""

from urlguard.models.database import *  # noqa: F403
from urlguard.models.database import __all__ as __all__
