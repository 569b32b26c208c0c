"""The Safe Browsing v4 Update API through Django's test client, read as a client
reads it: a full update, partial updates applied to the client's sorted copy (RAW and
RICE), the checksum after each, full hashes, and every refusal."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil

import numpy as np
import pytest
from django.test import Client
from hypothesis import given
from hypothesis import strategies as st

from tests.support.safebrowsing import (
    BASE,
    FIREFOX_PHISHING,
    MALWARE,
    PHISHING,
    apply,
    fetch_proto,
    find,
    prefix,
)
from urlguard.exports import prerender
from urlguard.models import ChangeEvent, HitEvent, SpamRule
from urlguard.operations import apikeys
from urlguard.runtime import stats
from urlguard.safebrowsing import rice
from urlguard.safebrowsing.prefixes import store_dir
from urlguard.safebrowsing.threatlists import LISTS
from urlguard.safebrowsing.updates import diff
from urlguard.writepath.allowlist import allow_host
from urlguard.writepath.changes import add_rule, remove_rule

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("prerender_inline")]


def test_a_full_update_then_partial_updates_keep_the_clients_copy_right(key):
    client = Client()
    add_rule("phish.example/", category="phishing", source="test")
    add_rule("pages.example/login/", category="phishing", source="test")
    add_rule("bad.example/", category="malware", source="test")
    for compression in (1, 2):
        first = fetch_proto(client, key, [(PHISHING, b"", compression)])
        (update,) = first.list_update_responses
        assert update.response_type == 2 and update.threat_type == PHISHING
        assert update.HasField("new_client_state") and first.minimum_wait_duration.seconds == 1800
        copy = apply([], update)
        assert copy == sorted([prefix("phish.example/"), prefix("pages.example/login/")])
        add_rule("new.example/", category="phishing", source="test")
        remove_rule(SpamRule.objects.get(expression="phish.example/"), source="test")
        second = fetch_proto(client, key, [(PHISHING, update.new_client_state, compression)])
        (partial,) = second.list_update_responses
        assert partial.response_type == 1
        copy = apply(copy, partial)
        assert copy == sorted([prefix("new.example/"), prefix("pages.example/login/")])
        # Nothing changed since: an empty partial update with the same checksum.
        third = fetch_proto(client, key, [(PHISHING, partial.new_client_state, compression)])
        assert apply(copy, third.list_update_responses[0]) == copy
        assert not third.list_update_responses[0].additions
        remove_rule(SpamRule.objects.get(expression="new.example/"), source="test")
        add_rule("phish.example/", category="phishing", source="test")


def test_firefox_threat_type_and_other_lists_are_answered_each_with_its_own(key):
    add_rule("phish.example/", category="phishing", source="test")
    add_rule("bad.example/", category="malware", source="test")
    add_rule("junk.example/", category="spam", source="test")
    answer = fetch_proto(
        Client(), key, [(FIREFOX_PHISHING, b"", 2), (MALWARE, b"", 2), (3, b"", 1), (7, b"", 2)]
    )
    phish, malware, unwanted, binary = answer.list_update_responses
    assert phish.threat_type == FIREFOX_PHISHING  # echoed: Firefox maps it back to its table
    assert apply([], phish) == [prefix("phish.example/")]
    assert apply([], malware) == [prefix("bad.example/")]
    assert apply([], unwanted) == [prefix("junk.example/")]
    assert apply([], binary) == [] and binary.response_type == 2


def test_a_wrong_or_stale_state_gets_a_full_update_whose_checksum_matches(key, settings):
    client = Client()
    add_rule("phish.example/", category="phishing", source="test")
    state = fetch_proto(client, key, [(PHISHING, b"", 2)]).list_update_responses[0]
    malware_state = fetch_proto(client, key, [(MALWARE, b"", 2)]).list_update_responses[0]
    settings.URLGUARD = {**settings.URLGUARD, "EXPORT_KEEP_VERSIONS": 1}
    add_rule("other.example/", category="phishing", source="test")  # prunes the first position
    wrong = [
        b"garbage",
        state.new_client_state[:-1] + b"\x00",  # another checksum at that position
        malware_state.new_client_state,  # another list's
        state.new_client_state,  # pruned
    ]
    for stated in wrong:
        (update,) = fetch_proto(client, key, [(PHISHING, stated, 2)]).list_update_responses
        assert update.response_type == 2
        assert apply([], update) == sorted([prefix("phish.example/"), prefix("other.example/")])


def test_json_clients_post_and_read_json(key):
    add_rule("phish.example/", category="phishing", source="test")
    body = {
        "client": {"clientId": "python-test", "clientVersion": "1"},
        "listUpdateRequests": [
            {
                "threatType": "SOCIAL_ENGINEERING",
                "platformType": "ANY_PLATFORM",
                "threatEntryType": "URL",
                "state": "",
                "constraints": {"supportedCompressions": ["RAW"]},
            }
        ],
    }
    response = Client().post(
        f"{BASE}/threatListUpdates:fetch?key={key}", json.dumps(body), "application/json"
    )
    assert response.status_code == 200
    (update,) = response.json()["listUpdateResponses"]
    assert update["responseType"] == "FULL_UPDATE" and update["threatType"] == "SOCIAL_ENGINEERING"
    raw = base64.b64decode(update["additions"][0]["rawHashes"]["rawHashes"])
    assert raw == prefix("phish.example/")
    lists = Client().get(f"{BASE}/threatLists", {"key": key}).json()["threatLists"]
    assert {entry["threatType"] for entry in lists} == set(LISTS)


def test_full_hashes_of_listed_rules_only_and_in_the_hit_log(key):
    add_rule("phish.example/", category="phishing", source="test")
    add_rule("bad.example/", category="malware", source="test")
    client = Client()
    Client().get(f"{BASE}/threatLists", {"key": key})  # prepares the lists
    answer = find(client, key, [prefix("phish.example/"), prefix("clean.example/")])
    assert [m.threat.hash for m in answer.matches] == [hashlib.sha256(b"phish.example/").digest()]
    assert answer.matches[0].cache_duration.seconds == 300
    assert answer.HasField("negative_cache_duration")
    # Another list's rule is not answered for this list.
    assert not find(client, key, [prefix("bad.example/")]).matches
    stats.flush()
    event = HitEvent.objects.get(action=HitEvent.Action.FULL_HASH)
    assert event.expression == "phish.example/" and event.where == "Safe Browsing key browsers"
    assert event.host == "phish.example" and event.category == "phishing"


def test_a_removed_rule_is_no_longer_answered_and_an_allowlisted_host_never_is(key):
    add_rule("gone.example/", category="phishing", source="test")
    client = Client()
    fetch_proto(client, key, [(PHISHING, b"", 2)])
    assert find(client, key, [prefix("gone.example/")]).matches
    remove_rule(SpamRule.objects.get(expression="gone.example/"), source="test")
    prerender.request()  # what the node does after applying the change (inline here)
    assert not find(client, key, [prefix("gone.example/")]).matches
    allow_host("safe.example", note="ours")
    assert ChangeEvent.objects.filter(action="allow", expression="safe.example").exists()
    (update,) = fetch_proto(client, key, [(PHISHING, b"", 1)]).list_update_responses
    assert apply([], update) == []
    assert not find(client, key, [prefix("safe.example/"), prefix("safe.example")]).matches


@pytest.mark.parametrize(
    "query",
    [
        {"$ct": "application/x-protobuf", "$req": "%%%not base64"},
        {
            "$ct": "application/x-protobuf",
            "$req": base64.urlsafe_b64encode(b"\xff\xff\xff").decode(),
        },
        {"$req": base64.urlsafe_b64encode(b"{not json").decode()},
        {
            "$req": base64.urlsafe_b64encode(
                b'{"listUpdateRequests": [{"threatType": "NOPE"}]}'
            ).decode()
        },
    ],
)
def test_a_malformed_request_gets_400_never_500(key, query):
    for path in ("threatListUpdates:fetch", "fullHashes:find"):
        response = Client().get(f"{BASE}/{path}", {**query, "key": key})
        assert response.status_code == 400, response.content
        assert response.json()["error"]["code"] == 400


def test_a_body_too_large_is_refused(key):
    response = Client().post(
        f"{BASE}/fullHashes:find?key={key}", b"{" + b" " * 70_000 + b"}", "application/json"
    )
    assert response.status_code == 413


def test_a_missing_key_is_401_and_a_wrong_one_403(key):
    client = Client()
    for path in ("threatListUpdates:fetch", "fullHashes:find", "threatLists"):
        assert client.post(f"{BASE}/{path}", "{}", "application/json").status_code == 401
        wrong = client.post(f"{BASE}/{path}?key=ugk_wrong", "{}", "application/json")
        assert wrong.status_code == 403
        assert client.post(f"{BASE}/{path}?key={key}", "{}", "application/json").status_code == 200


def test_switched_off_the_endpoints_are_404_and_no_round_prepares_lists(key, settings):
    settings.URLGUARD = {**settings.URLGUARD, "SAFEBROWSING_ENABLED": False}
    add_rule("phish.example/", category="phishing", source="test")
    shutil.rmtree(store_dir(), ignore_errors=True)
    prerender.render_all()
    assert not store_dir().exists() or not any(store_dir().iterdir())
    client = Client()
    for path in ("threatListUpdates:fetch", "fullHashes:find", "threatLists"):
        response = client.post(f"{BASE}/{path}?key={key}", "{}", "application/json")
        assert response.status_code == 404
        assert b"switched off" in response.content
    settings.URLGUARD = {**settings.URLGUARD, "SAFEBROWSING_ENABLED": True}
    prerender.render_all()
    assert any(store_dir().iterdir())


def test_requests_are_counted_by_method_and_client(key):
    from prometheus_client import REGISTRY  # noqa: F401  (the metrics extra is installed)

    from urlguard.runtime import metrics

    counter = metrics.registered.get().safebrowsing
    before = counter.labels(method="update", client="navclient-auto-ffox", code="200")._value.get()
    fetch_proto(Client(), key, [(PHISHING, b"", 2)])
    after = counter.labels(method="update", client="navclient-auto-ffox", code="200")._value.get()
    assert after == before + 1


def test_rice_round_trips_and_is_compact():
    rng = np.random.default_rng(7)
    values = np.unique(rng.integers(0, 2**32, 5000))
    encoded = rice.encode(values)
    assert (rice.decode(*encoded) == values).all()
    # About log2(mean gap) + 2 bits a value: at a million prefixes ~1.7 bytes.
    assert len(encoded.data) * 8 / len(values) < np.log2(2**32 / len(values)) + 2.5
    assert rice.decode(*rice.encode(np.array([9]))).tolist() == [9]


def test_the_gunicorn_access_log_never_holds_a_safe_browsing_key():
    from datetime import timedelta
    from types import SimpleNamespace

    from gunicorn.config import Config

    from urlguard_service import gunicornconf

    query = "$ct=application/x-protobuf&key=ugk_secret&$httpMethod=POST&$req=CgA"
    environ = {
        "REQUEST_METHOD": "GET",
        "RAW_URI": f"{BASE}/threatListUpdates:fetch?{query}",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "QUERY_STRING": query,
        "PATH_INFO": f"{BASE}/threatListUpdates:fetch",
    }
    config = Config()
    config.set("logger_class", gunicornconf.logger_class)
    logger = config.logger_class(config)
    response = SimpleNamespace(status="200 OK", sent=10, headers=[])
    atoms = logger.atoms(response, SimpleNamespace(headers=[]), environ, timedelta(0))
    line = config.access_log_format % atoms
    assert "ugk_secret" not in line and "ugk_secret" not in repr(atoms)
    assert f"{BASE}/threatListUpdates:fetch?$ct=application/x-protobuf&key=" in line


@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=300, unique=True))
def test_rice_decodes_what_it_encodes(values):
    ordered = np.array(sorted(values), dtype=np.int64)
    assert rice.decode(*rice.encode(ordered)).tolist() == ordered.tolist()


@given(
    st.sets(st.integers(0, 2**32 - 1), max_size=200),
    st.sets(st.integers(0, 2**32 - 1), max_size=200),
)
def test_a_partial_update_turns_the_old_list_into_the_new(old, new):
    before = np.array(sorted(old), dtype=np.uint32)
    after = np.array(sorted(new), dtype=np.uint32)
    removed, added = diff(before, after)
    kept = np.delete(before, removed)
    assert sorted([*kept.tolist(), *added.tolist()]) == after.tolist()
    assert removed.tolist() == sorted(removed.tolist())


def test_lists_written_anew_at_a_known_position_are_never_answered_from_memory(key):
    """A database replaced numbers its positions anew: what this process cached of the
    old files at the same position must not answer for the new ones."""
    add_rule("moved.example/", category="phishing", source="test")
    client = Client()
    (before,) = fetch_proto(client, key, [(PHISHING, b"", 2)]).list_update_responses
    assert apply([], before) == [prefix("moved.example/")]
    assert find(client, key, [prefix("moved.example/")]).matches
    seq = ChangeEvent.objects.head()
    shutil.rmtree(store_dir())
    rule = SpamRule.objects.get(expression="moved.example/")
    rule.category = "malware"
    rule.save(update_fields=["category"])  # the admin's edit in place: no new position
    assert ChangeEvent.objects.head() == seq
    phishing, malware = fetch_proto(
        client, key, [(PHISHING, b"", 2), (MALWARE, b"", 2)]
    ).list_update_responses
    assert apply([], phishing) == [] and apply([], malware) == [prefix("moved.example/")]
    assert not find(client, key, [prefix("moved.example/")]).matches
    assert find(client, key, [prefix("moved.example/")], threat_type=MALWARE).matches


def test_after_a_database_restored_to_an_earlier_position_its_lists_are_the_newest(key):
    add_rule("before.example/", category="phishing", source="test")
    client = Client()
    fetch_proto(client, key, [(PHISHING, b"", 2)])
    seq = ChangeEvent.objects.head()
    # The lists of the database before the restore, at positions beyond the new head.
    for entry in store_dir().glob(f"{seq}.*"):
        entry.rename(entry.with_name(entry.name.replace(f"{seq}.", f"{seq + 1000}.", 1)))
    add_rule("after.example/", category="phishing", source="test")
    prerender.request()
    assert find(client, key, [prefix("after.example/")]).matches


def test_a_revoked_key_is_refused_once_its_trust_in_the_process_runs_out(key, monkeypatch):
    from urlguard.models import APIKey
    from urlguard.safebrowsing import views

    now = [1000.0]
    monkeypatch.setattr(views, "_clock", lambda: now[0])
    client = Client()
    lists = f"{BASE}/threatLists?key={key}"
    assert client.get(lists).status_code == 200
    apikeys.revoke(APIKey.objects.all())
    assert client.get(lists).status_code == 200  # trusted: no table read per request
    now[0] += views.KEY_TRUST_SECONDS + 0.1
    assert client.get(lists).status_code == 403
