"""urlguard: the Django service that checks every redirect against the spam list."""

from .celery import app as celery_app

__all__ = ["celery_app", "guarded_url"]


def __getattr__(name: str) -> object:
    # Lazily: the shim needs Django's URL resolver, which `import urlguard` must not.
    if name == "guarded_url":
        from urlguard.linkshim import guarded_url

        return guarded_url
    raise AttributeError(f"module 'urlguard' has no attribute {name!r}")
