"""urlguard: a reusable Django app that checks every redirect a site makes against
a spam list (the middleware, the warning page, the admin, the management commands).
The standalone service built on it is urlguard_service.

The public surface, the names a host site may rely on (README: "The public surface"):

- `urlguard.middleware.RedirectGuardMiddleware`
- `urlguard.middleware.TrustedProxyMiddleware`
- `urlguard.validators.validate_no_listed_links`
- `urlguard.validators.NoListedLinksValidator`
- `urlguard.templatetags.urlguard.guarded`
- `urlguard.templatetags.urlguard.guard_links`
- `urlguard.guarded_url`
- `urlguard.content.find_links`
- `urlguard.content.check_text`
- `urlguard.content.TextTooLong`
- `urlguard.celery.configure`
- `urlguard.checks.refuse_to_start`
- `urlguard.urls`
- `urlguard.shortlinks`
- `urlguard.shortlinks.urls`
- `urlguard.contrib.comments`
- `settings.URLGUARD`
- `urlguard.E*`
- `urlguard.W*`

Everything else (every other module, class and function, and the management
commands' Python code) is internal: it may change in any release without notice."""

__all__ = ["guarded_url"]


def __getattr__(name: str) -> object:
    if name == "guarded_url":
        # Lazily: the shim needs Django's URL resolver, which `import urlguard` must not.
        from urlguard.hotpath.linkshim import guarded_url

        return guarded_url
    raise AttributeError(f"module 'urlguard' has no attribute {name!r}")
