"""The service's root URL configuration: the admin, the demo home page, the app's
pages (`urlguard.urls`, at the root as the check API's clients expect) and, last so
that it never shadows a page, the short-link catch-all."""

from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from urlguard_service import views

urlpatterns = [
    path("admin/", admin.site.urls),
    # Browsers ask for /favicon.ico where a page names no icon (JSON, plain text).
    path("favicon.ico", RedirectView.as_view(url=static("urlguard/favicon.svg"), permanent=True)),
    path("", views.home, name="home"),
    path("", include("urlguard.urls")),
    path("", include("urlguard.shortlinks.urls")),
]
