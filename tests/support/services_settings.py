"""Settings for the Celery worker that tests/service/test_services.py starts: the
project's settings, with the node name and catch-up interval taken from the
environment so that a test can run a node with a fast periodic catch-up."""

import os

from urlguard_service.settings import *  # noqa: F403
from urlguard_service.settings import URLGUARD

URLGUARD = {
    **URLGUARD,
    "NODE_NAME": os.environ.get("URLGUARD_NODE_NAME", "test-node"),
    "CATCHUP_INTERVAL": float(os.environ.get("URLGUARD_CATCHUP_INTERVAL", "60")),
    # The tests' feed server listens on loopback (tests/support/feedserver.py).
    "FEED_ALLOWED_NETWORKS": ["127.0.0.0/8"],
    # A test whose worker reads a file:// feed names the folder it is in.
    "FEED_FILE_ROOT": os.environ.get("URLGUARD_TEST_FEED_ROOT") or None,
}
