"""WSGI entry point (gunicorn urlguard.wsgi). A wrong setting stops the boot here
(urlguard.checks.refuse_to_start), as it stops `runserver`."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "urlguard.settings")
application = get_wsgi_application()

from urlguard.checks import refuse_to_start  # noqa: E402  (needs the apps loaded)

refuse_to_start()
