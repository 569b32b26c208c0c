"""manage.py seed_demo: the demo data, and the admin/admin superuser made only on the
embedded SQLite demo database (elsewhere it says how to create one)."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from urlguard.models import ShortLink, SpamRule

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_guard")]


def seed(*args: str) -> str:
    out = io.StringIO()
    call_command("seed_demo", *args, stdout=out)
    return out.getvalue()


def test_the_embedded_demo_gets_the_demo_superuser_and_says_why(settings):
    settings.EMBEDDED_DEMO = True
    text = seed()
    assert SpamRule.objects.count() == 4 and ShortLink.objects.count() == 12
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_superuser and admin.check_password("admin")
    assert "embedded SQLite demo" in text
    assert "BLOCKED by free-prizes.example/" in text


def test_no_known_password_anywhere_but_the_embedded_demo(settings):
    settings.EMBEDDED_DEMO = False  # DATABASE_URL set: a deployment's database
    text = seed()
    assert not get_user_model().objects.filter(is_superuser=True).exists()
    assert "python manage.py createsuperuser" in text


def test_an_existing_superuser_is_left_alone(settings, django_user_model):
    settings.EMBEDDED_DEMO = True
    django_user_model.objects.create_superuser("owner", "o@localhost", None)
    seed()
    assert list(django_user_model.objects.values_list("username", flat=True)) == ["owner"]


def test_seeding_twice_adds_nothing(settings):
    settings.EMBEDDED_DEMO = False
    seed()
    assert "(4 and 12 already there)" in seed("--no-superuser")


def test_the_first_filter_build_is_news_not_a_warning(settings, tmp_path, caplog):
    settings.URLGUARD = {**settings.URLGUARD, "FILTER_PATH": str(tmp_path / "filter.bin")}
    caplog.set_level("INFO")
    text = seed("--no-superuser", "--base-url", "http://127.0.0.1:8123/")
    assert (tmp_path / "filter.bin").exists()
    assert "building the demo's first filter file" in caplog.text
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == []
    assert "http://127.0.0.1:8123/prize " in text  # the printed links follow the port
