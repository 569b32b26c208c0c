"""ASGI entry point. A wrong setting stops the boot here, as it stops `runserver`."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "urlguard_service.settings")
application = get_asgi_application()

from urlguard.checks import refuse_to_start  # noqa: E402  (needs the apps loaded)

refuse_to_start()
