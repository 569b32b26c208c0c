"""The standalone service's Django settings. Embedded defaults (SQLite, Celery
in-process, filter under var/); DATABASE_URL and CELERY_BROKER_URL in the environment
switch to real services."""

import contextlib
import email.utils
import os
from datetime import timedelta
from pathlib import Path

import dj_database_url

from urlguard_service.vardir import demo_secret_key, make_private_dir, make_private_file

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("URLGUARD_VAR_DIR", BASE_DIR / "var"))
# The embedded demo: no DATABASE_URL, so SQLite under VAR_DIR (`make run`).
EMBEDDED_DEMO = not os.environ.get("DATABASE_URL")
# A fresh clone has no var/ (it is git-ignored) and SQLite will not create the
# directory of its database file. If this fails, system check urlguard.E001 says why.
# WhiteNoise likewise wants STATIC_ROOT to exist (empty until `collectstatic`).
# var/ holds the database (sessions, password hashes) and the demo's secret key:
# owner only (0700, files 0600).
with contextlib.suppress(OSError):
    make_private_dir(VAR_DIR)
    (VAR_DIR / "static").mkdir(parents=True, exist_ok=True)
    if EMBEDDED_DEMO:
        make_private_file(VAR_DIR / "urlguard.sqlite3")

# Whoever knows the key can sign a "continue anyway" link to any URL and reverse the
# visitor hashes: with DEBUG off, system check urlguard.E100 refuses to start on this
# default or a short key. The embedded demo makes a random one in var/ on first run.
INSECURE_SECRET_KEY = "dev-only-insecure-key-change-me-in-production"
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "")
if not SECRET_KEY and EMBEDDED_DEMO:
    with contextlib.suppress(OSError):
        SECRET_KEY = demo_secret_key(VAR_DIR / "secret_key")
SECRET_KEY = SECRET_KEY or INSECURE_SECRET_KEY
# Off unless asked for: a debug page is a traceback page (DJANGO_DEBUG=1 for development).
DEBUG = os.environ.get("DJANGO_DEBUG", "0") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,testserver").split(",")

# HTTPS (README "Deploying safely"). DJANGO_HTTPS=1 where visitors reach the site
# over HTTPS: plain-HTTP requests are redirected (the health and metrics paths
# excepted: load balancers probe them over HTTP), cookies are sent over HTTPS only,
# and browsers are told to keep to HTTPS (HSTS) for DJANGO_HSTS_SECONDS.
HTTPS = os.environ.get("DJANGO_HTTPS", "0") == "1"
SECURE_SSL_REDIRECT = HTTPS
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_HSTS_SECONDS = int(os.environ.get("DJANGO_HSTS_SECONDS", 31_536_000 if HTTPS else 0))
# Both bind every subdomain of the site's domain (preload: for good, in the browsers'
# shipped lists): a decision for the whole domain, so only on request.
SECURE_HSTS_INCLUDE_SUBDOMAINS = os.environ.get("DJANGO_HSTS_INCLUDE_SUBDOMAINS", "0") == "1"
SECURE_HSTS_PRELOAD = os.environ.get("DJANGO_HSTS_PRELOAD", "0") == "1"
# Behind a proxy that ends TLS: the header it sets to "https" (e.g. X-Forwarded-Proto;
# the proxy must overwrite whatever a client sent in it).
if _proxy_header := os.environ.get("DJANGO_SECURE_PROXY_SSL_HEADER", ""):
    SECURE_PROXY_SSL_HEADER = ("HTTP_" + _proxy_header.upper().replace("-", "_"), "https")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "axes",
    "urlguard.apps.UrlguardConfig",
    "urlguard.shortlinks",
    "urlguard_service.apps.UrlguardServiceConfig",
]

MIDDLEWARE = [
    # Before everything that reads REMOTE_ADDR; it never changes a response, so the
    # guard below still sees every redirect last.
    "urlguard.middleware.TrustedProxyMiddleware",
    "urlguard.middleware.RedirectGuardMiddleware",
    "urlguard.operations.health.ProbeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # A view that cannot reach the database answers 503 with Retry-After, not a 500.
    "urlguard.hotpath.unavailable.DatabaseUnavailableMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into its 429 page.
    "axes.middleware.AxesMiddleware",
]

# Admin logins are rate-limited by django-axes: after AXES_FAILURE_LIMIT failed
# attempts from one address (REMOTE_ADDR: behind a proxy, the visitor's once
# URLGUARD_TRUSTED_PROXIES names it) that address is refused (429) for AXES_COOLOFF_TIME.
# Per address, not per user name: a stranger cannot lock the real admin out. An IPv6
# address counts as its /64, the rate limits' client network (axes would count per /128,
# of which one subscriber has 2**64).
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = 10
AXES_COOLOFF_TIME = timedelta(minutes=15)
AXES_LOCKOUT_PARAMETERS = ["ip_address"]
AXES_CLIENT_IP_CALLABLE = "urlguard.runtime.clientaddress.client_lockout_address"
AXES_RESET_ON_SUCCESS = True

ROOT_URLCONF = "urlguard_service.urls"
WSGI_APPLICATION = "urlguard_service.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{VAR_DIR / 'urlguard.sqlite3'}", conn_max_age=60
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # IMMEDIATE: a transaction takes SQLite's write lock at BEGIN, so concurrent rule
    # writers queue (up to `timeout` s) instead of failing with "database is locked"
    # when a read transaction upgrades; WAL keeps readers going while one writes.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"transaction_mode": "IMMEDIATE", "timeout": 20, "init_command": "PRAGMA journal_mode=WAL;"}
    )
elif DATABASES["default"]["ENGINE"].startswith("django.db.backends.postgresql"):
    # A database host that drops packets must cost a request (a readiness probe, an
    # uncached short link's 503) seconds, not the OS's minutes-long connect timeout.
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("connect_timeout", 5)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
# Static files (the admin's CSS and scripts) are served by WhiteNoise under gunicorn
# too; finders make `collectstatic` optional for a single node.
WHITENOISE_USE_FINDERS = True

# Who is mailed when a visitor reports a mistake (URLGUARD["REPORT_MAIL_INTERVAL"]):
# "Name <address>, address, ...".
MANAGERS = [
    (name.strip(), address)
    for name, address in (
        email.utils.parseaddr(entry) for entry in os.environ.get("DJANGO_MANAGERS", "").split(",")
    )
    if address
]
SERVER_EMAIL = os.environ.get("DJANGO_SERVER_EMAIL", "urlguard@localhost")
EMAIL_HOST = os.environ.get("DJANGO_EMAIL_HOST", "localhost")
EMAIL_TIMEOUT = 10

# Celery: no broker configured means tasks run in-process (embedded default).
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "")
CELERY_TASK_ALWAYS_EAGER = not CELERY_BROKER_URL
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND") or None
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {"max_retries": 2, "interval_start": 0, "interval_step": 0.5}

URLGUARD = {
    "DATA_DIR": str(VAR_DIR),
    "FILTER_PATH": os.environ.get("URLGUARD_FILTER_PATH", str(VAR_DIR / "filter.bin")),
    "LOG_JSON": os.environ.get("URLGUARD_LOG_JSON", "0") == "1",
}
# What differs per node or per deployment (deploy/: containers, units) comes from the
# environment; unset keeps the URLGUARD default.
if _node_name := os.environ.get("URLGUARD_NODE_NAME", ""):
    URLGUARD["NODE_NAME"] = _node_name
if _metrics_token := os.environ.get("URLGUARD_METRICS_TOKEN", ""):
    URLGUARD["METRICS_TOKEN"] = _metrics_token
if _metrics_networks := os.environ.get("URLGUARD_METRICS_ALLOWED_NETWORKS", ""):
    URLGUARD["METRICS_ALLOWED_NETWORKS"] = [n.strip() for n in _metrics_networks.split(",")]
# The reverse proxies in front (the nginx examples): their X-Forwarded-For names the visitor.
if _trusted_proxies := os.environ.get("URLGUARD_TRUSTED_PROXIES", ""):
    URLGUARD["TRUSTED_PROXIES"] = [n.strip() for n in _trusted_proxies.split(",")]
# Feeds: the folder `file://` feeds are read beneath, and non-public networks a feed
# fetch may connect to (a mirror on the internal network).
if _feed_file_root := os.environ.get("URLGUARD_FEED_FILE_ROOT", ""):
    URLGUARD["FEED_FILE_ROOT"] = _feed_file_root
if _feed_networks := os.environ.get("URLGUARD_FEED_ALLOWED_NETWORKS", ""):
    URLGUARD["FEED_ALLOWED_NETWORKS"] = [n.strip() for n in _feed_networks.split(",") if n.strip()]
# The `dns` role (serve_dns): its zones, who may transfer the RPZ zone, whom to NOTIFY.
for _name in ("DNS_RPZ_ZONE", "DNS_URIBL_ZONE"):
    if _value := os.environ.get(f"URLGUARD_{_name}", ""):
        URLGUARD[_name] = _value
for _name in ("DNS_TRANSFER_NETWORKS", "DNS_NOTIFY"):
    if _value := os.environ.get(f"URLGUARD_{_name}", ""):
        URLGUARD[_name] = [v.strip() for v in _value.split(",") if v.strip()]

# The cache keeps the API's rate-limit counters: per process by default, shared by
# every process and node with CACHE_URL=redis://host:6379/N.
CACHE_URL = os.environ.get("CACHE_URL", "")
CACHES = {
    "default": (
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": CACHE_URL}
        if CACHE_URL
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    )
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        # Plain lines, or JSON objects with the node name when URLGUARD LOG_JSON is on.
        "urlguard": {
            "()": "urlguard.operations.logformat.Formatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s: %(message)s",
        }
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "urlguard"}},
    "loggers": {
        "urlguard": {"handlers": ["console"], "level": "INFO"},
        # Every 5xx with its traceback. With DEBUG off Django sends these only to
        # mail_admins, i.e. nowhere; 4xx are WARNING and stay out of the log.
        "django.request": {"handlers": ["console"], "level": "ERROR", "propagate": False},
    },
}
