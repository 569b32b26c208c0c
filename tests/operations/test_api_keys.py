"""API keys: `manage.py create_api_key NAME` prints the key once; the admin creates
one (shown on the next page, never stored), revokes, shows the last use, never deletes."""

from __future__ import annotations

import io
import json
import re

import pytest
from django.core.management import CommandError, call_command

from urlguard.models import APIKey
from urlguard.operations import apikeys

pytestmark = pytest.mark.django_db


def _batch(client, key: str):
    return client.post(
        "/api/check",
        data=json.dumps({"urls": ["https://a.example/"]}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )


def test_create_api_key_prints_the_key_once(client):
    out, err = io.StringIO(), io.StringIO()
    call_command("create_api_key", "mail-gateway", stdout=out, stderr=err)
    key = out.getvalue().strip()
    assert re.fullmatch(r"ugk_[A-Za-z0-9_-]{43}", key)
    assert "shown only once" in err.getvalue()
    row = APIKey.objects.get(name="mail-gateway")
    assert row.key_hash == apikeys.hash_key(key) and row.prefix == key[:10]
    assert _batch(client, key).status_code == 200


def test_create_api_key_refuses_a_name_in_use(db):
    call_command("create_api_key", "gw", stdout=io.StringIO(), stderr=io.StringIO())
    with pytest.raises(CommandError, match="'gw' exists already"):
        call_command("create_api_key", "gw", stdout=io.StringIO(), stderr=io.StringIO())
    with pytest.raises(CommandError, match="needs a name"):
        call_command("create_api_key", "  ", stdout=io.StringIO(), stderr=io.StringIO())


def test_the_admin_creates_a_key_and_shows_it_once(superuser, client):
    response = superuser.post("/admin/urlguard/apikey/add/", {"name": "link-gateway"})
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    key = re.search(r'<code id="api-key"[^>]*>(ugk_[^<]+)</code>', response.content.decode())
    assert key is not None
    row = APIKey.objects.get(name="link-gateway")
    assert row.key_hash == apikeys.hash_key(key.group(1))
    assert _batch(client, key.group(1)).status_code == 200
    # The change page never shows it again.
    page = superuser.get(f"/admin/urlguard/apikey/{row.pk}/change/").content.decode()
    assert key.group(1) not in page and row.prefix in page


def test_the_admin_revokes_and_shows_the_last_use(superuser, client):
    row, key = apikeys.create_api_key("gw")
    assert _batch(client, key).status_code == 200
    listing = superuser.get("/admin/urlguard/apikey/").content.decode()
    assert "gw" in listing and row.prefix in listing
    row.refresh_from_db()
    assert row.last_used_at is not None
    response = superuser.post(
        "/admin/urlguard/apikey/",
        {"action": "revoke_keys", "_selected_action": [row.pk]},
        follow=True,
    )
    assert "Revoked 1 API key." in response.content.decode()
    assert _batch(client, key).status_code == 401
    assert superuser.post(f"/admin/urlguard/apikey/{row.pk}/delete/").status_code == 403
