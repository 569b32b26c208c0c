"""The standalone urlguard service: a Django project built on the reusable `urlguard`
app the way any host site uses it (its settings, root urls, WSGI/ASGI entry points,
Celery app, gunicorn hooks and the demo). manage.py points here."""

from .celery import app as celery_app

__all__ = ["celery_app"]
