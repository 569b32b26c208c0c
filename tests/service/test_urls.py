"""urlguard.urls works under any prefix a site gives it, and short links are the
opt-in urlguard.shortlinks' (the app's include has no slug route)."""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.contrib import admin
from django.http import HttpResponse
from django.urls import Resolver404, include, path, resolve, reverse

import urlguard.urls
from tests.support.webfakes import SetFilter
from urlguard.hotpath.guard import Guard
from urlguard.models import ShortLink
from urlguard.writepath.changes import add_rule


def leave(request):
    response = HttpResponse(status=302)
    response["Location"] = "https://login.evil.example/account"
    return response


urlpatterns = [path("leave", leave), path("somewhere/guard/", include("urlguard.urls"))]

pytestmark = pytest.mark.django_db


@pytest.mark.urls(__name__)
def test_the_warning_pages_links_follow_the_prefix(client, use_guard):
    fake = SetFilter()
    use_guard(Guard(lambda: fake))
    fake.add(add_rule("evil.example/", category="phishing", source="test").expression)
    warning = client.get("/leave")
    assert warning.status_code == 403
    body = unescape(warning.content.decode())
    continue_url = re.search(r'href="(/[^"]*continue\?token=[^"]+)"', body).group(1)
    report_url = re.search(r'href="(/[^"]*report-mistake/\?token=[^"]+)"', body).group(1)
    assert continue_url.startswith("/somewhere/guard/continue?")
    assert report_url.startswith("/somewhere/guard/report-mistake/?")
    assert client.get(report_url).status_code == 200
    followed = client.get(continue_url)
    assert followed.status_code == 302
    assert followed["Location"] == "https://login.evil.example/account"


@pytest.mark.urls(__name__)
def test_every_page_of_the_include_is_reversed_by_namespace():
    assert urlguard.urls.app_name == "urlguard"
    for name in ("api-check", "healthz", "readyz", "metrics", "continue", "report"):
        assert reverse(f"urlguard:{name}").startswith("/somewhere/guard/")


@pytest.mark.urls(__name__)
def test_the_include_has_no_short_link_route():
    with pytest.raises(Resolver404):
        resolve("/somewhere/guard/some-slug")


def test_the_service_opts_in_to_short_links(client):
    """The service installs urlguard.shortlinks: its slug route, last, and its admin."""
    ShortLink.objects.create(slug="py", destination="https://www.python.org/")
    assert resolve("/py").url_name == "short-link"
    assert resolve("/healthz").url_name == "healthz"
    assert admin.site.is_registered(ShortLink)
    assert type(admin.site._registry[ShortLink]).__module__ == "urlguard.admin.links"


@pytest.mark.usefixtures("fresh_guard")
def test_an_import_in_a_site_without_short_links_starts_no_rescan(editor, committed, monkeypatch):
    from django.core.files.uploadedfile import SimpleUploadedFile

    import urlguard.shortlinks
    from urlguard.models import AdminJob

    monkeypatch.setattr(urlguard.shortlinks, "installed", lambda: False)
    upload = SimpleUploadedFile("feed.txt", b"spam-one.example.com\n")
    editor.post(
        reverse("admin:urlguard_spamrule_import"), {"file": upload, "default_category": "spam"}
    )
    job = AdminJob.objects.get(kind="import")
    with committed():
        editor.post(reverse("admin:urlguard_spamrule_import_commit", args=[job.pk]))
    job.refresh_from_db()
    assert job.state == "done" and job.result["rescan_job"] is None, job.message
    assert not AdminJob.objects.filter(kind="rescan").exists()
    page = editor.get(reverse("admin:urlguard_spamrule_import_job", args=[job.pk]))
    assert page.status_code == 200 and "Rescan after the import" not in page.content.decode()
