"""The Safe Browsing endpoints as a hostile client and an operator's bad day see them:
malformed and oversized requests, forged client states, lists missing, a key that must
stay out of every log; partial updates and the RICE coding checked against a model
client and a decoder written here from the protocol's description."""

from __future__ import annotations

import base64
import errno
import hashlib
import logging
import shutil
import time

import numpy as np
import pytest
from django.test import Client
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.support.safebrowsing import (
    BASE,
    PHISHING,
    apply,
    fetch_proto,
    find,
    hashes_of,
    indices_of,
    prefix,
)
from urlguard.models import SpamRule
from urlguard.operations import apikeys
from urlguard.safebrowsing import prefixes, rice, updates, wire
from urlguard.safebrowsing.prefixes import store_dir
from urlguard.writepath.changes import add_rule, remove_rule

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("prerender_inline")]


def get_proto(client, key, path, data: bytes):
    return client.get(
        f"{BASE}/{path}",
        {
            "$ct": "application/x-protobuf",
            "key": key,
            "$req": base64.urlsafe_b64encode(data).decode(),
        },
        HTTP_X_HTTP_METHOD_OVERRIDE="POST",
    )


def find_request(hashes: list[bytes]) -> bytes:
    message = wire.message("FindFullHashesRequest")
    message.threat_info.threat_types.append(PHISHING)
    message.threat_info.threat_entry_types.append(1)
    for h in hashes:
        message.threat_info.threat_entries.add(hash=h)
    return message.SerializeToString()


def assert_refused(response, status=400):
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert error["code"] == status and error["message"]
    return error["message"]


@pytest.mark.parametrize("req", ["@@@@", "!!!!", "CgA*", "Cg\x00A", "%%%not base64"])
def test_a_req_with_characters_outside_base64url_is_400_not_read_as_what_is_left(key, req):
    """A decoder that skips what it cannot read turns "@@@@" into an empty, valid
    request (answered 200) and "%%%not base64" into other bytes."""
    for path in ("threatListUpdates:fetch", "fullHashes:find"):
        response = Client().get(
            f"{BASE}/{path}", {"$ct": "application/x-protobuf", "key": key, "$req": req}
        )
        assert "base64" in assert_refused(response)


@pytest.mark.parametrize(
    "data",
    [
        b"\x1a\x80",  # a length whose varint never ends
        b"\x1a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # an 11-byte varint
        b"\x1a\x05ab",  # a message shorter than its length
        b"\x0b" * 1000,  # groups opened and never closed
        b"\x1a\x7f" + b"\x22" * 20,  # a nested length beyond the end
    ],
)
def test_truncated_or_corrupt_protobuf_is_400(key, data):
    for path in ("threatListUpdates:fetch", "fullHashes:find"):
        assert "protobuf" in assert_refused(get_proto(Client(), key, path, data))


def test_a_list_request_naming_no_known_threat_type_is_400(key):
    # Field 1 (threat_type) = 99: no such enum value, so the list is named by nothing.
    data = b"\x1a\x02\x08\x63"
    assert "threatType" in assert_refused(get_proto(Client(), key, "threatListUpdates:fetch", data))


def test_an_unknown_compression_or_platform_is_answered_raw_for_the_named_platform(key):
    add_rule("phish.example/", category="phishing", source="test")
    message = wire.message("FetchThreatListUpdatesRequest")
    one = message.list_update_requests.add(threat_type=PHISHING, platform_type=5)
    # Compression 7 (no such type) leaves none named: RAW, the protocol's default. The
    # size constraints (1 entry) are read, not enforced: no real client sets them.
    one.constraints.MergeFromString(b"\x20\x07\x08\x01\x10\x01")
    response = get_proto(Client(), key, "threatListUpdates:fetch", message.SerializeToString())
    assert response.status_code == 200
    (update,) = wire.parse("FetchThreatListUpdatesResponse", response.content).list_update_responses
    assert update.platform_type == 5 and update.additions[0].compression_type == 1
    assert apply([], update) == [prefix("phish.example/")]


def test_too_many_lists_or_hashes_in_one_request_are_refused_quickly(key):
    add_rule("phish.example/", category="phishing", source="test")
    many_lists = wire.message("FetchThreatListUpdatesRequest")
    for _ in range(5000):
        many_lists.list_update_requests.add(threat_type=PHISHING)
    many_hashes = find_request([i.to_bytes(4, "big") for i in range(10_000)])
    for path, data in (
        ("threatListUpdates:fetch", many_lists.SerializeToString()),
        ("fullHashes:find", many_hashes),
    ):
        # CPU of this thread (the test client serves in it): refused before the work.
        started = time.thread_time()
        assert_refused(get_proto(Client(), key, path, data), status=413)
        assert time.thread_time() - started < 2.0


def test_one_list_asked_for_again_and_again_in_one_request_is_400(key):
    """32 requests of a million-prefix list for as many platforms made a 192-byte
    request a 170 MB JSON answer (0.9 GB resident, 2.3 s): a list is answered at
    most twice in one request (Firefox's goog-phish-proto and googpub-phish-proto both
    read SOCIAL_ENGINEERING)."""
    add_rule("bad.example/", category="malware", source="test")
    message = wire.message("FetchThreatListUpdatesRequest")
    for platform in (1, 2, 3):
        message.list_update_requests.add(threat_type=1, platform_type=platform)
    response = get_proto(Client(), key, "threatListUpdates:fetch", message.SerializeToString())
    assert "MALWARE" in assert_refused(response)
    both = [(PHISHING, b"", 2), (5, b"", 2), (1, b"", 1), (7, b"", 2), (8, b"", 2), (13, b"", 2)]
    assert len(fetch_proto(Client(), key, both).list_update_responses) == 6


@pytest.mark.parametrize("length", [0, 3, 33])
def test_a_hash_prefix_of_a_length_the_protocol_has_not_is_400(key, length):
    """Silently skipped, such a prefix was answered "no match" with a negative cache
    duration: a client told a hash is clean that was never looked up."""
    add_rule("phish.example/", category="phishing", source="test")
    digest = hashlib.sha256(b"phish.example/").digest()
    data = find_request([digest[:4], (digest * 2)[:length]])
    for client_request in (
        lambda: get_proto(Client(), key, "fullHashes:find", data),
        lambda: Client().post(
            f"{BASE}/fullHashes:find?key={key}",
            wire.to_json(wire.parse("FindFullHashesRequest", data)),
            "application/json",
        ),
    ):
        assert "bytes" in assert_refused(client_request())


def test_a_state_forged_to_a_future_position_or_another_list_gets_a_full_update(key):
    add_rule("phish.example/", category="phishing", source="test")
    add_rule("bad.example/", category="malware", source="test")
    client = Client()
    (real,) = fetch_proto(client, key, [(PHISHING, b"", 2)]).list_update_responses
    seq = int.from_bytes(real.new_client_state[2:10], "big")
    checksum = real.checksum.sha256
    forged = [
        updates.encode_state(PHISHING, seq + 1, checksum),
        updates.encode_state(PHISHING, 2**64 - 1, checksum),
        updates.encode_state(1, seq, checksum),  # another list's type, this list's copy
        real.new_client_state + b"\x00",
        b"",
    ]
    for state in forged:
        (update,) = fetch_proto(client, key, [(PHISHING, state, 2)]).list_update_responses
        assert update.response_type == 2
        assert apply([], update) == [prefix("phish.example/")]


def test_lost_lookup_files_answer_503_never_a_clean_verdict_and_are_written_again(key, monkeypatch):
    """A full-hash answer with no match and a negative cache duration tells a browser
    the page is clean for that long: without the arrays to look in, say "later"."""
    from urlguard.exports import prerender

    add_rule("phish.example/", category="phishing", source="test")
    client = Client()
    fetch_proto(client, key, [(PHISHING, b"", 2)])
    assert find(client, key, [prefix("phish.example/")]).matches
    for entry in store_dir().glob("*.lookup.*"):
        entry.unlink()
    # A worker that has not mapped them yet (this one keeps its maps of the old files).
    prefixes._lookups.clear()
    prefixes._newest.clear()
    asked = []
    monkeypatch.setattr(prerender, "request", lambda: asked.append(1))
    response = client.post(
        f"{BASE}/fullHashes:find?$ct=application/x-protobuf&key={key}",
        find_request([prefix("phish.example/")]),
        "application/x-protobuf",
    )
    assert_refused(response, status=503)
    assert response["Retry-After"] and asked
    prerender.render_all()  # the round the 503 asked for
    assert find(client, key, [prefix("phish.example/")]).matches


def test_old_positions_are_pruned_before_a_write_so_a_full_disk_frees_room(
    key, settings, monkeypatch
):
    settings.URLGUARD = {**settings.URLGUARD, "EXPORT_KEEP_VERSIONS": 3}
    for n in range(4):
        add_rule(f"phish{n}.example/", category="phishing", source="test")
        prefixes.prepare()
    assert len(prefixes.kept_positions()) == 3

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(prefixes, "write_aside", full)
    add_rule("phish-new.example/", category="phishing", source="test")
    with pytest.raises(OSError):
        prefixes.prepare()
    # Room for the position that failed was made before it was written.
    assert len(prefixes.kept_positions()) == 2


def test_a_full_disk_on_a_fresh_node_answers_503_not_an_empty_list(key, monkeypatch, caplog):
    add_rule("phish.example/", category="phishing", source="test")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(prefixes, "write_aside", full)
    client = Client()
    message = wire.message("FetchThreatListUpdatesRequest")
    message.list_update_requests.add(threat_type=PHISHING)
    caplog.set_level(logging.ERROR)
    for _ in range(3):
        for path, data in (
            ("threatListUpdates:fetch", message.SerializeToString()),
            ("fullHashes:find", find_request([prefix("phish.example/")])),
        ):
            response = get_proto(client, key, path, data)
            assert_refused(response, status=503)
    # Logged once per endpoint, not per request.
    assert len([r for r in caplog.records if "No space left" in (r.exc_text or "")]) <= 2


def test_a_fresh_node_whose_database_is_away_answers_503(key, monkeypatch):
    from django.db import OperationalError

    from urlguard.models import ChangeEvent

    add_rule("phish.example/", category="phishing", source="test")
    Client().get(f"{BASE}/threatLists", {"key": key})  # the key is trusted from here
    shutil.rmtree(store_dir(), ignore_errors=True)  # nothing kept yet
    prefixes._lookups.clear()
    prefixes._newest.clear()

    def away():
        raise OperationalError("connection refused")

    monkeypatch.setattr(ChangeEvent.objects, "head", away)
    message = wire.message("FetchThreatListUpdatesRequest")
    message.list_update_requests.add(threat_type=PHISHING)
    for path, data in (
        ("threatListUpdates:fetch", message.SerializeToString()),
        ("fullHashes:find", find_request([prefix("phish.example/")])),
    ):
        assert_refused(get_proto(Client(), key, path, data), status=503)


def test_an_export_that_fails_to_render_does_not_hold_the_lists_back(key, monkeypatch):
    """An export's bug or its folder unwritable failed the pre-render's round before
    the lists were prepared: browsers were served the old position for as long."""
    from urlguard.exports import prerender
    from urlguard.models import ChangeEvent

    add_rule("phish.example/", category="phishing", source="test")

    def broken(*args, **kwargs):
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(prerender, "rendered", broken)
    monkeypatch.setattr(prerender, "request", lambda: None)
    add_rule("new.example/", category="phishing", source="test")
    with pytest.raises(prerender.PrerenderFailed):
        prerender.render_all()
    assert prefixes.load(ChangeEvent.objects.head()) is not None
    (update,) = fetch_proto(Client(), key, [(PHISHING, b"", 2)]).list_update_responses
    assert apply([], update) == sorted([prefix("phish.example/"), prefix("new.example/")])


def test_the_key_is_in_no_log_line_whatever_the_answer(key, monkeypatch, caplog):
    """Every status these views answer, and a 500 from a bug, logged at DEBUG by
    every logger (django.request too)."""
    from urlguard.models import APIKey
    from urlguard.safebrowsing import fullhashes

    caplog.set_level(logging.DEBUG)
    client = Client(raise_request_exception=False)
    fetch = f"{BASE}/threatListUpdates:fetch"
    codes = [
        client.get(fetch, {"key": key, "$req": "@@@@", "$ct": "application/x-protobuf"}),
        client.post(f"{fetch}?key={key}", b"{" + b" " * 70_000 + b"}", "application/json"),
        client.put(f"{fetch}?key={key}"),
        client.get(fetch, {"key": key + "x"}),
    ]

    def bug(request):
        raise IndexError(f"a bug ({request})")

    monkeypatch.setattr(fullhashes, "find", bug)
    codes.append(client.post(f"{BASE}/fullHashes:find?key={key}", "{}", "application/json"))
    apikeys.revoke(APIKey.objects.all())
    monkeypatch.setattr("urlguard.safebrowsing.views._trusted", {})
    codes.append(client.get(f"{BASE}/threatLists", {"key": key}))
    assert sorted(r.status_code for r in codes) == [400, 403, 403, 405, 413, 500]
    secret = key.split("_", 1)[-1]
    logged = [
        (r.getMessage(), r.exc_text or "", logging.Formatter().format(r)) for r in caplog.records
    ]
    assert any("Internal Server Error" in line for line, _, _ in logged)
    assert not [line for line in logged if secret in repr(line)]


# -- partial updates against a model client --------------------------------------------


class ModelClient:
    """What Firefox does with an update: removals first, each an index into the old
    sorted copy, then the additions merged, and the result sorted by bytes."""

    def __init__(self) -> None:
        self.copy: list[bytes] = []
        self.state = b""

    def take(self, update) -> None:
        if update.response_type == 2:
            self.copy = []
        gone = sorted({i for removal in update.removals for i in indices_of(removal)})
        assert all(0 <= i < len(self.copy) for i in gone)
        kept = [p for i, p in enumerate(self.copy) if i not in set(gone)]
        added = [h for addition in update.additions for h in hashes_of(addition)]
        assert not set(added) & set(kept)
        self.copy = sorted(kept + added)
        self.state = update.new_client_state


NAMES = [f"h{i}.example/" for i in range(12)]


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    steps=st.lists(
        st.tuples(st.sets(st.sampled_from(NAMES)), st.sets(st.sampled_from(NAMES)), st.booleans()),
        min_size=1,
        max_size=5,
    ),
    compression=st.sampled_from([1, 2]),
)
@example(steps=[({"h0.example/"}, set(), True), (set(), {"h0.example/"}, True)], compression=2)
@example(steps=[(set(NAMES), set(), True), (set(), set(NAMES[:-1]), True)], compression=1)
@example(  # the client skips a sync: its state is two positions old
    steps=[
        ({"h1.example/"}, set(), True),
        ({"h2.example/"}, set(), False),
        (set(), {"h1.example/"}, True),
    ],
    compression=2,
)
def test_the_checksum_after_any_partial_update_is_that_of_the_model_clients_copy(
    key, steps, compression
):
    """Steps of rules added and removed; after each the client syncs, or not (its
    state then names an older position)."""
    for rule in SpamRule.objects.all():  # left by the example before
        remove_rule(rule, source="test")
    listed: set[str] = set()
    model = ModelClient()
    client = Client()
    for adds, removes, syncs in [(set(), set(), True), *steps, (set(), set(), True)]:
        for name in sorted(adds - listed):
            add_rule(name, category="phishing", source="test")
        for name in sorted((removes - adds) & (listed | adds)):
            remove_rule(SpamRule.objects.get(expression=name), source="test")
        listed = (listed | adds) - (removes - adds)
        if not syncs:
            continue
        state = model.state
        kept = bool(state) and prefixes.load(int.from_bytes(state[2:10], "big")) is not None
        (update,) = fetch_proto(client, key, [(PHISHING, state, compression)]).list_update_responses
        assert update.response_type == (1 if kept else 2)
        model.take(update)
        assert update.checksum.sha256 == hashlib.sha256(b"".join(model.copy)).digest()
        assert model.copy == sorted(prefix(name) for name in listed)


# -- RICE, decoded as the protocol describes it -----------------------------------------


def spec_decode(first_value: int, k: int, num_entries: int, data: bytes) -> list[int]:
    """Golomb-Rice as the v4 protocol describes it, a bit at a time: the bits of each
    byte from its least significant up; each delta a quotient in unary (ones ended by a
    zero) then a k-bit remainder, least significant bit first; each value the one
    before plus its delta, the first being first_value."""
    bits = [(byte >> i) & 1 for byte in data for i in range(8)]
    at = 0
    values = [first_value]
    for _ in range(num_entries):
        q = 0
        while bits[at]:
            q += 1
            at += 1
        at += 1
        r = sum(bits[at + i] << i for i in range(k))
        at += k
        values.append(values[-1] + (q << k) + r)
    assert not any(bits[at:]), "only padding after the last value"
    assert len(data) == (at + 7) // 8, "no byte beyond the last value's"
    return values


@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=400, unique=True))
@example([7])
@example([0])
@example([2**32 - 1])
@example([0, 2**32 - 1])
@example([5, 10, 15, 20, 25])
@example([0, 1, 2, 3])
@example(list(range(0, 2**32, 2**24)))
def test_rice_encoding_read_by_a_decoder_written_from_the_protocol(values):
    ordered = sorted(values)
    encoded = rice.encode(np.array(ordered, dtype=np.int64))
    assert 2 <= encoded.parameter <= 28
    assert encoded.num_entries == len(ordered) - 1 and encoded.first_value == ordered[0]
    assert spec_decode(*encoded) == ordered
