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
