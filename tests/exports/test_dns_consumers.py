"""serve_dns with real consumers from Debian's packages: Unbound and BIND 9 as RPZ
secondaries (AXFR at start, NOTIFY + IXFR after a change), and SpamAssassin flagging
a message that links a listed domain through the URIBL zone. Skipped with the reason where
the package is not installed (`.ci/run` installs both)."""

from __future__ import annotations

import functools
import shutil
import subprocess
import time
from pathlib import Path

import dns.rcode
import pytest

from tests.support.bind9 import NAMED, named_log, running_named
from tests.support.dnsclient import ask
from tests.support.unbound import UNBOUND, free_port, start_unbound
from urlguard.models import SpamRule
from urlguard.writepath.changes import add_rule, remove_rule

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

RPZ = "rpz.urlguard."
URIBL = "uribl.urlguard."
SPAMASSASSIN = shutil.which("spamassassin") or "/usr/bin/spamassassin"


def until(predicate, seconds: float = 15.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not Path(UNBOUND).exists(), reason="Debian's unbound is not installed")
def resolved_rcode(port: int, name: str) -> int | None:
    """The rcode the resolver on `port` answers for `name`; None while it answers none."""
    try:
        return ask(port, name, timeout=1).rcode()
    except Exception:
        return None


def test_unbound_secondary_follows_the_list_by_notify_and_ixfr(dns_server, sync_filter, tmp_path):
    add_rule("evil.example/", category="phishing", source="test")
    port = free_port()
    server = dns_server(notify=(("127.0.0.1", port),))
    names = {"evil": "192.0.2.1", "www.evil": "192.0.2.1", "fresh": "192.0.2.2"}
    names |= {"deep.www.fresh": "192.0.2.2", "clean": "192.0.2.3"}
    # verbosity 4: the log says whether a change came by IXFR
    unbound = start_unbound(
        tmp_path, port=port, primary=server.port, zone=RPZ, names=names, verbosity=4
    )
    try:
        rcode = functools.partial(resolved_rcode, port)

        # The zone's first transfer (AXFR) at start.
        assert until(lambda: rcode("evil.example.") == dns.rcode.NXDOMAIN), _log(tmp_path)
        assert rcode("www.evil.example.") == dns.rcode.NXDOMAIN
        assert rcode("clean.example.") == dns.rcode.NOERROR
        assert rcode("fresh.example.") == dns.rcode.NOERROR
        # A new rule: NOTIFY, then IXFR, within seconds (the SOA refresh is a minute).
        added = time.monotonic()
        add_rule("fresh.example/", category="spam", source="test")
        assert until(lambda: rcode("fresh.example.") == dns.rcode.NXDOMAIN), _log(tmp_path)
        assert rcode("deep.www.fresh.example.") == dns.rcode.NXDOMAIN
        assert time.monotonic() - added < 10
        remove_rule(SpamRule.objects.get(expression="evil.example/"))
        assert until(lambda: rcode("evil.example.") == dns.rcode.NOERROR), _log(tmp_path)
        assert rcode("www.evil.example.") == dns.rcode.NOERROR
        assert "IXFR packet" in _log(tmp_path)  # incremental, not a whole transfer
    finally:
        unbound.terminate()
        unbound.wait(10)


@pytest.mark.skipif(not Path(UNBOUND).exists(), reason="Debian's unbound is not installed")
def test_an_allowlisted_exception_reaches_unbound_by_notify_and_ixfr(
    dns_server, sync_filter, tmp_path
):
    from urlguard.writepath.allowlist import allow_host, unallow_host

    add_rule("evil.example/", category="phishing", source="test")
    port = free_port()
    server = dns_server(notify=(("127.0.0.1", port),))
    names = {"partner.hosting": "192.0.2.4", "other.hosting": "192.0.2.5", "evil": "192.0.2.1"}
    # Another provider's zone, listed after ours, blocks the whole hosting platform.
    unbound = start_unbound(
        tmp_path,
        port=port,
        primary=server.port,
        zone=RPZ,
        names=names,
        verbosity=4,
        local_rpz=["hosting.example CNAME .", "*.hosting.example CNAME ."],
    )
    try:
        rcode = functools.partial(resolved_rcode, port)

        assert until(lambda: rcode("evil.example.") == dns.rcode.NXDOMAIN), _log(tmp_path)
        assert rcode("partner.hosting.example.") == dns.rcode.NXDOMAIN
        # Allowlisted here: our zone's passthru, first, wins over the other zone.
        allowed = time.monotonic()
        allow_host("partner.hosting.example")
        assert until(lambda: rcode("partner.hosting.example.") == dns.rcode.NOERROR), _log(tmp_path)
        assert time.monotonic() - allowed < 10
        assert ask(port, "partner.hosting.example.").answer[0][0].to_text() == "192.0.2.4"
        assert rcode("other.hosting.example.") == dns.rcode.NXDOMAIN
        unallow_host("partner.hosting.example")
        assert until(lambda: rcode("partner.hosting.example.") == dns.rcode.NXDOMAIN), _log(
            tmp_path
        )
        assert "IXFR packet" in _log(tmp_path)  # incremental, not a whole transfer
    finally:
        unbound.terminate()
        unbound.wait(10)


@pytest.mark.skipif(not Path(NAMED).exists(), reason="Debian's bind9 is not installed")
def test_bind_secondary_takes_the_zone_and_follows_it_by_notify_and_ixfr(
    dns_server, sync_filter, tmp_path
):
    from urlguard.writepath.allowlist import allow_host, unallow_host

    add_rule("evil.example/", category="phishing", source="test")
    port = free_port()
    server = dns_server(notify=(("127.0.0.1", port),))
    names = {"evil": "192.0.2.1", "www.evil": "192.0.2.1", "fresh": "192.0.2.2"}
    names |= {"deep.www.fresh": "192.0.2.2", "clean": "192.0.2.3"}
    names |= {"partner.hosting": "192.0.2.4", "other.hosting": "192.0.2.5"}
    # Another provider's zone, listed after ours, blocks the whole hosting platform.
    local = ["hosting.example CNAME .", "*.hosting.example CNAME ."]
    with running_named(
        tmp_path, port=port, primary=server.port, zone=RPZ, names=names, local_rpz=local
    ):
        rcode = functools.partial(resolved_rcode, port)

        # The zone's first transfer (AXFR) at start, taken as a zone.
        assert until(lambda: rcode("evil.example.") == dns.rcode.NXDOMAIN), named_log(tmp_path)
        assert "transfer of 'rpz.urlguard/IN' from 127.0.0.1" in named_log(tmp_path)
        assert rcode("www.evil.example.") == dns.rcode.NXDOMAIN
        assert ask(port, "clean.example.").answer[0][0].to_text() == "192.0.2.3"
        assert rcode("fresh.example.") == dns.rcode.NOERROR
        assert rcode("partner.hosting.example.") == dns.rcode.NXDOMAIN
        # A new rule: NOTIFY, then IXFR, within seconds (the SOA refresh is a minute).
        added = time.monotonic()
        add_rule("fresh.example/", category="spam", source="test")
        assert until(lambda: rcode("fresh.example.") == dns.rcode.NXDOMAIN), named_log(tmp_path)
        assert rcode("deep.www.fresh.example.") == dns.rcode.NXDOMAIN
        assert time.monotonic() - added < 10
        # A removal.
        remove_rule(SpamRule.objects.get(expression="evil.example/"))
        assert until(lambda: rcode("evil.example.") == dns.rcode.NOERROR), named_log(tmp_path)
        assert ask(port, "www.evil.example.").answer[0][0].to_text() == "192.0.2.1"
        # Allowlisted here: our zone's rpz-passthru, first, wins over the other zone.
        allow_host("partner.hosting.example")
        assert until(lambda: rcode("partner.hosting.example.") == dns.rcode.NOERROR), named_log(
            tmp_path
        )
        assert ask(port, "partner.hosting.example.").answer[0][0].to_text() == "192.0.2.4"
        assert rcode("other.hosting.example.") == dns.rcode.NXDOMAIN
        unallow_host("partner.hosting.example")
        assert until(lambda: rcode("partner.hosting.example.") == dns.rcode.NXDOMAIN), named_log(
            tmp_path
        )
        log = named_log(tmp_path)
        assert "bad zone" not in log
        # Every change came by IXFR, and incremental, not as a whole zone.
        assert "got incremental response" in log and "nonincremental" not in log
    assert not (tmp_path / "named.pid").exists()  # stopped: named removes its pid file


def _log(tmp_path: Path) -> str:
    path = tmp_path / "unbound.log"
    return path.read_text()[-30000:] if path.exists() else "(no unbound log)"


SPAMASSASSIN_CF = """
loadplugin Mail::SpamAssassin::Plugin::URIDNSBL
# SpamAssassin asks about registered domains: make .example a TLD to it.
util_rb_tld example
dns_available yes
dns_server 127.0.0.1:{port}
use_bayes 0
report_safe 0
add_header all Status _YESNO_, score=_SCORE_ tests=_TESTS_
urirhssub URLGUARD_MALWARE {zone} A 4
body URLGUARD_MALWARE eval:check_uridnsbl('URLGUARD_MALWARE')
tflags URLGUARD_MALWARE net
score URLGUARD_MALWARE 6.0
urirhssub URLGUARD_PHISHING {zone} A 2
body URLGUARD_PHISHING eval:check_uridnsbl('URLGUARD_PHISHING')
tflags URLGUARD_PHISHING net
score URLGUARD_PHISHING 6.0
"""

MESSAGE = """From: someone@sender.example
To: you@receiver.example
Subject: your parcel
Message-ID: <1@sender.example>
Date: Thu, 26 Nov 2026 03:00:00 +0000

Track it here: http://www.{host}/track?id=42
"""


@pytest.mark.skipif(
    not Path(SPAMASSASSIN).exists(), reason="Debian's spamassassin is not installed"
)
def test_spamassassin_flags_a_message_linking_a_listed_domain(dns_server, sync_filter, tmp_path):
    add_rule("parcel-tracking.example/", category="malware", source="test")
    sync_filter()
    server = dns_server()
    config = tmp_path / "sa"
    config.mkdir()
    for pre in Path("/etc/spamassassin").glob("*.pre"):  # the plugins it always loads
        shutil.copy(pre, config)
    (config / "local.cf").write_text(SPAMASSASSIN_CF.format(port=server.port, zone=URIBL))

    def hits(host: str) -> str:
        run = subprocess.run(
            [
                SPAMASSASSIN,
                "-t",
                "-C",
                str(config),
                "--siteconfigpath",
                str(config),
                "-p",
                "/dev/null",
                "-x",
            ],
            input=MESSAGE.format(host=host),
            capture_output=True,
            text=True,
            timeout=120,
        )
        return run.stdout.partition("\n\n")[0]  # the headers: X-Spam-Status

    flagged = hits("parcel-tracking.example")
    assert "X-Spam-Status: Yes" in flagged and "URLGUARD_MALWARE" in flagged
    assert "URLGUARD_PHISHING" not in flagged  # the category: only malware's bit
    clean = hits("clean-shop.example")
    assert "X-Spam-Status: No" in clean and "URLGUARD" not in clean
