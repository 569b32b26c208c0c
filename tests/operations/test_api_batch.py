"""POST /api/check {"urls": [...]}: an API key, up to API_MAX_URLS URLs answered in
order through Guard.check_many, unusable entries answered in their slot, and a JSON
refusal with the right status for everything else."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import OperationalError
from django.test import Client

from urlguard.hotpath import guard as guard_module
from urlguard.hotpath.guard import Guard
from urlguard.models import APIKey
from urlguard.operations import apikeys
from urlguard.writepath.changes import add_rule

pytestmark = pytest.mark.django_db


@pytest.fixture
def rules(db, build_filter, fresh_guard):
    add_rule("evil.example/", category="phishing", source="test")
    add_rule("site.example/free/", category="spam", source="test")
    build_filter()


@pytest.fixture
def key(db) -> str:
    return apikeys.create_api_key("gateway")[1]


@pytest.fixture
def api(key):
    """post(body, key=...) -> response, through a client that enforces CSRF like a
    browser would: the API must not need a CSRF token."""
    client = Client(enforce_csrf_checks=True)

    def post(body, *, key=key, **extra):
        headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key is not None else {}
        data = body if isinstance(body, (str, bytes)) else json.dumps(body)
        return client.post(
            "/api/check", data=data, content_type="application/json", **headers, **extra
        )

    return post


def _urls(n: int) -> list[str]:
    return [f"https://shop{i}.example/item/{i}?ref=mail" for i in range(n)]


def test_one_url_answers_like_the_get(api, rules, client):
    response = api({"urls": ["http://login.evil.example/x"]})
    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    single = client.get("/api/check", {"url": "http://login.evil.example/x"}).json()
    assert response.json() == {"results": [single]}
    assert single["blocked"] is True and single["rule"] == "evil.example/"


@pytest.mark.parametrize("degraded", [False, True])
def test_the_batch_answer_is_the_json_of_each_verdict_byte_for_byte(
    api, rules, use_guard, degraded
):
    from django.http import JsonResponse

    from urlguard.operations.api import verdict_json

    if degraded:
        use_guard(Guard(lambda: None))
    urls = [
        'https://www.shop.example/c/\u00fc?q="quoted"&x=\\',  # escaped as JSON must
        "http://login.evil.example/x",
        "HTTP://Site.example/free/b#top",
        "mailto:x@y.example",
        "https://b\u00fccher.example/",
        "http://a.example/" + "\u2028\U0001f600",
    ]
    response = api({"urls": [*urls, 7, None, 1.5, ["nested"]]})
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    expected = [verdict_json(v) for v in guard_module.get_guard().check_many(urls)]
    expected += [
        {"url": 7, "error": "not a string"},
        {"url": None, "error": "not a string"},
        {"url": 1.5, "error": "not a string"},
        {"url": None, "error": "not a string"},
    ]
    assert response.content == JsonResponse({"results": expected}).content
    results = response.json()["results"]
    assert [r.get("blocked") for r in results[:3]] == [False, True, True]
    assert results[0]["degraded"] is degraded and "error" in results[3]


def test_a_thousand_urls_in_order_with_one_probe_and_one_query(
    api, rules, django_assert_max_num_queries
):
    urls = _urls(1000)
    urls[10] = "http://evil.example/a"
    urls[500] = "http://site.example/free/b"
    api({"urls": ["https://warm.example/"]})  # the key's last use, written once a minute
    # The key lookup and one table query for the filter's hits.
    with django_assert_max_num_queries(2):
        response = api({"urls": urls})
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["url"] for r in results] == urls
    assert [i for i, r in enumerate(results) if r["blocked"]] == [10, 500]
    assert results[500]["category"] == "spam"


def test_more_than_the_maximum_is_a_413(api, rules, settings):
    response = api({"urls": _urls(1001)})
    assert response.status_code == 413
    assert response.json() == {"error": "1001 URLs in one request; at most 1000 are allowed"}
    settings.URLGUARD = {**settings.URLGUARD, "API_MAX_URLS": 3}
    assert api({"urls": _urls(3)}).status_code == 200
    assert api({"urls": _urls(4)}).status_code == 413


def test_a_body_over_the_bound_is_a_413(api, rules, settings):
    settings.URLGUARD = {**settings.URLGUARD, "API_MAX_BODY_BYTES": 200}
    response = api({"urls": _urls(20)})
    assert response.status_code == 413
    assert response.json() == {"error": "the request body is larger than 200 bytes"}


def test_unusable_entries_are_answered_in_their_slot(api, rules):
    urls = ["https://ok.example/", "javascript:alert(1)", 5, None, "", "http://evil.example/"]
    results = api({"urls": urls}).json()["results"]
    assert [r["url"] for r in results] == urls
    assert results[0]["blocked"] is False and "error" not in results[0]
    assert "not a usable http(s) URL" in results[1]["error"] and "blocked" not in results[1]
    assert results[2] == {"url": 5, "error": "not a string"}
    assert results[3] == {"url": None, "error": "not a string"}
    assert "not a usable http(s) URL" in results[4]["error"]
    assert results[5]["blocked"] is True


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("{not json", "the body is not JSON"),
        (b"\xff\xfe", "the body is not JSON"),
        ('["https://a.example/"]', 'the body must be a JSON object {"urls": [...]}'),
        ('{"urls": "https://a.example/"}', 'the body must be a JSON object {"urls": [...]}'),
        ("{}", 'the body must be a JSON object {"urls": [...]}'),
    ],
)
def test_a_malformed_body_is_a_400(api, rules, body, error):
    response = api(body)
    assert response.status_code == 400
    assert response.json()["error"].startswith(error)


def test_an_empty_list_is_an_empty_answer(api, rules):
    assert api({"urls": []}).json() == {"results": []}


@pytest.mark.parametrize(
    ("header", "error"),
    [
        (None, "an API key is required"),
        ("Bearer ", "an API key is required"),
        ("Basic dXNlcjpwYXNz", "an API key is required"),
        ("Bearer ugk_not-a-key", "unknown or revoked API key"),
    ],
)
def test_a_missing_or_wrong_key_is_a_401(api, rules, header, error):
    extra = {"HTTP_AUTHORIZATION": header} if header is not None else {}
    response = api({"urls": ["https://a.example/"]}, key=None, **extra)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="urlguard"'
    assert response.json()["error"].startswith(error)


def test_a_revoked_key_is_a_401(api, rules, key):
    assert api({"urls": ["https://a.example/"]}).status_code == 200
    assert apikeys.revoke(APIKey.objects.filter(name="gateway")) == 1
    response = api({"urls": ["https://a.example/"]})
    assert response.status_code == 401
    assert response.json()["error"].startswith("unknown or revoked API key")


def test_the_rate_limit_is_per_key(api, rules, settings):
    settings.URLGUARD = {**settings.URLGUARD, "API_KEY_RATE": "2/m"}
    other = apikeys.create_api_key("other")[1]
    for _ in range(2):
        assert api({"urls": ["https://a.example/"]}).status_code == 200
    refused = api({"urls": ["https://a.example/"]})
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert refused.json()["error"].startswith("rate limit of 2/m requests reached for this API key")
    assert api({"urls": ["https://a.example/"]}, key=other).status_code == 200


def test_last_use_is_written_at_most_once_a_minute(api, rules, django_assert_num_queries):
    row = APIKey.objects.get(name="gateway")
    assert row.last_used_at is None
    api({"urls": []})
    first = APIKey.objects.get(pk=row.pk).last_used_at
    assert first is not None
    with django_assert_num_queries(1):  # the lookup; no write
        api({"urls": []})
    assert APIKey.objects.get(pk=row.pk).last_used_at == first
    APIKey.objects.filter(pk=row.pk).update(last_used_at=first - timedelta(minutes=2))
    api({"urls": []})
    assert APIKey.objects.get(pk=row.pk).last_used_at > first - timedelta(seconds=1)


def test_only_a_hash_is_stored(db):
    row, key = apikeys.create_api_key("stored")
    assert key.startswith("ugk_") and len(key) > 40
    stored = APIKey.objects.filter(pk=row.pk).values()[0]
    assert key not in json.dumps(stored, default=str)
    assert stored["key_hash"] == apikeys.hash_key(key) and stored["prefix"] == key[:10]


def test_degraded_answers_say_so(api, db, use_guard):
    use_guard(Guard(lambda: None, on_filter_error="open"))
    response = api({"urls": ["http://evil.example/", "https://b.example/"]})
    assert response.status_code == 200
    assert response["X-URLGuard"] == "degraded"
    assert all(r["degraded"] for r in response.json()["results"])


def test_a_failing_check_is_a_json_503(api, rules, monkeypatch):
    def explode(urls):
        raise OperationalError("the database is gone")

    monkeypatch.setattr(guard_module.get_guard(), "check_many", explode)
    response = api({"urls": ["http://evil.example/"]})
    assert response.status_code == 503
    assert response["Retry-After"] == "30"
    assert "try again" in response.json()["error"]


def test_a_key_table_that_cannot_be_read_is_a_json_503(api, rules, monkeypatch):
    def explode(header):
        raise OperationalError("the database is gone")

    monkeypatch.setattr(apikeys, "authenticate", explode)
    response = api({"urls": ["http://evil.example/"]})
    assert response.status_code == 503


def test_a_refused_key_is_no_use(api, rules):
    api({"urls": ["https://a.example/"]}, key="ugk_wrong")
    assert APIKey.objects.get(name="gateway").last_used_at is None


# -- every malformed body is a JSON 400; the work of one request is bounded ----------


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("[" * 200_000 + "]" * 200_000, "the body is nested too deeply"),
        ('{"urls": ' + "[" * 100_000 + "]" * 100_000 + "}", "the body is nested too deeply"),
        ('{"urls": [NaN]}', "the body is not JSON"),
        ('{"urls": ["a"], "x": Infinity}', "the body is not JSON"),
        ('{"urls": [' + "1" * 5000 + "]}", "the body is not JSON"),
        (b'{"urls": ["\xc3\x28"]}', "the body is not JSON"),
        (b"\x00\x00\xfe\xff", "the body is not JSON"),
    ],
    ids=["deep", "deep-urls", "nan", "infinity", "huge-int", "bad-utf8", "utf32-junk"],
)
def test_every_malformed_body_is_a_json_400(api, rules, body, error):
    response = api(body)
    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"].startswith(error)


def test_entries_of_any_json_type_are_answered_in_their_slot(api, rules):
    deep = "[" * 400 + "]" * 400  # decodes, but is not repeated back
    body = '{"urls": [1e400, {"u": "http://evil.example/"}, ' + deep + ", true, 2.5]}"
    response = api(body)
    assert response.status_code == 200
    assert response.json()["results"] == [
        {"url": None, "error": "not a string"},
        {"url": None, "error": "not a string"},
        {"url": None, "error": "not a string"},
        {"url": True, "error": "not a string"},
        {"url": 2.5, "error": "not a string"},
    ]


def test_a_url_over_the_length_bound_is_answered_in_its_slot(api, rules, settings):
    settings.URLGUARD = {**settings.URLGUARD, "API_MAX_URL_LENGTH": 40}
    long = "http://evil.example/" + "a" * 21
    results = api({"urls": [long, "http://evil.example/"]}).json()["results"]
    assert results[0] == {
        "url": long,
        "error": "not a usable http(s) URL: it is 41 characters long; at most 40 are checked",
    }
    assert results[1]["blocked"] is True


def test_urls_over_the_batch_bound_are_a_413(api, rules, settings):
    settings.URLGUARD = {**settings.URLGUARD, "API_MAX_BATCH_CHARS": 100}
    assert api({"urls": ["http://a.example/" + "b" * 33] * 2}).status_code == 200  # 100
    response = api({"urls": ["http://a.example/" + "b" * 33] * 2 + ["c"]})
    assert response.status_code == 413
    assert response.json()["error"].startswith(
        "the URLs add up to 101 characters; at most 100 are allowed in one request"
    )


def test_the_review_batch_of_dense_escapes_is_refused_at_once(api, rules):
    # 66 URLs of 9,900 "%25" fit the body bound (1.96 MB) and cost 0.75-0.95 s to
    # canonicalize; they are refused before any of that.
    urls = ["http://a.example/" + "%25" * 9900] * 66
    response = api({"urls": urls})
    assert response.status_code == 413
    assert "at most 524288 are allowed" in response.json()["error"]


# -- wrong keys are rate-limited per client address -----------------------------------


def test_wrong_keys_are_limited_per_address_even_before_a_right_one(api, rules, key, settings):
    settings.URLGUARD = {**settings.URLGUARD, "API_FAILED_KEY_RATE": "3/m"}
    here = {"REMOTE_ADDR": "2001:db8:1:2::10"}
    for _ in range(3):
        assert api({"urls": []}, key="ugk_wrong", **here).status_code == 401
    refused = api({"urls": []}, key="ugk_wrong", **here)
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert refused.json()["error"].startswith(
        "rate limit of 3/m requests with a wrong API key reached for this address"
    )
    # The right key from that address too (no oracle), and from its /64 neighbours.
    assert api({"urls": []}, REMOTE_ADDR="2001:db8:1:2::10").status_code == 429
    assert api({"urls": []}, REMOTE_ADDR="2001:db8:1:2:ffff::1").status_code == 429
    assert api({"urls": []}, REMOTE_ADDR="2001:db8:1:3::10").status_code == 200
    assert api({"urls": []}, REMOTE_ADDR="198.51.100.7").status_code == 200


def test_right_keys_do_not_count_as_wrong_ones(api, rules, settings):
    settings.URLGUARD = {**settings.URLGUARD, "API_FAILED_KEY_RATE": "1/m"}
    for _ in range(3):
        assert api({"urls": []}).status_code == 200
    assert api({"urls": []}, key=None).status_code == 401
    assert api({"urls": []}).status_code == 429


# -- an outage is logged once, not per request ----------------------------------------


@pytest.fixture
def fresh_outage_log():
    """The outage log of this process as if no outage had been logged yet."""
    from urlguard.hotpath import unavailable

    unavailable._log._last.clear()
    unavailable._log._suppressed.clear()


def test_a_database_outage_is_logged_once_a_minute_not_per_request(
    api, rules, client, database_fails, fresh_outage_log, caplog
):
    database_fails(OperationalError("connection refused"))
    with caplog.at_level("DEBUG", logger="urlguard"):
        for _ in range(5):
            assert api({"urls": ["http://evil.example/"]}).status_code == 503
        for _ in range(5):  # a filter hit, confirmed in the table
            assert client.get("/api/check", {"url": "http://evil.example/"}).status_code == 503
    errors = [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL", "WARNING")]
    assert [(r.name, r.getMessage(), bool(r.exc_info)) for r in errors] == [
        (
            "urlguard.hotpath.unavailable",
            "the database cannot be reached: POST /api/check answered 503 (connection refused)",
            False,
        )
    ]
    per_request = [r for r in caplog.records if r.levelname == "DEBUG" and "503" in r.getMessage()]
    assert len(per_request) == 10 and not any(r.exc_info for r in per_request)


def test_the_next_line_counts_the_requests_the_outage_failed(
    api, rules, database_fails, fresh_outage_log, caplog, monkeypatch
):
    from urlguard.hotpath import unavailable

    database_fails(OperationalError("connection refused"))
    for _ in range(4):
        api({"urls": ["http://evil.example/"]})
    monkeypatch.setattr(unavailable._log, "interval", 0)  # a minute later
    with caplog.at_level("ERROR"):
        api({"urls": ["http://evil.example/"]})
    assert caplog.records[-1].getMessage() == (
        "the database cannot be reached: POST /api/check answered 503 (connection refused) "
        "(3 more requests failed by it since the last such line)"
    )


def test_an_unknown_failure_keeps_its_traceback_every_time(api, rules, monkeypatch, caplog):
    def explode(urls):
        raise RuntimeError("a bug")

    monkeypatch.setattr(guard_module.get_guard(), "check_many", explode)
    with caplog.at_level("ERROR"):
        for _ in range(2):
            assert api({"urls": ["http://evil.example/"]}).status_code == 503
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 2
    assert all(
        r.name == "urlguard.operations.api" and r.exc_info[0] is RuntimeError for r in errors
    )
