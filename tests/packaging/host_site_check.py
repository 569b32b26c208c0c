"""Run inside the host site of test_host_site.py (its own virtualenv, its own
settings): what a visitor and an admin of that site see. Prints one JSON object."""

import asyncio
import importlib.util
import json
import os
import re
import sys

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
django.setup()

from django.contrib import admin  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.contrib.redirects.models import Redirect  # noqa: E402
from django.contrib.sites.models import Site  # noqa: E402
from django.test import AsyncClient, Client  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402
from django.urls import NoReverseMatch, reverse  # noqa: E402

setup_test_environment()  # the test clients' "testserver" host
site = Site.objects.get_current()
Redirect.objects.get_or_create(
    site=site, old_path="/go-bad/", new_path="https://login.evil.example/account"
)
Redirect.objects.get_or_create(
    site=site, old_path="/go-clean/", new_path="https://www.djangoproject.com/start/"
)


def visitor_view(response) -> dict:
    body = response.content.decode()
    report = re.search(r'href="(/guard/report-mistake/\?token=[^"]+)"', body)
    return {
        "status": response.status_code,
        "location": response.get("Location"),
        "phishing": "phishing" in body.lower(),
        "report_href": report.group(1).replace("&amp;", "&") if report else None,
    }


result: dict = {"sync": {}, "async": {}, "admin": {}}
client = Client()
for path in ("/go-bad/", "/go-clean/"):
    result["sync"][path] = visitor_view(client.get(path))
href = result["sync"]["/go-bad/"]["report_href"]
result["sync"]["report_status"] = client.get(href).status_code if href else None


async def visit_async() -> None:
    aclient = AsyncClient()
    for path in ("/go-bad/", "/go-clean/"):
        result["async"][path] = visitor_view(await aclient.get(path))
    href = result["async"]["/go-bad/"]["report_href"]
    result["async"]["report_status"] = (await aclient.get(href)).status_code if href else None


asyncio.run(visit_async())

# Short links are opt-in (urlguard.shortlinks): none here.
from urlguard.models import ShortLink  # noqa: E402

result["celery_installed"] = importlib.util.find_spec("celery") is not None
result["metrics_status"] = client.get("/guard/metrics").status_code
result["slug_status"] = client.get("/some-slug").status_code
result["shortlink_admin"] = admin.site.is_registered(ShortLink)
result["admin_header"] = str(admin.site.site_header)

user = get_user_model().objects.filter(username="root").first()
user = user or get_user_model().objects.create_superuser("root", "root@example.com", "x")
client.force_login(user)
pages = ["admin:index"]
for model in admin.site._registry:
    if model._meta.app_label == "urlguard":
        pages.append(f"admin:urlguard_{model._meta.model_name}_changelist")
pages += [
    "admin:urlguard_spamrule_add",
    "admin:urlguard_spamrule_check",
    "admin:urlguard_spamrule_dashboard",
    "admin:urlguard_spamrule_import",
]
for name in pages:
    try:
        url = reverse(name)
    except NoReverseMatch:
        result["admin"][name] = "no such page"
        continue
    response = client.get(url)
    result["admin"][name] = response.status_code
with open(sys.argv[1], "w") as out:
    json.dump(result, out)
