"""Pages that need the database answer 503 with Retry-After while it cannot be
reached (never the 500 page), logged once a minute rather than per request; other
database errors stay 500s."""

from __future__ import annotations

import logging

import pytest
from django.db import InterfaceError, OperationalError, ProgrammingError

from urlguard.hotpath import unavailable

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def demo_home(monkeypatch):
    """The home page as the embedded demo has it, listing the demo's links from the
    database (a deployment's lists none and needs no database), whatever the database."""
    from urlguard_service.management.commands import seed_demo

    monkeypatch.setattr(seed_demo, "embedded_demo_database", lambda: True)


@pytest.fixture(autouse=True)
def fresh_log(monkeypatch):
    monkeypatch.setattr(
        unavailable,
        "_log",
        unavailable.RateLimitedLog(logging.getLogger("urlguard.hotpath.unavailable")),
    )


def home(client):
    return client.get("/")


def admin_index(client):
    return client.get("/admin/")  # the session and its user are read from the database


def admin_login(client):
    return client.post("/admin/login/", {"username": "someone", "password": "secret"})


@pytest.mark.parametrize(
    ("request_page", "logged_in"),
    [(home, False), (admin_index, True), (admin_login, False)],
    ids=["home", "admin", "login"],
)
@pytest.mark.parametrize(
    "error",
    [OperationalError("connection refused"), InterfaceError("connection already closed")],
    ids=["refused", "closed"],
)
def test_a_page_that_needs_the_database_answers_503_while_it_is_away(
    client, make_staff, database_fails, request_page, logged_in, error
):
    if logged_in:
        client = make_staff(superuser=True)
    database_fails(error)
    response = request_page(client)
    assert response.status_code == 503
    assert response["Retry-After"] == "30"
    assert response["Cache-Control"] == "no-store"
    assert "cannot reach its database" in response.content.decode()


def test_an_outage_is_logged_once_a_minute_not_per_request(client, database_fails, caplog):
    database_fails(OperationalError("connection refused"))
    with caplog.at_level("INFO"):
        for path in ("/", "/", "/not-cached-link"):
            assert client.get(path).status_code == 503
    errors = [(r.name, r.getMessage()) for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [
        ("urlguard.hotpath.unavailable", "the database cannot be reached: GET / answered 503 "
         "(connection refused)")
    ]  # fmt: skip


def test_any_other_database_error_is_still_a_500(client, database_fails):
    database_fails(ProgrammingError("relation does not exist"))
    client.raise_request_exception = False
    assert client.get("/").status_code == 500
