"""URL configuration. Admin pages are added by the admin's ModelAdmin.get_urls,
not here; the short-link catch-all comes last so it never shadows a page."""

from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from urlguard import api, health, linkshim, metrics, reports, views
from urlguard.exports import views as exports

site_patterns = [
    path("", views.home, name="home"),
    path("api/check", api.check, name="api-check"),
    # Also answered by health.ProbeMiddleware, before host validation and sessions.
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("continue", views.continue_anyway, name="continue"),
    # A trailing slash: "report" alone could be a short link's slug.
    path("report-mistake/", reports.report_view, name="report"),
    path("lists/<str:name>", exports.export_view, name="list"),
    path("go/", linkshim.guarded_redirect, name="guarded"),
    path("<slug:slug>", views.short_link, name="short-link"),
]

urlpatterns = [
    path("admin/", admin.site.urls),
    # Browsers ask for /favicon.ico where a page names no icon (JSON, plain text).
    path("favicon.ico", RedirectView.as_view(url=static("urlguard/favicon.svg"), permanent=True)),
    path("", include((site_patterns, "urlguard"))),
]
