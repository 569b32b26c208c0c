"""urlguard: a reusable Django app that checks every redirect a site makes against
a spam list (the middleware, the warning page, the admin, the management commands).
The standalone service built on it is urlguard_service."""

__all__ = ["guarded_url"]


def __getattr__(name: str) -> object:
    # Lazily: the shim needs Django's URL resolver, which `import urlguard` must not.
    if name == "guarded_url":
        from urlguard.hotpath.linkshim import guarded_url

        return guarded_url
    raise AttributeError(f"module 'urlguard' has no attribute {name!r}")
