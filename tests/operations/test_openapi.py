"""docs/openapi.yaml describes what the API really answers: every documented path,
method and status is produced here and its JSON body validated against the schema."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from django.db import OperationalError, connections

from urlguard.nodesync import registry
from urlguard.operations import apikeys
from urlguard.writepath.changes import add_rule

pytestmark = pytest.mark.django_db

SPEC_PATH = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return yaml.safe_load(SPEC_PATH.read_text())


def _resolve(spec: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        *_, section, name = node["$ref"].split("/")
        node = spec["components"][section][name]
    return node


def _documented(spec: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (path, method, status)
        for path, item in spec["paths"].items()
        for method, operation in item.items()
        for status in operation["responses"]
    }


class Checker:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.seen: set[tuple[str, str, str]] = set()

    def __call__(self, response, path: str, method: str) -> Any:
        status = str(response.status_code)
        operation = self.spec["paths"][path][method]
        assert status in operation["responses"], f"{method} {path} answered undocumented {status}"
        documented = _resolve(self.spec, operation["responses"][status])
        schema = documented["content"]["application/json"]["schema"]
        body = json.loads(response.content)
        jsonschema.validate(
            body,
            {**schema, "components": self.spec["components"]},
            cls=jsonschema.Draft202012Validator,
        )
        for header in documented.get("headers", {}):
            if header != "X-URLGuard":  # only on degraded answers
                assert response.has_header(header), f"{method} {path} {status} lacks {header}"
        self.seen.add((path, method, status))
        return body


def test_the_schemas_are_valid_json_schema(spec):
    for schema in spec["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)


def test_every_documented_answer_matches(
    use_guard, spec, client, build_filter, settings, monkeypatch
):
    from urlguard.hotpath import guard as guard_module
    from urlguard.hotpath.guard import Guard

    check = Checker(spec)
    settings.URLGUARD = {
        **settings.URLGUARD,
        "API_OPEN_RATE": "1000/m",
        "API_KEY_RATE": "1000/m",
        "READY_MAX_LAG_CHANGES": 0,
    }
    monkeypatch.setattr(registry, "CHECK_SECONDS", 0.0)
    monkeypatch.setattr(registry, "RETRY_SECONDS", 0.0)
    add_rule("evil.example/", category="phishing", source="test")
    build_filter()
    key = apikeys.create_api_key("schema")[1]
    auth = {"HTTP_AUTHORIZATION": f"Bearer {key}"}

    def post(body: Any, **extra: Any):
        data = body if isinstance(body, str) else json.dumps(body)
        return client.post("/api/check", data=data, content_type="application/json", **extra)

    def post_text(body: Any, **extra: Any):
        data = json.dumps(body)
        return client.post("/api/check-text", data=data, content_type="application/json", **extra)

    # GET /api/check
    check(client.get("/api/check", {"url": "http://a.evil.example/"}), "/api/check", "get")
    check(client.get("/api/check", {"url": "https://www.python.org/"}), "/api/check", "get")
    check(client.get("/api/check", {"url": "javascript:x"}), "/api/check", "get")
    # POST /api/check
    urls = ["http://evil.example/", "https://ok.example/", "ftp://x", 7, None]
    body = check(post({"urls": urls}, **auth), "/api/check", "post")
    assert len(body["results"]) == len(urls)
    check(post("{nope", **auth), "/api/check", "post")
    check(post({"urls": ["https://a.example/"]}), "/api/check", "post")
    check(post({"urls": ["https://a.example/"] * 1001}, **auth), "/api/check", "post")
    # POST /api/check-text
    text = "See https://evil.example/x, www.python.org and http://a.example:99999/ (no link)."
    body = check(post_text({"text": text}, **auth), "/api/check-text", "post")
    assert [r["blocked"] for r in body["links"]] == [True, False]
    check(post_text({"text": 7}, **auth), "/api/check-text", "post")
    check(post_text({"text": "x"}), "/api/check-text", "post")
    check(post_text({"text": "x" * 50_001}, **auth), "/api/check-text", "post")
    # Degraded answers carry the header the schema names.
    use_guard(Guard(lambda: None, on_filter_error="open"))
    response = client.get("/api/check", {"url": "https://x.example/"})
    assert check(response, "/api/check", "get")["degraded"] is True
    assert response["X-URLGuard"] == "degraded"
    response = post({"urls": ["https://x.example/"]}, **auth)
    check(response, "/api/check", "post")
    assert response["X-URLGuard"] == "degraded"

    def explode(*args: Any) -> None:
        raise OperationalError("the database is gone")

    monkeypatch.setattr(guard_module.get_guard(), "check", explode)
    monkeypatch.setattr(guard_module.get_guard(), "check_many", explode)
    check(client.get("/api/check", {"url": "https://x.example/"}), "/api/check", "get")
    check(post({"urls": ["https://x.example/"]}, **auth), "/api/check", "post")
    check(post_text({"text": "https://x.example/"}, **auth), "/api/check-text", "post")
    # Rate limits.
    settings.URLGUARD = {**settings.URLGUARD, "API_OPEN_RATE": "1/m", "API_KEY_RATE": "1/m"}
    from django.core.cache import cache

    cache.clear()
    client.get("/api/check", {"url": "https://x.example/"})
    check(client.get("/api/check", {"url": "https://x.example/"}), "/api/check", "get")
    post({"urls": []}, **auth)
    check(post({"urls": []}, **auth), "/api/check", "post")
    check(post_text({"text": ""}, **auth), "/api/check-text", "post")
    # Probes.
    check(client.get("/healthz"), "/healthz", "get")
    check(client.get("/readyz"), "/readyz", "get")
    add_rule("late.example/", category="spam", source="test")  # lag 1 > 0
    body = check(client.get("/readyz"), "/readyz", "get")
    assert body["failed"] == ["lag"]
    os.remove(settings.URLGUARD["FILTER_PATH"])
    monkeypatch.setattr(connections["default"], "ensure_connection", explode)
    body = check(client.get("/readyz"), "/readyz", "get")
    assert body["failed"] == ["filter", "database", "lag"]

    assert check.seen == _documented(spec), "documented but never produced"
