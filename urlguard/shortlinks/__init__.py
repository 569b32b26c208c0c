"""Short links, an opt-in part of urlguard: a site that wants its own `/<slug>`
redirects adds "urlguard.shortlinks" to INSTALLED_APPS (after "urlguard") and
`path("", include("urlguard.shortlinks.urls"))` last in its urls. Without it a site
gets no slug route and no short-link admin, so nothing fills the click buffers or
runs the link cache.

The models stay in the urlguard app (label and tables unchanged, so no database
moves): the rules' impact previews and the rescan read them, and simply find none
in a site that has no short links."""


def installed() -> bool:
    """Whether this site runs short links (has "urlguard.shortlinks" installed)."""
    from django.apps import apps  # here: `apps` at the top is our apps.py once it loads

    return apps.is_installed("urlguard.shortlinks")
