"""Firefox ESR (Debian's), headless with a fresh profile whose Safe Browsing v4
provider points at a live server, judges the Safe Browsing API: after its list
update it shows its own block page for a listed URL and loads an unlisted one. The
pages come from a loopback server that Firefox reaches as its HTTP proxy, so no
name is resolved and nothing leaves the machine."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.browser.marionette import Marionette
from urlguard.models import HitEvent, SpamRule
from urlguard.operations import apikeys
from urlguard.runtime import stats
from urlguard.writepath.changes import add_rule, remove_rule

FIREFOX = shutil.which("firefox-esr") or shutil.which("firefox")

pytestmark = [
    pytest.mark.django_db(transaction=True),
    # Under CI a missing Firefox fails the test (.ci/run installs firefox-esr).
    pytest.mark.skipif(
        FIREFOX is None and not os.environ.get("CI"),
        reason="Firefox is not installed (apt-get install firefox-esr; .ci/run does it)",
    ),
]

LISTS = "goog-phish-proto,goog-malware-proto,goog-unwanted-proto"


class _Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"<!doctype html><title>a page</title><p>the page itself"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def pages() -> Iterator[int]:
    """Every page Firefox asks for, as its HTTP proxy: the port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()
    thread.join()


def _prefs(base: str, key: str, proxy: int) -> dict[str, object]:
    api = f"{base}/safebrowsing/v4"
    return {
        # What an operator sets (README "Protect browsers with your list").
        "browser.safebrowsing.provider.google4.updateURL": (
            f"{api}/threatListUpdates:fetch?$ct=application/x-protobuf&key={key}&$httpMethod=POST"
        ),
        "browser.safebrowsing.provider.google4.gethashURL": (
            f"{api}/fullHashes:find?$ct=application/x-protobuf&key={key}&$httpMethod=POST"
        ),
        "browser.safebrowsing.provider.google4.lists": LISTS,
        "browser.safebrowsing.provider.google4.excludeFromGoogleSafeBrowsingKeyCheck": True,
        "browser.safebrowsing.provider.google5.enabled": False,
        "browser.safebrowsing.phishing.enabled": True,
        "browser.safebrowsing.malware.enabled": True,
        "urlclassifier.phishTable": "goog-phish-proto",
        "urlclassifier.malwareTable": "goog-malware-proto,goog-unwanted-proto",
        # Nothing else is fetched: no other provider, no telemetry, pages via our proxy.
        "browser.safebrowsing.provider.google.updateURL": "",
        "browser.safebrowsing.provider.google.gethashURL": "",
        "browser.safebrowsing.provider.mozilla.updateURL": "",
        "browser.safebrowsing.provider.mozilla.gethashURL": "",
        "browser.safebrowsing.downloads.remote.enabled": False,
        "network.proxy.type": 1,
        "network.proxy.http": "127.0.0.1",
        "network.proxy.http_port": proxy,
        "network.proxy.ssl": "127.0.0.1",
        "network.proxy.ssl_port": proxy,
        "network.captive-portal-service.enabled": False,
        "network.connectivity-service.enabled": False,
        "datareporting.policy.dataSubmissionEnabled": False,
        "toolkit.telemetry.enabled": False,
        "app.update.auto": False,
        "extensions.update.enabled": False,
        "browser.shell.checkDefaultBrowser": False,
        "browser.startup.homepage_override.mstone": "ignore",
        "browser.aboutwelcome.enabled": False,
        "marionette.port": 0,  # Firefox picks one and names it in MarionetteActivePort
    }


@pytest.fixture
def inline_prerender(monkeypatch) -> None:
    """The lists at a new position are prepared before the request is answered."""
    from urlguard.exports import prerender

    monkeypatch.setattr(prerender, "request", prerender.render_all)


@pytest.fixture
def firefox(live_server, pages, tmp_path, inline_prerender) -> Iterator[Marionette]:
    base = live_server.url.replace("localhost", "127.0.0.1")
    key = apikeys.create_api_key("firefox")[1]
    profile = tmp_path / "profile"
    profile.mkdir()
    lines = [
        f"user_pref({_js(name)}, {_js(value)});" for name, value in _prefs(base, key, pages).items()
    ]
    (profile / "user.js").write_text("\n".join(lines) + "\n")
    env = {**os.environ, "HOME": str(tmp_path), "MOZ_HEADLESS": "1"}
    assert FIREFOX is not None
    process = subprocess.Popen(
        [
            FIREFOX,
            "--headless",
            "--marionette",
            "-remote-allow-system-access",
            "--no-remote",
            "--profile",
            str(profile),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = None
    try:
        port_file = profile / "MarionetteActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert process.poll() is None, "Firefox exited at start"
            assert time.monotonic() < deadline, "Firefox did not start Marionette"
            time.sleep(0.1)
        client = Marionette(int(port_file.read_text()))
        yield client
    finally:
        if client is not None:
            client.close()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _js(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


UPDATE = """
const [tables] = arguments;
const module = "resource://gre/modules/SafeBrowsing.sys.mjs";
ChromeUtils.importESModule(module).SafeBrowsing.init();
const manager = Cc["@mozilla.org/url-classifier/listmanager;1"].getService(Ci.nsIUrlListManager);
return manager.forceUpdates(tables);
"""
UPDATED = """
return Services.prefs.getCharPref("browser.safebrowsing.provider.google4.lastupdatetime", "");
"""


def _update(firefox: Marionette) -> None:
    """Have Firefox update its lists now (it would wait up to a minute after start)
    and wait until it has."""
    before = firefox.script(UPDATED, chrome=True)
    assert firefox.script(UPDATE, LISTS, chrome=True) is not False
    deadline = time.monotonic() + 60
    while firefox.script(UPDATED, chrome=True) == before:
        assert time.monotonic() < deadline, "Firefox did not finish its list update"
        time.sleep(0.2)


def _document(firefox: Marionette, url: str) -> str:
    firefox.navigate(url)
    return str(firefox.script("return document.documentURI;"))


def test_firefox_shows_its_block_page_for_a_listed_url_and_loads_an_unlisted_one(firefox):
    add_rule("listed.example/", category="phishing", source="test")
    add_rule("pages.example/malware/", category="malware", source="test")
    _update(firefox)
    blocked = _document(firefox, "http://www.listed.example/login.html")
    assert blocked.startswith("about:blocked?e=deceptiveBlocked"), blocked
    malware = _document(firefox, "http://pages.example/malware/x.html")
    assert malware.startswith("about:blocked?e=malwareBlocked"), malware
    assert _document(firefox, "http://clean.example/") == "http://clean.example/"
    assert _document(firefox, "http://pages.example/other/") == "http://pages.example/other/"
    assert "the page itself" in firefox.script("return document.body.textContent;")
    stats.flush()
    assert HitEvent.objects.filter(action="fullhash", expression="listed.example/").exists()

    # A partial update (RICE additions and removal indices, checksum checked by Firefox).
    add_rule("second.example/", category="phishing", source="test")
    remove_rule(SpamRule.objects.get(expression="pages.example/malware/"), source="test")
    _update(firefox)
    second = _document(firefox, "http://second.example/")
    assert second.startswith("about:blocked?e=deceptiveBlocked"), second
    unlisted = "http://pages.example/malware/y.html"
    assert _document(firefox, unlisted) == unlisted
    assert _document(firefox, "http://www.listed.example/").startswith("about:blocked")
