"""urlguard_service.accesslog: gunicorn's access-log atoms with every credential
replaced, the rest of the request kept (the real gunicorn run is
tests/deploy/test_access_log.py)."""

from __future__ import annotations

import base64
import datetime
from types import SimpleNamespace

import pytest
from gunicorn.config import Config

from urlguard_service.accesslog import REDACTED, RedactingLogger, redact_query


@pytest.mark.parametrize(
    ("query", "logged"),
    [
        ("", ""),
        ("url=http://a.example/", "url=http://a.example/"),
        ("key=s3cret", f"key={REDACTED}"),
        ("KEY=s3cret&x=1", f"KEY={REDACTED}&x=1"),
        ("k%65y=s3cret", f"k%65y={REDACTED}"),  # the name as the application reads it
        ("a=1&api_key=s&apikey=s&access_token=s", f"a=1&api_key={REDACTED}&apikey={REDACTED}"
         f"&access_token={REDACTED}"),
        ("key", f"key={REDACTED}"),
        ("monkey=1&keys=2", "monkey=1&keys=2"),
    ],
)  # fmt: skip
def test_redact_query(query, logged):
    assert redact_query(query) == logged


def test_the_atoms_hold_no_credential():
    logger = RedactingLogger(Config())
    basic = "Basic " + base64.b64encode(b"ugk_key:").decode()
    environ = {
        "REQUEST_METHOD": "GET",
        "RAW_URI": "/lists/abp.txt?key=ugk_q&v=2",
        "PATH_INFO": "/lists/abp.txt",
        "QUERY_STRING": "key=ugk_q&v=2",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "192.0.2.1",
        "HTTP_AUTHORIZATION": basic,
        "HTTP_COOKIE": "sessionid=ugk_c",
    }
    request = SimpleNamespace(headers=[("AUTHORIZATION", basic), ("COOKIE", "sessionid=ugk_c")])
    response = SimpleNamespace(status="401 Unauthorized", headers=[("Set-Cookie", "x=ugk_s")])
    atoms = logger.atoms(response, request, environ, datetime.timedelta(seconds=1))
    assert atoms["u"] == "-"
    assert atoms["r"] == f"GET /lists/abp.txt?key={REDACTED}&v=2 HTTP/1.1"
    assert atoms["q"] == f"key={REDACTED}&v=2"
    assert "ugk_" not in repr(atoms)
    assert atoms["h"] == "192.0.2.1" and atoms["s"] == "401"


@pytest.mark.parametrize(
    ("target", "logged"),
    [
        ("/lists/hosts.txt?key=ugk_q", f"/lists/hosts.txt?key={REDACTED}"),
        # The absolute form a request line may carry (RFC 9112 3.2.2), user info and all.
        ("http://ugk:ugk_k@guard.example/lists/hosts.txt", f"http://{REDACTED}@guard.example/lists/hosts.txt"),
        ("HTTPS://ugk_k@guard.example/?key=ugk_q", f"HTTPS://{REDACTED}@guard.example/?key={REDACTED}"),
        ("http://u:p@ss@guard.example/", f"http://{REDACTED}@guard.example/"),  # the last @
        ("http://guard.example/a@b", "http://guard.example/a@b"),  # an @ in the path is no user
        ("/a@b?x=1", "/a@b?x=1"),
    ],
)  # fmt: skip
def test_a_logged_target_or_referer_holds_no_user_info_nor_key(target, logged):
    logger = RedactingLogger(Config())
    environ = {
        "REQUEST_METHOD": "GET",
        "RAW_URI": target,
        "PATH_INFO": "/lists/hosts.txt",
        "QUERY_STRING": "",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "192.0.2.1",
        # gunicorn's default format logs the Referer (%(f)s): a client following a
        # redirect may send the URL it came from, key and all.
        "HTTP_REFERER": target,
    }
    request = SimpleNamespace(headers=[("REFERER", target)])
    response = SimpleNamespace(status="401 Unauthorized", headers=[])
    atoms = logger.atoms(response, request, environ, datetime.timedelta(seconds=1))
    assert atoms["r"] == f"GET {logged} HTTP/1.1"
    assert atoms["{raw_uri}e"] == atoms["f"] == atoms["{referer}i"] == logged
    assert atoms["{http_referer}e"] == logged
