"""The app's pages, to include under any prefix in a site's urls:

    path("guard/", include("urlguard.urls"))

Everything is reversed through the namespace (`urlguard:report` ...), so the warning
page's links work wherever this is included. Admin pages come from the ModelAdmins;
short links are `urlguard.shortlinks.urls`, included only by a site that wants them."""

from django.urls import path

from urlguard.exports import views as exports
from urlguard.hotpath import continuation, linkshim
from urlguard.operations import api, health
from urlguard.reports import views as reports
from urlguard.safebrowsing import views as safebrowsing

app_name = "urlguard"

urlpatterns = [
    path("api/check", api.check, name="api-check"),
    path("api/check-text", api.check_text, name="api-check-text"),
    # Also answered by health.ProbeMiddleware (where installed), before host validation
    # and sessions.
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics_view, name="metrics"),
    path("continue", continuation.continue_anyway, name="continue"),
    # A trailing slash: "report" alone could be a short link's slug.
    path("report-mistake/", reports.report_view, name="report"),
    path("lists/<str:name>", exports.export_view, name="list"),
    path("go/", linkshim.guarded_redirect, name="guarded"),
    # Safe Browsing v4 Update API: the protocol's own paths, the key in ?key=.
    path(
        "safebrowsing/v4/threatListUpdates:fetch",
        safebrowsing.threat_list_updates,
        name="safebrowsing-updates",
    ),
    path("safebrowsing/v4/fullHashes:find", safebrowsing.full_hashes, name="safebrowsing-find"),
    path("safebrowsing/v4/threatLists", safebrowsing.threat_lists, name="safebrowsing-lists"),
]
