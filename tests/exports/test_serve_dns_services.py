"""serve_dns on PostgreSQL: the database drops the server's connections (as a restart
of PostgreSQL does, here by pg_terminate_backend): the next queries are answered, on a
new connection, with nothing logged as an outage."""

from __future__ import annotations

import logging

import dns.rcode
from django.db import connection

from tests.support.dnsclient import ask
from tests.support.services import LIVE
from urlguard.models import ChangeEvent
from urlguard.writepath.changes import add_rule

pytestmark = LIVE

RPZ = "rpz.urlguard."
URIBL = "uribl.urlguard."


def terminate_other_connections() -> int:
    """The connections to this test database other than this thread's, ended by the
    server as a restart ends them; how many."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def test_the_first_queries_after_the_database_dropped_the_connections_are_answered(
    dns_server, sync_filter, caplog
):
    add_rule("evil.example/", category="malware", source="test")
    sync_filter()
    server = dns_server()
    caplog.set_level(logging.INFO, logger="urlguard.exports.dnsserver")
    # Each thread of the server has its connection open: the UDP thread's by a lookup
    # the table confirms, the NOTIFY loop's by its rounds.
    assert ask(server.port, f"evil.example.{URIBL}").answer[0][0].to_text() == "127.0.0.4"
    server.poll()
    assert terminate_other_connections() >= 1
    answer = ask(server.port, f"evil.example.{URIBL}", timeout=5)
    assert answer.rcode() == dns.rcode.NOERROR
    assert answer.answer[0][0].to_text() == "127.0.0.4"
    soa = ask(server.port, RPZ, "SOA", timeout=5)
    assert soa.answer[0][0].serial == ChangeEvent.objects.head()
    assert ask(server.port, f"evil.example.{URIBL}", "TXT").answer
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
