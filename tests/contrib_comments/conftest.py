"""These tests run only under their own settings (a comments site), in a pytest of
their own that tests/content/test_content_comments.py starts; the suite's run, on the
service's settings, leaves them out."""

import os

import pytest

SETTINGS = "tests.contrib_comments.settings"

collect_ignore_glob = [] if os.environ.get("DJANGO_SETTINGS_MODULE") == SETTINGS else ["test_*.py"]


@pytest.fixture
def fresh_guard():
    """A guard built for this test, none left behind (as tests/support/fixtures.py's)."""
    from urlguard.hotpath.guard import reset_guard

    reset_guard()
    yield
    reset_guard()
