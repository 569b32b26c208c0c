"""The app's shared fixtures (tests/support/fixtures.py) for the tests in this folder,
and the API key a browser asks with."""

import pytest

from tests.support.fixtures import *  # noqa: F403
from urlguard.operations import apikeys


@pytest.fixture
def key(db):
    return apikeys.create_api_key("browsers")[1]
