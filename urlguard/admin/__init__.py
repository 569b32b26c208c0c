"""The operators' GUI, built on Django's admin: spam rules (add from a pasted URL with
a preview, import, check a URL, filter dashboard), short links (verdicts, rescan),
and the read-only change log. Every rule write goes through urlguard.changes."""

from django.contrib import admin

from urlguard.admin import (  # noqa: F401  (registers)
    allowlist,
    apikeys,
    changelog,
    changesets,
    hits,
    jobs,
    links,
    reportqueue,
    rules,
    sources,
)

# The product's name where Django would say "Django administration".
admin.site.site_header = "URL guard administration"
admin.site.site_title = "URL guard admin"
admin.site.index_title = "Spam rules, short links and the filter"
# The navigation sidebar repeats the home page's app list and takes 300 px of every
# change list: without it the lists' columns fit a 1280 px screen.
admin.site.enable_nav_sidebar = False
