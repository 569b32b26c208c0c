"""manage.py serve_dns, asked with dnspython: authoritative for its two zones only,
the URIBL zone answered live (category bitmask, TXT, RFC 5782 test points, never
127.0.0.1), the RPZ zone transferred (AXFR, IXFR from the change log, a full zone past
the journal window) only to allowed networks, NOTIFY after a change, malformed
packets dropped and counted, rate limiting (its buckets: test_dnsratelimit.py),
TCP slots (their bookkeeping: test_dnstcpslots.py)."""

from __future__ import annotations

import ipaddress
import itertools
import logging
import re
import socket
import threading

import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdatatype
import pytest

from tests.support.dnsclient import ask, transfer
from urlguard.exports.categories import CATEGORY_TABLE, uribl_address
from urlguard.models import ChangeEvent, SpamRule
from urlguard.runtime import metrics
from urlguard.writepath.changes import add_rule, remove_rule

pytestmark = pytest.mark.django_db(transaction=True)

RPZ = "rpz.urlguard."
URIBL = "uribl.urlguard."


@pytest.fixture
def listed(sync_filter):
    add_rule("evil.example/", category="malware", source="test")
    add_rule("login.bank.example/", category="phishing", source="test")
    add_rule("pages.example/bad/", category="spam", source="test")
    sync_filter()


def records(rrsets):
    return {(r.name.to_text(), r[0].to_text()) for r in rrsets if r.rdtype == dns.rdatatype.CNAME}


def test_refuses_every_other_name_and_never_recurses(dns_server):
    server = dns_server()
    answer = ask(server.port, "www.python.org.")
    assert answer.rcode() == dns.rcode.REFUSED
    assert not answer.flags & dns.flags.RA and not answer.answer


def test_uribl_lists_a_listed_host_with_its_category_bits(dns_server, listed):
    server = dns_server()
    answer = ask(server.port, f"evil.example.{URIBL}")
    assert answer.flags & dns.flags.AA
    assert [r.to_text() for r in answer.answer[0]] == ["127.0.0.4"]
    assert ask(server.port, f"www.evil.example.{URIBL}").answer[0][0].to_text() == "127.0.0.4"
    txt = ask(server.port, f"evil.example.{URIBL}", "TXT").answer[0][0].to_text()
    assert txt == '"listed by urlguard rule evil.example/ (malware)"'


def test_the_uribl_txt_names_the_report_desk_when_there_is_one(dns_server, listed, settings):
    """This service's report form takes only a link signed for the warned visitor's
    browser, which a TXT lookup has none of (such a link answered 400): the TXT links
    a desk REPORT_MISTAKE_URL names, as the warning page does, and else none."""
    desk = "https://desk.example/wrongly-blocked"
    settings.URLGUARD = {**settings.URLGUARD, "REPORT_MISTAKE_URL": desk}
    server = dns_server()
    txt = ask(server.port, f"www.evil.example.{URIBL}", "TXT").answer[0][0].to_text()
    assert txt == (
        '"listed by urlguard rule evil.example/ (malware); report: '
        f'{desk}?url=http%3A%2F%2Fwww.evil.example%2F"'
    )


def test_uribl_not_listed_is_nxdomain_with_the_soa(dns_server, listed):
    server = dns_server()
    for name in ("clean.example", "bank.example", "pages.example"):
        answer = ask(server.port, f"{name}.{URIBL}")
        assert answer.rcode() == dns.rcode.NXDOMAIN, name
        assert answer.authority[0].rdtype == dns.rdatatype.SOA


def test_uribl_answers_a_new_rule_at_once(dns_server, listed, sync_filter):
    server = dns_server()
    assert ask(server.port, f"new.example.{URIBL}").rcode() == dns.rcode.NXDOMAIN
    add_rule("new.example/", category="spam", source="test")
    sync_filter()
    assert ask(server.port, f"new.example.{URIBL}").answer[0][0].to_text() == "127.0.0.8"


def test_rfc5782_test_points_and_reversed_addresses(dns_server, sync_filter):
    add_rule("203.0.113.9/", category="phishing", source="test")
    sync_filter()
    server = dns_server()
    assert ask(server.port, f"2.0.0.127.{URIBL}").answer[0][0].to_text() == "127.0.0.2"
    assert ask(server.port, f"test.{URIBL}").answer[0][0].to_text() == "127.0.0.2"
    assert ask(server.port, f"1.0.0.127.{URIBL}").rcode() == dns.rcode.NXDOMAIN
    assert ask(server.port, f"invalid.{URIBL}").rcode() == dns.rcode.NXDOMAIN
    assert ask(server.port, f"9.113.0.203.{URIBL}").answer[0][0].to_text() == "127.0.0.2"


def nibbles(address: str) -> str:
    """RFC 5782 section 2.4: the address's 32 hex digits, least significant first."""
    return ".".join(reversed(ipaddress.IPv6Address(address).exploded.replace(":", "")))


def test_ipv6_addresses_are_asked_in_reversed_nibbles(dns_server, sync_filter):
    add_rule("http://[2001:DB8::5]/", category="malware", source="test")
    sync_filter()
    server = dns_server()
    name = f"{nibbles('2001:db8::5')}.{URIBL}"
    assert name.startswith("5.0.0.0.") and name.count(".") == 32 + 2
    assert [r.to_text() for r in ask(server.port, name).answer[0]] == ["127.0.0.4"]
    txt = ask(server.port, name, "TXT").answer[0][0].to_text()
    assert "[2001:db8::5]/" in txt and "malware" in txt
    assert ask(server.port, f"{nibbles('2001:db8::6')}.{URIBL}").rcode() == dns.rcode.NXDOMAIN
    # RFC 5782 section 5: the IPv6 test points.
    assert ask(server.port, f"{nibbles('::ffff:7f00:2')}.{URIBL}").answer[0][0].to_text() == (
        "127.0.0.2"
    )
    assert ask(server.port, f"{nibbles('::ffff:7f00:1')}.{URIBL}").rcode() == dns.rcode.NXDOMAIN
    # 31 or 33 digits, or a label of two, name no address.
    short = f"{nibbles('2001:db8::5').partition('.')[2]}.{URIBL}"
    assert ask(server.port, short).rcode() == dns.rcode.NXDOMAIN


def test_no_listing_is_ever_127_0_0_1():
    categories = list(CATEGORY_TABLE)
    for n in range(len(categories) + 1):
        for subset in itertools.combinations(categories, n):
            assert uribl_address(set(subset)) != "127.0.0.1"
    assert len({c.uribl_bit for c in CATEGORY_TABLE.values()}) == len(CATEGORY_TABLE)


def test_soa_and_ns_at_both_apexes(dns_server, listed):
    server = dns_server()
    for zone in (RPZ, URIBL):
        soa = ask(server.port, zone, "SOA")
        assert soa.flags & dns.flags.AA and soa.answer[0].rdtype == dns.rdatatype.SOA
        assert ask(server.port, zone, "NS").answer[0][0].to_text() == f"ns.{zone}"
        assert ask(server.port, f"ns.{zone}", "A").answer[0][0].to_text() == "127.0.0.1"
    serial = ask(server.port, RPZ, "SOA").answer[0][0].serial
    assert serial == ChangeEvent.objects.head()


def test_axfr_is_the_zone(dns_server, listed):
    server = dns_server()
    rrsets = transfer(server.port, RPZ)
    assert rrsets[0].rdtype == rrsets[-1].rdtype == dns.rdatatype.SOA
    assert records(rrsets) == {
        (f"evil.example.{RPZ}", "."),
        (f"*.evil.example.{RPZ}", "."),
        (f"login.bank.example.{RPZ}", "."),
        (f"*.login.bank.example.{RPZ}", "."),
    }


def test_transfers_only_to_allowed_networks(dns_server, listed):
    server = dns_server(transfer_networks=(ipaddress.ip_network("10.0.0.0/8"),))
    (refused,) = transfer(server.port, RPZ)
    assert refused.rcode() == dns.rcode.REFUSED


def test_ixfr_sends_the_log_between_two_serials(dns_server, listed):
    server = dns_server()
    old = ChangeEvent.objects.head()
    add_rule("fresh.example/", category="spam", source="test")
    remove_rule(SpamRule.objects.get(expression="evil.example/"))
    add_rule("pages.example/more/", category="spam", source="test")  # no DNS record
    rrsets = transfer(server.port, RPZ, "IXFR", serial=old)
    new = ChangeEvent.objects.head()
    soas = [i for i, r in enumerate(rrsets) if r.rdtype == dns.rdatatype.SOA]
    assert [rrsets[i][0].serial for i in soas] == [new, old, new, new]
    deleted, added = rrsets[soas[1] + 1 : soas[2]], rrsets[soas[2] + 1 : soas[3]]
    assert records(deleted) == {(f"evil.example.{RPZ}", "."), (f"*.evil.example.{RPZ}", ".")}
    assert records(added) == {(f"fresh.example.{RPZ}", "."), (f"*.fresh.example.{RPZ}", ".")}
    up_to_date = transfer(server.port, RPZ, "IXFR", serial=new)
    assert len(up_to_date) == 1 and up_to_date[0][0].serial == new


def test_ixfr_from_beyond_the_journal_is_the_whole_zone(dns_server, listed, settings):
    settings.URLGUARD = {**settings.URLGUARD, "DNS_JOURNAL_CHANGES": 1}
    server = dns_server()
    rrsets = transfer(server.port, RPZ, "IXFR", serial=1)
    soas = [r for r in rrsets if r.rdtype == dns.rdatatype.SOA]
    assert len(soas) == 2 and len(records(rrsets)) == 4


def test_malformed_packets_are_dropped_and_counted(dns_server, monkeypatch):
    dropped = []
    monkeypatch.setattr(metrics, "dns_dropped", dropped.append)
    server = dns_server()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(0.3)
        sock.sendto(b"\x00\x01garbage", ("127.0.0.1", server.port))
        with pytest.raises(TimeoutError):
            sock.recvfrom(512)
    assert dropped == ["malformed"]
    assert ask(server.port, f"test.{URIBL}").answer  # still answering


def test_notify_reaches_a_secondary_after_a_change(dns_server, listed):
    secondary = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    secondary.bind(("127.0.0.1", 0))
    secondary.settimeout(10)
    got = []

    def listen():
        while True:
            try:
                wire, peer = secondary.recvfrom(4096)
            except OSError:
                return
            message = dns.message.from_wire(wire)
            got.append(message)
            secondary.sendto(dns.message.make_response(message).to_wire(), peer)
            if message.answer and message.answer[0][0].serial == ChangeEvent.objects.head():
                return

    thread = threading.Thread(target=listen)
    thread.start()
    dns_server(notify=(secondary.getsockname(),))
    add_rule("notify.example/", category="spam", source="test")
    thread.join(15)
    secondary.close()
    assert got and got[-1].opcode() == dns.opcode.NOTIFY
    assert got[-1].answer[0][0].serial == ChangeEvent.objects.head()


def test_the_command_serves_until_sigterm(build_filter, fresh_guard, settings):
    import io
    import os
    import signal
    import time

    from django.core.management import call_command

    build_filter()
    settings.URLGUARD = {**settings.URLGUARD, "DNS_URIBL_ZONE": "bl.example.net."}
    out = io.StringIO()
    answers = []

    def probe():
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not re.search(r"port (\d+)", out.getvalue()):
            time.sleep(0.05)
        port = int(re.search(r"port (\d+)", out.getvalue()).group(1))
        answers.append(ask(port, "test.bl.example.net."))
        answers.append(ask(port, f"test.{URIBL}"))
        os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=probe)
    thread.start()
    call_command("serve_dns", "--address", "127.0.0.1", "--port", "0", stdout=out)
    thread.join()
    assert answers[0].answer[0][0].to_text() == "127.0.0.2"
    assert answers[1].rcode() == dns.rcode.REFUSED  # not its zone any more
    assert "serve_dns stopped." in out.getvalue()
    assert signal.getsignal(signal.SIGTERM) == before  # the caller's handler is back


@pytest.mark.parametrize("address", ["127.0.0.1", "0.0.0.0"])
def test_stop_wakes_the_udp_thread_rather_than_waiting_for_its_poll(monkeypatch, address):
    """SIGTERM ends serve_dns at once (a test's server in milliseconds), and the
    wake-up is not counted as a dropped packet."""
    import time

    from urlguard.exports import dnsserver

    monkeypatch.setattr(dnsserver, "UDP_POLL", 30.0)  # not woken, stop() waits out a poll
    dropped = []
    monkeypatch.setattr(metrics, "dns_dropped", dropped.append)
    server = dnsserver.DnsServer(dnsserver.DnsConfig(rpz_zone=RPZ, uribl_zone=URIBL))
    server.start(address, 0)
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 10
    assert not any(thread.is_alive() for thread in server._threads)
    assert dropped == []


@pytest.mark.parametrize("taken", [socket.SOCK_DGRAM, socket.SOCK_STREAM], ids=["udp", "tcp"])
def test_the_command_on_a_port_in_use_says_so_and_exits_non_zero(build_filter, capsys, taken):
    from urlguard.management.commands.serve_dns import Command

    build_filter()
    with socket.socket(socket.AF_INET, taken) as other:
        other.bind(("127.0.0.1", 0))
        if taken == socket.SOCK_STREAM:
            other.listen()
        port = other.getsockname()[1]
        with pytest.raises(SystemExit) as exit:
            Command().run_from_argv(
                ["manage.py", "serve_dns", "--address", "127.0.0.1", "--port", str(port)]
            )
    assert exit.value.code == 1
    err = capsys.readouterr().err
    assert err == (
        f"CommandError: serve_dns cannot listen on 127.0.0.1 port {port} (UDP and TCP): "
        "Address already in use. Stop what serves there, or pick another --address or --port.\n"
    )


def test_an_allowlisted_hosts_passthru_follows_the_rules_above_it(dns_server, listed):
    from urlguard.models import AllowedHost, Source

    allow = Source.objects.create(name="allowlist", kind="manual", is_allowlist=True)
    AllowedHost.objects.create(source=allow, host="partner.hosting.example")
    server = dns_server()
    passthru = (f"partner.hosting.example.{RPZ}", "rpz-passthru.")
    assert passthru in records(transfer(server.port, RPZ))
    old = ChangeEvent.objects.head()
    add_rule("hosting.example/", category="malware", source="test")  # blocks it whole now
    rrsets = transfer(server.port, RPZ, "IXFR", serial=old)
    soas = [i for i, r in enumerate(rrsets) if r.rdtype == dns.rdatatype.SOA]
    assert passthru in records(rrsets[soas[1] + 1 : soas[2]])  # deleted
    assert passthru not in records(transfer(server.port, RPZ))


def test_an_unreadable_filter_failing_closed_is_servfail_not_a_listing(
    dns_server, listed, settings, filter_path
):
    from urlguard.nodesync import registry

    settings.URLGUARD = {**settings.URLGUARD, "ON_FILTER_ERROR": "closed"}
    server = dns_server()
    filter_path.unlink()
    registry.forget(str(filter_path))  # as its once-a-second check would
    answer = ask(server.port, f"clean.example.{URIBL}")
    assert answer.rcode() == dns.rcode.SERVFAIL and not answer.answer


@pytest.mark.parametrize("edns", [None, 0])
@pytest.mark.parametrize(
    "name",
    ["evil.example", "WWW.Evil.Example", "clean.example", "test", "1.0.0.127", "9.113.0.203"],
)
def test_the_fast_path_answers_as_the_general_one(dns_server, listed, name, edns):
    """The common A question is answered without dnspython's parser and renderer: the
    same answer, EDNS included, as the general path gives."""
    server = dns_server()
    query = dns.message.make_query(f"{name}.{URIBL}", "A", use_edns=edns)
    query.id = 4242
    (fast,) = server.answer(query.to_wire(), "127.0.0.1", tcp=False)
    server._fast_uribl = lambda wire: None
    (general,) = server.answer(query.to_wire(), "127.0.0.1", tcp=False)
    a, b = dns.message.from_wire(fast), dns.message.from_wire(general)
    assert a.id == 4242 and a.flags == b.flags and a.rcode() == b.rcode()
    assert a.question == b.question and a.answer == b.answer and a.authority == b.authority
    assert (a.edns, a.payload >= 512) == (b.edns, b.payload >= 512)


@pytest.mark.parametrize(
    "wire",
    [
        b"\x00\x01\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x04test\xc0\x0c\x00\x01\x00\x01",
        b"\x00\x01\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x04test",  # truncated question
        b"\x00\x01\x01\x00\x00\x01\x00\x00\x00\x00\x00\x01\x00\x00\x01\x00\x01\x00\x00\x29",
    ],
)
def test_the_fast_path_leaves_odd_packets_to_the_general_one(dns_server, wire):
    assert dns_server()._fast_uribl(wire) is None


def ixfr_parts(port: int, serial: int):
    rrsets = transfer(port, RPZ, "IXFR", serial=serial)
    soas = [i for i, r in enumerate(rrsets) if r.rdtype == dns.rdatatype.SOA]
    assert len(soas) == 4, rrsets  # incremental: new, old, new, new
    return (
        rrsets[soas[0]][0].serial,
        records(rrsets[soas[1] + 1 : soas[2]]),
        records(rrsets[soas[2] + 1 : soas[3]]),
    )


def test_allowlisting_a_host_moves_the_serial_and_the_ixfr_carries_its_passthru(dns_server, listed):
    from urlguard.writepath.allowlist import allow_host, unallow_host

    server = dns_server()
    passthru = (f"partner.example.{RPZ}", "rpz-passthru.")
    before = ChangeEvent.objects.head()
    allow_host("partner.example")
    allowed = ChangeEvent.objects.head()
    assert allowed == before + 1
    serial, deleted, added = ixfr_parts(server.port, before)
    assert serial == allowed and deleted == set() and added == {passthru}
    unallow_host("partner.example")
    serial, deleted, added = ixfr_parts(server.port, allowed)
    assert serial == allowed + 1 and deleted == {passthru} and added == set()
    # Allowed and taken off again between the two serials: nothing to send.
    serial, deleted, added = ixfr_parts(server.port, before)
    assert (deleted, added) == (set(), set())
    # A host the list blocks whole gets no exception, whenever it was allowlisted.
    blocked = ChangeEvent.objects.head()
    allow_host("www.evil.example")
    _, deleted, added = ixfr_parts(server.port, blocked)
    assert (deleted, added) == (set(), set())
    # ... until that rule goes.
    listed_at = ChangeEvent.objects.head()
    remove_rule(SpamRule.objects.get(expression="evil.example/"))
    _, deleted, added = ixfr_parts(server.port, listed_at)
    exception = (f"www.evil.example.{RPZ}", "rpz-passthru.")
    assert exception in added and (f"evil.example.{RPZ}", ".") in deleted


def test_an_ixfr_across_the_upgrade_that_logged_the_allowlist_is_the_whole_zone(dns_server, listed):
    from urlguard.exports.rpzjournal import UPGRADE_SOURCE

    server = dns_server()
    old = ChangeEvent.objects.head()
    ChangeEvent.objects.create(
        action="allow", expression="partner.example", added_at=1, source=UPGRADE_SOURCE
    )
    rrsets = transfer(server.port, RPZ, "IXFR", serial=old)
    soas = [r for r in rrsets if r.rdtype == dns.rdatatype.SOA]
    assert len(soas) == 2  # AXFR-style: the zone between two SOAs


@pytest.fixture
def database_down(monkeypatch):
    """database_down() -> every query of every thread fails as with PostgreSQL stopped
    (the server answers from threads of its own, each with its own connection); the
    function it returns brings the database back."""
    from django.db import OperationalError, connections

    wrapper = type(connections["default"])
    real = wrapper.cursor

    def stop():
        def refused(self, *args, **kwargs):
            raise OperationalError('connection to server at "127.0.0.1", port 5432 failed')

        monkeypatch.setattr(wrapper, "cursor", refused)
        return lambda: monkeypatch.setattr(wrapper, "cursor", real)

    return stop


def test_through_a_database_outage_the_soa_is_answered_and_the_outage_logged_once(
    dns_server, listed, database_down, caplog
):
    server = dns_server(rate_limit=100_000)
    serial = ChangeEvent.objects.head()
    caplog.set_level(logging.INFO, logger="urlguard.exports.dnsserver")
    start = database_down()
    for n in range(400):  # a listed name: the table confirms the filter's hit
        name = f"evil.example.{URIBL}" if n % 2 else f"www.evil.example.{URIBL}"
        assert ask(server.port, name, "TXT" if n % 3 else "A").rcode() == dns.rcode.SERVFAIL
    assert ask(server.port, f"clean.example.{URIBL}").rcode() == dns.rcode.NXDOMAIN
    server.poll()  # the NOTIFY loop's round fails too: the same outage
    # The dns role's health check: the SOA from the position the server holds.
    soa = ask(server.port, RPZ, "SOA")
    assert soa.rcode() == dns.rcode.NOERROR and soa.answer[0][0].serial == serial
    assert ask(server.port, RPZ, "NS").answer[0][0].to_text() == f"ns.{RPZ}"
    nodata = ask(server.port, f"evil.example.{RPZ}")  # policy records are for transfers
    assert nodata.rcode() == dns.rcode.NOERROR and nodata.authority[0][0].serial == serial
    logged = [r for r in caplog.records if r.name == "urlguard.exports.dnsserver"]
    assert [(r.levelname, r.getMessage()) for r in logged] == [
        (
            "ERROR",
            "serve_dns: reading the database failed: OperationalError: connection to server at"
            ' "127.0.0.1", port 5432 failed (logged once; a count a minute until it recovers)',
        )
    ]
    start()
    assert ask(server.port, f"evil.example.{URIBL}").answer[0][0].to_text() == "127.0.0.4"
    logged = [r for r in caplog.records if r.name == "urlguard.exports.dnsserver"]
    assert len(logged) == 2 and logged[1].getMessage().startswith(
        "serve_dns: reading the database works again after"
    )
    # 400 lookups and a round of the loop at least (its own thread runs once a second).
    assert int(re.search(r"and (\d+) failure", logged[1].getMessage()).group(1)) >= 401


def test_with_the_database_down_since_the_start_the_rpz_zone_is_servfail_not_a_made_up_serial(
    build_filter, fresh_guard, database_down
):
    from urlguard.exports.dnsserver import DnsConfig, DnsServer

    build_filter()
    start = database_down()
    server = DnsServer(DnsConfig(rpz_zone=RPZ, uribl_zone=URIBL))
    try:
        port = server.start("127.0.0.1", 0)[1]
        assert ask(port, RPZ, "SOA").rcode() == dns.rcode.SERVFAIL
        start()
        server.poll()
        assert ask(port, RPZ, "SOA").answer[0][0].serial == ChangeEvent.objects.head()
    finally:
        server.stop()


def test_a_database_that_hangs_is_waited_for_once_not_by_every_lookup(
    dns_server, listed, monkeypatch
):
    """A database host that drops packets makes each query wait (connect_timeout: 5 s),
    and every listed name's lookup waited so on the UDP thread, the RPZ SOA (the dns
    role's health check, 3 s) queued behind them. Once a failure took that long,
    lookups answer SERVFAIL at once until the NOTIFY loop's own thread finds it back."""
    from django.db import OperationalError, connections

    server = dns_server(rate_limit=100_000)
    wrapper = type(connections["default"])
    real = wrapper.cursor
    waited = []

    def hanging(self, *args, **kwargs):
        waited.append(threading.current_thread().name)
        threading.Event().wait(1.2)
        raise OperationalError("timeout expired")

    monkeypatch.setattr(wrapper, "cursor", hanging)
    for n in range(5):
        name = f"evil.example.{URIBL}" if n % 2 else f"www.evil.example.{URIBL}"
        assert ask(server.port, name, timeout=10).rcode() == dns.rcode.SERVFAIL
    soa = ask(server.port, RPZ, "SOA", timeout=10)
    assert soa.rcode() == dns.rcode.NOERROR
    assert waited.count("dns-_serve_udp") == 1  # the first lookup, and no other
    monkeypatch.setattr(wrapper, "cursor", real)
    server.poll()  # the NOTIFY loop's round: the database answers again
    assert ask(server.port, f"evil.example.{URIBL}").answer[0][0].to_text() == "127.0.0.4"


@pytest.mark.parametrize("edns", [None, 0])
def test_the_fast_path_fails_as_the_general_one(dns_server, listed, database_down, edns):
    server = dns_server()
    database_down()
    query = dns.message.make_query(f"evil.example.{URIBL}", "A", use_edns=edns)
    (fast,) = server.answer(query.to_wire(), "127.0.0.1", tcp=False)
    server._fast_uribl = lambda wire: None
    (general,) = server.answer(query.to_wire(), "127.0.0.1", tcp=False)
    a, b = dns.message.from_wire(fast), dns.message.from_wire(general)
    assert a.rcode() == b.rcode() == dns.rcode.SERVFAIL
    assert a.flags == b.flags and a.question == b.question and not a.answer and not b.answer
    assert a.edns == b.edns


def test_an_ixfr_from_a_serial_newer_than_the_zone_is_one_soa(dns_server, listed):
    """RFC 1995 section 2: the same or a newer serial is answered with the SOA alone,
    never the whole zone (a secondary restored from a newer primary, say)."""
    server = dns_server()
    head = ChangeEvent.objects.head()
    for newer in (head + 1, head + 1000, head + 2**31 - 1):
        rrsets = transfer(server.port, RPZ, "IXFR", serial=newer % 2**32)
        assert len(rrsets) == 1 and rrsets[0][0].serial == head, newer


def move_the_log_to(seq: int) -> None:
    """The next change gets position `seq`: as a log that has come that far."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE sqlite_sequence SET seq = %s WHERE name = %s",
            [seq - 1, ChangeEvent._meta.db_table],
        )


def test_ixfr_past_serial_2_to_the_32_is_incremental(dns_server, listed):
    """The serial is the position modulo 2**32 and compared in serial arithmetic (RFC
    1982): a secondary at a serial that wrapped is behind by the difference, not by
    the whole log."""
    server = dns_server()
    move_the_log_to(2**32 - 2)
    add_rule("a.example/", category="spam", source="test")
    before_wrap = ChangeEvent.objects.head()
    assert before_wrap == 2**32 - 2
    add_rule("b.example/", category="spam", source="test")
    add_rule("c.example/", category="spam", source="test")  # serial 0
    wrapped = ChangeEvent.objects.head()
    assert wrapped == 2**32
    add_rule("d.example/", category="spam", source="test")  # serial 1
    serial, deleted, added = ixfr_parts(server.port, 0)
    assert serial == 1 and deleted == set()
    assert added == {(f"d.example.{RPZ}", "."), (f"*.d.example.{RPZ}", ".")}
    serial, deleted, added = ixfr_parts(server.port, 2**32 - 2)  # across the wrap
    assert serial == 1 and deleted == set()
    assert {owner for owner, _ in added} == {
        f"{prefix}{host}.example.{RPZ}" for prefix in ("", "*.") for host in "bcd"
    }
    up_to_date = transfer(server.port, RPZ, "IXFR", serial=1)
    assert len(up_to_date) == 1 and up_to_date[0][0].serial == 1
    soa = ask(server.port, RPZ, "SOA")
    assert soa.answer[0][0].serial == 1  # the position the server holds, wrapped


def test_ixfr_from_exactly_half_the_serial_space_away_is_the_whole_zone(dns_server, listed):
    """RFC 1982 leaves the order of two serials 2**31 apart undefined: whole zone."""
    server = dns_server()
    head = ChangeEvent.objects.head()
    rrsets = transfer(server.port, RPZ, "IXFR", serial=(head + 2**31) % 2**32)
    soas = [r for r in rrsets if r.rdtype == dns.rdatatype.SOA]
    assert len(soas) == 2 and len(records(rrsets)) == 4


def tcp_client(port: int, source: str) -> socket.socket:
    """A TCP connection to the server from `source` (any 127/8 address is this host's)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    sock.settimeout(5)
    return sock


def tcp_ask(sock: socket.socket, name: str) -> dns.message.Message | None:
    """One question over `sock`; None if the server closed the connection instead."""
    import struct

    wire = dns.message.make_query(name, "A").to_wire()
    try:
        sock.sendall(struct.pack("!H", len(wire)) + wire)
        head = sock.recv(2)
        if len(head) < 2:
            return None
        size = struct.unpack("!H", head)[0]
        body = b""
        while len(body) < size:
            chunk = sock.recv(size - len(body))
            if not chunk:
                return None
            body += chunk
    except (ConnectionResetError, BrokenPipeError):
        return None
    return dns.message.from_wire(body)


def test_tcp_slots_are_capped_per_client_and_kept_for_the_transfer_networks(dns_server, listed):
    server = dns_server(
        transfer_networks=(ipaddress.ip_network("127.0.0.1/32"),),
        tcp_clients=4,
        tcp_per_client=2,
        tcp_transfer_slots=1,
        tcp_reclaim_after=60.0,  # the holders have just asked: none of them yields a slot
    )
    held = []
    try:
        # One client may hold two connections; its third is closed unanswered.
        for _ in range(2):
            held.append(tcp_client(server.port, "127.0.0.2"))
            assert tcp_ask(held[-1], f"test.{URIBL}").answer
        third = tcp_client(server.port, "127.0.0.2")
        assert tcp_ask(third, f"test.{URIBL}") is None
        third.close()
        # Two more clients take the four shared slots: a fifth client finds none.
        for source in ("127.0.0.3", "127.0.0.4"):
            held.append(tcp_client(server.port, source))
            assert tcp_ask(held[-1], f"test.{URIBL}").answer
        assert len(held) == 4
        other = tcp_client(server.port, "127.0.0.5")
        assert tcp_ask(other, f"test.{URIBL}") is None
        other.close()
        # The transfer network still gets its AXFR, on the slot kept for it.
        rrsets = transfer(server.port, RPZ)
        assert rrsets[0].rdtype == dns.rdatatype.SOA and len(records(rrsets)) == 4
    finally:
        for sock in held:
            sock.close()
    # The slots come back with the connections (as soon as the server reads the close).
    for _attempt in range(50):
        with tcp_client(server.port, "127.0.0.5") as sock:
            if tcp_ask(sock, f"test.{URIBL}") is not None:
                break
        threading.Event().wait(0.1)
    else:
        raise AssertionError("no TCP slot came back")


def _until_waiting(server, count: int) -> None:
    """Until `count` of the server's TCP connections wait for their next message."""
    for _ in range(500):
        if sum(s.waiting_since is not None for s in server.tcp_slots._slots) >= count:
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"fewer than {count} TCP connections waiting after 5 s")


def test_connections_asking_now_and_then_yield_their_slots_to_newcomers(dns_server, listed):
    """A valid question every few seconds (or one dripped within the deadline) kept a
    connection for ever, so a client with a few addresses held every slot for ever.
    With every slot taken, a newcomer takes the one of the connection that has waited
    longest for its next message, once that wait passed `tcp_reclaim_after`."""
    server = dns_server(
        transfer_networks=(),
        tcp_clients=2,
        tcp_per_client=1,
        tcp_transfer_slots=0,
        tcp_reclaim_after=0.5,
    )
    first, second = (tcp_client(server.port, f"127.0.0.{n}") for n in (2, 3))
    newcomers = []
    try:
        assert tcp_ask(first, f"test.{URIBL}").answer
        # The client reads its answer before the server's thread marks the wait begun:
        # the order of the two waits is made, not left to the scheduler.
        _until_waiting(server, 1)
        assert tcp_ask(second, f"test.{URIBL}").answer
        _until_waiting(server, 2)
        second.sendall(b"\x00")  # the next message begun, and left dripping
        threading.Event().wait(0.7)
        newcomers.append(tcp_client(server.port, "127.0.0.4"))
        assert tcp_ask(newcomers[-1], f"test.{URIBL}").answer
        assert tcp_ask(first, f"test.{URIBL}") is None  # it had waited longest: closed
        threading.Event().wait(0.7)
        newcomers.append(tcp_client(server.port, "127.0.0.5"))
        assert tcp_ask(newcomers[-1], f"test.{URIBL}").answer
        assert second.recv(1) == b""  # mid-message, past the wait: its slot went too
    finally:
        for sock in (first, second, *newcomers):
            sock.close()


def test_a_tcp_message_must_arrive_whole_within_the_deadline(dns_server):
    """A byte every 0.1 s never lets one read wait long; the message as a whole is
    given `tcp_deadline`, and the connection is closed when it runs out."""
    import time

    server = dns_server(tcp_deadline=1.0)
    sock = tcp_client(server.port, "127.0.0.2")
    started = time.monotonic()
    closed_after = None
    try:
        sock.sendall(b"\xff\xff")  # a message of 65,535 bytes, sent a byte at a time
        sock.settimeout(0.1)
        while time.monotonic() - started < 15:
            try:
                if sock.recv(1) == b"":
                    closed_after = time.monotonic() - started
                    break
            except TimeoutError:
                sock.sendall(b"\x00")
            except ConnectionResetError:
                closed_after = time.monotonic() - started
                break
    finally:
        sock.close()
    assert closed_after is not None and 0.9 < closed_after < 5
    # An idle connection (nothing sent) is closed after the same deadline.
    with tcp_client(server.port, "127.0.0.2") as idle:
        started = time.monotonic()
        assert idle.recv(1) == b""
        assert time.monotonic() - started < 5
