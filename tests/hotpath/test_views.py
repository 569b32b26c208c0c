"""Pages: short links end to end through the real filter, the warning page's
content, the signed "continue anyway" step, and our own error pages."""

from __future__ import annotations

import io
import re
import time
from html import unescape
from urllib.parse import parse_qs, urlsplit

import pytest
from django.core import signing
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import include, path

from urlguard.hotpath.warning import CONTINUE_SALT, continue_token
from urlguard.models import ShortLink
from urlguard.templatetags.urlguard_format import unbroken_host
from urlguard.writepath.changes import add_rule


def boom(request):
    raise RuntimeError("a bug in some view")


urlpatterns = [path("boom", boom), path("", include("urlguard.urls"))]

pytestmark = pytest.mark.django_db


@pytest.fixture
def links(db, build_filter):
    add_rule("prize.example/", category="phishing", source="test")
    add_rule("files.example/raw/", category="malware", source="test")
    made = {
        "clean": ShortLink.objects.create(slug="clean", destination="https://www.python.org/"),
        "prize": ShortLink.objects.create(
            slug="prize", destination="https://win.prize.example/claim?id=7"
        ),
        "raw": ShortLink.objects.create(slug="raw", destination="http://files.example/raw/x.exe"),
        "other": ShortLink.objects.create(slug="other", destination="http://files.example/docs/"),
        "off": ShortLink.objects.create(
            slug="off",
            destination="https://www.python.org/",
            disabled=True,
            disabled_reason="reported as spam",
        ),
    }
    build_filter()
    return made


def continue_link(response) -> str:
    match = re.search(r'href="(/continue\?token=[^"]+)"', response.content.decode())
    assert match, "no continue-anyway link on the page"
    return unescape(match.group(1))


def test_home_lists_only_the_demo_links_and_only_in_the_embedded_demo(
    client, links, settings, monkeypatch
):
    from django.core.management import call_command

    from urlguard_service.management.commands import seed_demo

    call_command("seed_demo", "--no-superuser", stdout=io.StringIO())
    ShortLink.objects.create(slug="mine", destination="https://private.example/a-users-link")
    settings.EMBEDDED_DEMO = True
    real = seed_demo.embedded_demo_database
    if connection.vendor != "sqlite":  # the embedded demo's database is SQLite
        monkeypatch.setattr(seed_demo, "embedded_demo_database", lambda: True)
    html = client.get("/").content.decode()
    assert 'href="/bank-login"' in html and "https://pages.example.net/gardening/" in html
    # Links that are not the demo's (a user's; "prize" re-pointed) are not listed.
    assert 'href="/mine"' not in html and "private.example" not in html
    assert 'href="/clean"' not in html and "win.prize.example" not in html
    # A deployment (DATABASE_URL set): no links at all.
    monkeypatch.setattr(seed_demo, "embedded_demo_database", real)
    settings.EMBEDDED_DEMO = False
    response = client.get("/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "Demo short links" not in html and "/bank-login" not in html
    assert "seed_demo" not in html


def test_clean_short_link_redirects(client, links):
    response = client.get("/clean")
    assert response.status_code == 302
    assert response["Location"] == "https://www.python.org/"
    assert response["Cache-Control"] == "private, max-age=90"


@pytest.mark.parametrize(
    ("slug", "host", "words"),
    [
        ("prize", "win.prize.example", "phishing site"),
        ("raw", "files.example", "spreads malware"),
    ],
)
def test_blocked_short_link_shows_the_warning(client, links, slug, host, words):
    response = client.get(f"/{slug}")
    assert response.status_code == 403
    html = response.content.decode()
    assert f'<span class="host">{unbroken_host(host)}</span>' in html
    assert words in html
    assert "Back to safety" in html and "<details>" in html
    assert response["Referrer-Policy"] == "no-referrer"


def test_path_rule_leaves_the_rest_of_the_site_alone(client, links):
    assert client.get("/other").status_code == 302


def test_warning_page_details_and_report_link(client, links, settings):
    settings.URLGUARD = {**settings.URLGUARD, "REPORT_MISTAKE_URL": "https://report.example/form"}
    html = client.get("/prize").content.decode()
    assert "<code>prize.example/</code>" in html  # the matched rule
    assert "the whole site prize.example" in html
    report = unescape(re.search(r'href="(https://report\.example/form[^"]+)"', html).group(1))
    assert parse_qs(urlsplit(report).query)["url"] == ["https://win.prize.example/claim?id=7"]


def test_report_link_prefills_a_mail(client, links, settings):
    settings.URLGUARD = {**settings.URLGUARD, "REPORT_MISTAKE_URL": "mailto:abuse@localhost"}
    html = unescape(client.get("/prize").content.decode())
    assert "mailto:abuse@localhost?subject=Wrongly%20blocked%20link&body=" in html
    assert "win.prize.example%2Fclaim" in html


def test_continue_anyway_goes_to_the_destination_once_confirmed(client, links):
    link = continue_link(client.get("/prize"))
    response = client.get(link)
    assert response.status_code == 302
    assert response["Location"] == "https://win.prize.example/claim?id=7"
    assert response["Cache-Control"] == "no-store"


def test_tampered_token_is_refused(client, links):
    link = continue_link(client.get("/prize"))
    token = parse_qs(urlsplit(link).query)["token"][0]
    forged = signing.TimestampSigner(salt="another.salt").sign_object(
        {"u": "https://evil.example/"}
    )
    for bad in [token[:-2] + ("AA" if not token.endswith("AA") else "BB"), forged, "", "x:y:z"]:
        response = client.get("/continue", {"token": bad})
        assert response.status_code == 400, bad
        assert not response.has_header("Location")
        assert "not valid" in response.content.decode()


def test_expired_token_is_refused(client, links, monkeypatch):
    link = continue_link(client.get("/prize"))
    later = time.time() + 15 * 60 + 5
    monkeypatch.setattr(signing.time, "time", lambda: later)
    response = client.get(link)
    assert response.status_code == 400
    assert "expired" in response.content.decode()


def test_a_token_works_only_for_the_browser_that_was_warned(client, links):
    # Copied out of one warning page, a token must not become a warning-free
    # redirect to the listed site for whoever it is sent to.
    link = continue_link(client.get("/prize", HTTP_USER_AGENT="UA one"))
    for other in [
        {"REMOTE_ADDR": "198.51.100.9", "HTTP_USER_AGENT": "UA one"},
        {"HTTP_USER_AGENT": "UA two"},
    ]:
        response = client.get(link, **other)
        assert response.status_code == 400 and not response.has_header("Location"), other
        assert "another browser" in response.content.decode()
    assert client.get(link, HTTP_USER_AGENT="UA one").status_code == 302


def test_a_token_without_a_visitor_is_refused(client, db):
    token = continue_token("https://win.prize.example/", "")
    assert client.get("/continue", {"token": token}).status_code == 400


def test_token_for_a_non_web_url_is_refused(client, db):
    token = signing.TimestampSigner(salt=CONTINUE_SALT).sign_object(
        {"u": "javascript:alert(1)"}, compress=True
    )
    response = client.get("/continue", {"token": token})
    assert response.status_code == 400 and not response.has_header("Location")


def test_unknown_short_link_is_a_404_page(client, db):
    response = client.get("/nope")
    assert response.status_code == 404
    assert "There is no short link" in response.content.decode()


def test_admin_without_slash_is_not_a_short_link(client, db):
    response = client.get("/admin")
    assert response.status_code == 301 and response["Location"] == "/admin/"


def test_disabled_short_link_is_a_410_page(client, links):
    response = client.get("/off")
    assert response.status_code == 410
    assert "reported as spam" in response.content.decode()


def test_javascript_destination_is_never_followed(client, db, build_filter):
    ShortLink.objects.create(slug="js", destination="javascript:alert(document.cookie)")
    build_filter()
    response = client.get("/js")
    assert response.status_code == 403 and not response.has_header("Location")


@pytest.mark.urls(__name__)
def test_error_pages_are_ours_not_tracebacks(db, settings):
    settings.DEBUG = False
    client = Client(raise_request_exception=False)
    missing = client.get("/no/such/page")
    assert missing.status_code == 404 and "Page not found" in missing.content.decode()
    crashed = client.get("/boom")
    assert crashed.status_code == 500
    html = crashed.content.decode()
    assert "Something went wrong" in html and "Traceback" not in html


def test_real_filter_false_positive_never_warns(client, links, filter_path):
    from urlguard.nodesync import registry

    # A key in the filter file with no row in the table: exactly what a Bloom
    # filter false positive looks like to the guard.
    with registry.writer(str(filter_path)) as writer:
        writer.add("www.python.org/", 1)
    assert registry.get_filter(str(filter_path)).contains("www.python.org/")
    response = client.get("/clean")
    assert response.status_code == 302 and response["Location"] == "https://www.python.org/"
    assert "X-URLGuard" not in response
    # Confirmed clean once; the next redirect does not ask the spam table again.
    with CaptureQueriesContext(connection) as queries:
        assert client.get("/clean").status_code == 302
    assert not [q for q in queries.captured_queries if "urlguard_spamrule" in q["sql"]]
