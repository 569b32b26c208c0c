"""The app's shared fixtures (tests/support/fixtures.py) for the tests in this folder."""

from tests.support.fixtures import *  # noqa: F403
