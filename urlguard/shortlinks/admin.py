"""The short-link admin (verdicts, rescan), registered only where short links are
installed."""

from django.contrib import admin

from urlguard.admin.links import ShortLinkAdmin
from urlguard.models import ShortLink

admin.site.register(ShortLink, ShortLinkAdmin)
