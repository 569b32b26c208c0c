"""The service's Celery app, made as any site makes its own: configuration from
Django settings (CELERY_*), urlguard's tasks by autodiscovery, and urlguard's queues,
routes and beat schedule (urlguard.celery). Every node runs:

    celery -A urlguard_service worker -B -Q urlguard.broadcast,celery --concurrency 1
"""

import os

from celery import Celery

import urlguard.celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "urlguard_service.settings")

app = Celery("urlguard_service")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
urlguard.celery.configure(app)
