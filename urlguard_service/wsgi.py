"""WSGI entry point (gunicorn urlguard_service.wsgi). A wrong setting stops the boot here
(urlguard.checks.refuse_to_start), as it stops `runserver`."""

import os
import sys

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "urlguard_service.settings")
application = get_wsgi_application()

from urlguard.checks import refuse_to_start  # noqa: E402  (needs the apps loaded)

refuse_to_start()

# The serving threads share the GIL with background ones (the click flush, the link
# cache's invalidations): a request waits for a busy background thread at most this
# long, instead of CPython's default 5 ms, which showed as the redirect's p99.
sys.setswitchinterval(0.001)
