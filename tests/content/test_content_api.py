"""`POST /api/check-text`: every link of a text with its verdict, behind an API key like
the batch check, for services that are not Django; a listed link is a hit of the
posted-text kind naming the key."""

from __future__ import annotations

import json

import pytest

from urlguard.models import HitEvent
from urlguard.operations import apikeys
from urlguard.runtime import stats
from urlguard.writepath.changes import add_rule

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_guard")]


@pytest.fixture
def key(build_filter):
    add_rule("pills.top/", category="spam", source="test")
    build_filter()
    return apikeys.create_api_key("forum")[1]


def post(client, body, key=None):
    extra = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}
    return client.post(
        "/api/check-text", data=json.dumps(body), content_type="application/json", **extra
    )


def test_each_link_with_its_verdict(client, key):
    text = "Hi! PILLS.TOP/cheap and https://www.python.org/ and pills.top/cheap again"
    response = post(client, {"text": text}, key)
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    links = response.json()["links"]
    assert [(r["url"], r["blocked"], r["category"], r["rule"]) for r in links] == [
        ("http://PILLS.TOP/cheap", True, "spam", "pills.top/"),
        ("https://www.python.org/", False, None, None),
        ("http://pills.top/cheap", True, "spam", "pills.top/"),
    ]
    stats.flush()
    assert set(HitEvent.objects.values_list("action", "where")) == {("text", "API key forum")}


def test_no_key_no_answer(client, key):
    response = post(client, {"text": "pills.top/x"})
    assert response.status_code == 401 and "an API key is required" in response.json()["error"]
    assert post(client, {"text": "x"}, "ugk_wrong").status_code == 401


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"urls": []}, 'a JSON object {"text": "..."}'),
        ({"text": None}, "with a string"),
        (["text"], "with a string"),
    ],
)
def test_a_wrong_body_is_a_clear_error(client, key, body, error):
    response = post(client, body, key)
    assert response.status_code == 400 and error in response.json()["error"]


def test_text_over_the_bound_is_refused(client, key, settings):
    settings.URLGUARD = {**settings.URLGUARD, "CONTENT_MAX_CHARS": 20}
    response = post(client, {"text": "pills.top/x " * 2}, key)
    assert response.status_code == 413
    assert "24 characters long; at most 20" in response.json()["error"]


def test_only_post(client, key):
    response = client.get("/api/check-text")
    assert response.status_code == 405 and response["Allow"] == "POST"
