"""A test node's worker settings (tests.service.services_settings) that also load
tests.service.killhook: the worker kills itself at a known point of a long write."""

from tests.service.services_settings import *  # noqa: F403

CELERY_IMPORTS = ["tests.service.killhook"]
