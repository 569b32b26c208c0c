"""The short-link catch-all, `path("", include("urlguard.shortlinks.urls"))`: include
it last, so that it never shadows a page."""

from django.urls import path

from urlguard.shortlinks.views import short_link

urlpatterns = [
    path("<slug:slug>", short_link, name="short-link"),
]
