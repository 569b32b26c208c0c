"""urlguard: the Django service that checks every redirect against the spam list."""

from .celery import app as celery_app

__all__ = ["celery_app"]
