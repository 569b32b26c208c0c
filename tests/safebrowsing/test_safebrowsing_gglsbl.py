"""gglsbl (PyPI, its code untouched), a Python Safe Browsing v4 client, against a live
server: only its Google API client is pointed at the server (a discovery document
naming the server as its root, where Google's would name googleapis.com). It syncs,
flags the listed URL only, and on its next sync sees a rule added and one removed."""

from __future__ import annotations

import time
import warnings

import pytest

from urlguard.models import SpamRule
from urlguard.operations import apikeys
from urlguard.writepath.changes import add_rule, remove_rule

gglsbl = pytest.importorskip("gglsbl", reason="PyPI gglsbl (the dev extra) is not installed")

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("prerender_inline"),
    # gglsbl and its Google API client use deprecated calls of their own.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]


def _method(path: str, http: str, request: str | None, response: str) -> dict:
    method = {
        "id": f"safebrowsing.{path}",
        "path": f"v4/{path}",
        "httpMethod": http,
        "parameters": {},
        "parameterOrder": [],
        "response": {"$ref": response},
    }
    if request:
        method["request"] = {"$ref": request}
    return method


def discovery(root: str) -> dict:
    """The three methods gglsbl calls, served from `root`."""
    names = [
        "FetchThreatListUpdatesRequest",
        "FetchThreatListUpdatesResponse",
        "FindFullHashesRequest",
        "FindFullHashesResponse",
        "ListThreatListsResponse",
    ]
    return {
        "kind": "discovery#restDescription",
        "discoveryVersion": "v1",
        "id": "safebrowsing:v4",
        "name": "safebrowsing",
        "version": "v4",
        "rootUrl": root,
        "servicePath": "safebrowsing/",
        "baseUrl": root + "safebrowsing/",
        "batchPath": "batch",
        "parameters": {"key": {"type": "string", "location": "query"}},
        "schemas": {name: {"id": name, "type": "object"} for name in names},
        "resources": {
            "threatLists": {"methods": {"list": _method("threatLists", "GET", None, names[4])}},
            "threatListUpdates": {
                "methods": {"fetch": _method("threatListUpdates:fetch", "POST", names[0], names[1])}
            },
            "fullHashes": {
                "methods": {"find": _method("fullHashes:find", "POST", names[2], names[3])}
            },
        },
    }


@pytest.fixture
def sblist(live_server, monkeypatch, tmp_path):
    from gglsbl import protocol
    from googleapiclient.discovery import build_from_document

    root = live_server.url.replace("localhost", "127.0.0.1") + "/"
    monkeypatch.setattr(
        protocol,
        "build",
        lambda *args, developerKey, **kwargs: build_from_document(
            discovery(root), developerKey=developerKey
        ),
    )
    key = apikeys.create_api_key("gglsbl")[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        client = gglsbl.SafeBrowsingList(
            key, db_path=str(tmp_path / "gsb.db"), discard_fair_use_policy=True
        )
    yield client
    client.storage.db.close()
    client.api_client.service._http.close()  # its kept-alive connections


def sync(client) -> None:
    """gglsbl's update, then until its clock (SQLite's, whole seconds) is past the
    second it stored new prefixes in: until then it takes them for negatively cached
    (their default expiry is the moment they were stored) and asks no full hash."""
    client.update_hash_prefix_cache()
    (synced,) = client.storage.db.execute("SELECT current_timestamp").fetchone()
    deadline = time.monotonic() + 5
    while client.storage.db.execute("SELECT current_timestamp <= ?", [synced]).fetchone()[0]:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def listed(client, url: str) -> set[str]:
    found = client.lookup_url(url) or []
    return {str(threat_list.threat_type) for threat_list in found}


def test_gglsbl_syncs_flags_the_listed_url_only_and_sees_changes(sblist):
    add_rule("phish.example/", category="phishing", source="test")
    add_rule("pages.example/bad/", category="malware", source="test")
    add_rule("old.example/", category="spam", source="test")
    sync(sblist)
    assert listed(sblist, "http://www.phish.example/login?x=1") == {"SOCIAL_ENGINEERING"}
    assert listed(sblist, "https://pages.example/bad/file.exe") == {"MALWARE"}
    assert listed(sblist, "http://old.example/") == {"UNWANTED_SOFTWARE"}
    assert listed(sblist, "http://clean.example/") == set()
    assert listed(sblist, "https://pages.example/good/") == set()

    add_rule("new.example/", category="phishing", source="test")
    remove_rule(SpamRule.objects.get(expression="old.example/"), source="test")
    sync(sblist)  # a partial update: checksums verified by gglsbl
    assert listed(sblist, "http://new.example/x") == {"SOCIAL_ENGINEERING"}
    assert listed(sblist, "http://old.example/") == set()
    assert listed(sblist, "http://www.phish.example/login?x=1") == {"SOCIAL_ENGINEERING"}
