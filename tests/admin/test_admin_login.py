"""Admin logins are rate-limited (django-axes, settings.AXES_*): after the failure
limit one address is refused, even with the right password, while others still log in."""

from __future__ import annotations

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.test import Client
from django.urls import reverse

LOGIN = reverse("admin:login")

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_user(settings, django_user_model):
    # A fast hasher: every failed attempt hashes the password it was given.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    return django_user_model.objects.create_superuser("boss", "boss@localhost", "right-one")


def _login(client: Client, password: str) -> int:
    return client.post(
        LOGIN, {"username": "boss", "password": password, "next": "/admin/"}
    ).status_code


def test_guessing_locks_out_that_address_only(admin_user):
    guesser = Client(REMOTE_ADDR="203.0.113.66")
    limit = django_settings.AXES_FAILURE_LIMIT
    assert [_login(guesser, f"guess-{n}") for n in range(limit - 1)] == [200] * (limit - 1)
    assert _login(guesser, "last-guess") == 429
    assert _login(guesser, "right-one") == 429  # the right password no longer helps
    assert "_auth_user_id" not in guesser.session
    elsewhere = Client(REMOTE_ADDR="198.51.100.7")
    assert _login(elsewhere, "right-one") == 302  # the admin is not locked out


def test_a_success_resets_the_count(admin_user):
    client = Client(REMOTE_ADDR="203.0.113.67")
    limit = django_settings.AXES_FAILURE_LIMIT
    for n in range(limit - 1):
        _login(client, f"typo-{n}")
    assert _login(client, "right-one") == 302
    client.logout()
    assert _login(client, "one-more-typo") == 200


def test_addresses_of_one_ipv6_64_share_one_lock_out(admin_user):
    """A subscriber picks addresses of its /64 at will: guesses from several of them add
    up to one lock-out of the whole /64, and a new address in it is refused too."""
    limit = django_settings.AXES_FAILURE_LIMIT
    addresses = [f"2001:db8:5:6::{n:x}" for n in range(1, limit + 1)]
    assert [_login(Client(REMOTE_ADDR=a), "guess") for a in addresses[:-1]] == [200] * (limit - 1)
    assert _login(Client(REMOTE_ADDR=addresses[-1]), "guess") == 429
    assert _login(Client(REMOTE_ADDR="2001:db8:5:6:ffff::1"), "right-one") == 429
    assert _login(Client(REMOTE_ADDR="2001:db8:5:7::1"), "right-one") == 302  # next /64


@pytest.mark.live
def test_on_the_services_database_a_64_shares_one_lock_out(admin_user):
    # PostgreSQL keeps axes' addresses in an inet column: the /64's first address fits.
    assert connection.vendor == "postgresql", "run `make test-live`"
    test_addresses_of_one_ipv6_64_share_one_lock_out(admin_user)


def test_ipv4_addresses_are_locked_out_one_by_one(admin_user):
    limit = django_settings.AXES_FAILURE_LIMIT
    for n in range(limit):
        _login(Client(REMOTE_ADDR="192.0.2.10"), f"guess-{n}")
    assert _login(Client(REMOTE_ADDR="192.0.2.10"), "right-one") == 429
    assert _login(Client(REMOTE_ADDR="192.0.2.11"), "right-one") == 302
