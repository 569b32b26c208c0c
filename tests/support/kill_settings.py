"""A test node's worker settings (tests.support.services_settings) that also load
tests.support.killhook: the worker kills itself at a known point of a long write."""

from tests.support.services_settings import *  # noqa: F403

CELERY_IMPORTS = ["tests.support.killhook"]
