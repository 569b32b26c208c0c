"""gunicorn's access log, as the web role writes it (deploy/entrypoint.sh web, with
urlguard_service.gunicornconf), never holds a credential: not an API key sent as the
basic-auth user name or password, not a bearer token, not a key in the query string,
not even where the operator's own format asks for the user or the Authorization
header."""

from __future__ import annotations

import base64
import http.client
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.deploy import environment, free_port, web_role

KEY_AS_USER = "ugk_user7e1d0c9b8a"
KEY_AS_PASSWORD = "ugk_pass4b3a2918f7"
BEARER = "ugk_bearer0f1e2d3c4b"
IN_QUERY = "ugk_query5a6b7c8d9e"
IN_REFERER = "ugk_referer1a2b3c4d"
IN_TARGET = "ugk_target9f8e7d6c"
SECRETS = (KEY_AS_USER, KEY_AS_PASSWORD, BEARER, IN_QUERY, IN_REFERER, IN_TARGET)
# Everything gunicorn can log about a request's credentials.
FORMAT = (
    '%(h)s %(u)s "%(r)s" %(U)s %(q)s %(s)s "%({authorization}i)s" "%({cookie}i)s" '
    '"%({query_string}e)s" "%({http_authorization}e)s" "%(f)s" "%({referer}i)s" "%({raw_uri}e)s"'
)


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _send(base: str, path: str, method: str = "GET", **headers: str) -> int:
    request = urllib.request.Request(base + path, method=method, headers=headers, data=None)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_no_credential_reaches_the_access_log(tmp_path: Path, migrated: Path):
    env = environment(migrated)
    bind = f"127.0.0.1:{free_port()}"
    env.update(URLGUARD_BIND=bind, WEB_CONCURRENCY="1")
    base = f"http://{bind}"
    with web_role(env, tmp_path / "web.log", "--access-logformat", FORMAT):
        cookie = {"Cookie": "sessionid=ugk_cookie"}
        assert _send(base, "/lists/hosts.txt", Authorization=_basic(KEY_AS_USER, "")) == 401
        assert _send(base, "/lists/hosts.txt", Authorization=_basic("", KEY_AS_PASSWORD)) == 401
        assert _send(base, "/lists/hosts.txt", Authorization=f"Bearer {BEARER}", **cookie) == 401
        assert _send(base, f"/lists/hosts.txt?key={IN_QUERY}&x=1") == 401
        assert _send(base, f"/api/check?url=http://a.example/&api_key={IN_QUERY}") == 200
        # A client following a redirect may send where it came from, key and all.
        referer = f"http://{bind}/lists/hosts.txt?key={IN_REFERER}"
        assert _send(base, "/lists/hosts.txt", Referer=referer) == 401
        # A request line in absolute form, user info and all (RFC 9112 section 3.2.2).
        connection = http.client.HTTPConnection(bind, timeout=30)
        connection.putrequest("GET", f"http://ugk:{IN_TARGET}@{bind}/lists/hosts.txt")
        connection.endheaders()
        connection.getresponse().read()  # refused either way: the log is judged
        connection.close()
    text = (tmp_path / "web.log").read_text()
    assert text.count('"GET /lists/hosts.txt') == 5, text  # each request is logged
    assert f'"GET http://[redacted]@{bind}/lists/hosts.txt HTTP/1.1"' in text, text
    assert "key=[redacted]&x=1" in text and "url=http://a.example/&api_key=[redacted]" in text
    for secret in (*SECRETS, "ugk_cookie"):
        assert secret not in text, (secret, text)
    for secret in SECRETS:  # nor in base64 (a Basic header logged whole)
        assert base64.b64encode(secret.encode()).decode()[:12] not in text, (secret, text)
