"""A site on django-contrib-comments with urlguard.contrib.comments: the service's
settings plus the comments apps, as README's "Checking what people post" adds them."""

from urlguard_service.settings import *  # noqa: F403
from urlguard_service.settings import INSTALLED_APPS

INSTALLED_APPS = [
    *INSTALLED_APPS,
    "django.contrib.sites",
    "django_comments",
    "urlguard.contrib.comments",
]
SITE_ID = 1
ROOT_URLCONF = "tests.contrib_comments.urls"
