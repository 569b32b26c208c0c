#!/bin/sh
# One entrypoint for every role of a urlguard deployment. The image, compose.yaml, the
# Kubernetes manifests, the systemd units and the tests all start the service through
# it, so the tested path is the deployed path.
#
#   entrypoint.sh web               gunicorn with the metrics hooks (one per node)
#   entrypoint.sh worker            the node's Celery worker: broadcast + task queues
#                                   (one per node: it is the only writer of its filter)
#   entrypoint.sh beat              Celery beat (exactly one per deployment)
#   entrypoint.sh dns               manage.py serve_dns: the RPZ and URIBL zones (optional,
#                                   one per node that DNS consumers ask, beside its worker)
#   entrypoint.sh migrate           database migrations (once per release, before web)
#   entrypoint.sh createsuperuser   the first admin from DJANGO_SUPERUSER_* (idempotent)
#   entrypoint.sh manage ARGS...    any manage.py command (filter_info, sync_filter ...)
#   entrypoint.sh healthcheck       GET /healthz on this node's web (the image's HEALTHCHECK)
#   entrypoint.sh healthcheck dns   the SOA of the RPZ zone from this node's serve_dns
set -eu

# The service project's WSGI callable and Celery app: the one place to change them.
WSGI_APP="urlguard_service.wsgi:application"
CELERY_APP="urlguard_service"

ROOT=$(CDPATH='' cd -- "$(dirname -- "$0")/.." && pwd)
cd "$ROOT"
PYTHON="${URLGUARD_PYTHON:-python3}"
# The settings module is manage.py's default unless the environment names another.
if [ -z "${DJANGO_SETTINGS_MODULE:-}" ]; then
    DJANGO_SETTINGS_MODULE=$(sed -n 's/.*setdefault("DJANGO_SETTINGS_MODULE", *"\([^"]*\)").*/\1/p' manage.py)
    [ -n "$DJANGO_SETTINGS_MODULE" ] || { echo "entrypoint: no DJANGO_SETTINGS_MODULE default in $ROOT/manage.py" >&2; exit 2; }
fi
export DJANGO_SETTINGS_MODULE

# Every process of a node writes its metric files in one directory, which /metrics sums.
export PROMETHEUS_MULTIPROC_DIR="${PROMETHEUS_MULTIPROC_DIR:-${URLGUARD_VAR_DIR:-$ROOT/var}/metrics}"
mkdir -p "$PROMETHEUS_MULTIPROC_DIR"

BIND="${URLGUARD_BIND:-0.0.0.0:8000}"
# A high port: the image's user may bind nothing below 1024. Publish or map 53 to it
# (compose, the Kubernetes Service), or grant CAP_NET_BIND_SERVICE (the systemd unit).
DNS_BIND="${URLGUARD_DNS_BIND:-0.0.0.0:5353}"
DNS_ZONE="${URLGUARD_DNS_RPZ_ZONE:-rpz.urlguard.}"
QUEUES="${URLGUARD_WORKER_QUEUES:-urlguard.broadcast,celery}"
LOGLEVEL="${URLGUARD_LOG_LEVEL:-INFO}"

usage() {
    sed -n '5,16p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

[ $# -ge 1 ] || usage
role=$1
shift
case "$role" in
web)
    # The gunicorn hooks (urlguard_service.gunicornconf) remove the metric files of processes
    # that are gone before the first worker starts, mark exited workers dead, and write
    # each worker's buffered statistics as it exits.
    exec "$PYTHON" -m gunicorn -c python:urlguard_service.gunicornconf \
        --bind "$BIND" --workers "${WEB_CONCURRENCY:-4}" \
        --forwarded-allow-ips "${FORWARDED_ALLOW_IPS:-127.0.0.1,::1}" \
        --access-logfile - "$@" "$WSGI_APP"
    ;;
worker)
    # --concurrency 1: the node's filter has one writer; a change is applied in
    # milliseconds, a feed refresh runs here too but never in a request.
    exec "$PYTHON" -m celery -A "$CELERY_APP" worker -Q "$QUEUES" --concurrency 1 \
        --hostname "${URLGUARD_NODE_NAME:-%h}@%h" --loglevel "$LOGLEVEL" \
        --without-gossip --without-mingle "$@"
    ;;
beat)
    # Its schedule file lives in var/; a second beat only repeats idempotent work (a
    # catch-up, a verify; a due feed is claimed by one refresh), so it is waste, not harm.
    exec "$PYTHON" -m celery -A "$CELERY_APP" beat --loglevel "$LOGLEVEL" \
        --schedule "${URLGUARD_BEAT_SCHEDULE:-${URLGUARD_VAR_DIR:-$ROOT/var}/celerybeat-schedule}" "$@"
    ;;
dns)
    # Reads the database and this node's filter file (written by the node's worker).
    host="${DNS_BIND%:*}"
    host="${host#[}"
    exec "$PYTHON" manage.py serve_dns --address "${host%]}" --port "${DNS_BIND##*:}" "$@"
    ;;
migrate)
    exec "$PYTHON" manage.py migrate --noinput "$@"
    ;;
createsuperuser)
    : "${DJANGO_SUPERUSER_USERNAME:?set DJANGO_SUPERUSER_USERNAME (and DJANGO_SUPERUSER_PASSWORD, DJANGO_SUPERUSER_EMAIL)}"
    : "${DJANGO_SUPERUSER_PASSWORD:?set DJANGO_SUPERUSER_PASSWORD}"
    export DJANGO_SUPERUSER_EMAIL="${DJANGO_SUPERUSER_EMAIL:-}"
    # Idempotent, so that it can run at every deploy: an existing user is left as it is
    # (its password is never reset from the environment). A new one never gets a
    # placeholder password copied from the examples (urlguard.conf.is_placeholder).
    found=0
    "$PYTHON" manage.py shell --verbosity 0 -c '
import os, sys
from django.contrib.auth import get_user_model
from urlguard.conf import is_placeholder
User = get_user_model()
if User.objects.filter(**{User.USERNAME_FIELD: os.environ["DJANGO_SUPERUSER_USERNAME"]}).exists():
    sys.exit(0)
if is_placeholder(os.environ["DJANGO_SUPERUSER_PASSWORD"]):
    sys.exit("entrypoint: DJANGO_SUPERUSER_PASSWORD is a placeholder (such as CHANGE-ME "
             "in the examples); set a password of your own")
sys.exit(3)
' || found=$?
    case "$found" in
    0)
        echo "entrypoint: user $DJANGO_SUPERUSER_USERNAME exists; left unchanged"
        exit 0
        ;;
    3) ;;
    *) exit "$found" ;;
    esac
    exec "$PYTHON" manage.py createsuperuser --noinput "$@"
    ;;
manage)
    exec "$PYTHON" manage.py "$@"
    ;;
healthcheck)
    if [ "${1:-}" = dns ]; then
        # Healthy: the RPZ zone's SOA answered, authoritatively, within 3 seconds.
        exec "$PYTHON" -c '
import sys
import dns.flags, dns.message, dns.query, dns.rcode, dns.rdatatype
host, _, port = sys.argv[1].rpartition(":")
host = "127.0.0.1" if host in ("", "0.0.0.0", "[::]", "::") else host.strip("[]")
query = dns.message.make_query(sys.argv[2], "SOA")
answer = dns.query.udp(query, host, port=int(port), timeout=3)
ok = answer.rcode() == dns.rcode.NOERROR and answer.flags & dns.flags.AA and any(
    r.rdtype == dns.rdatatype.SOA for r in answer.answer)
sys.exit(0 if ok else 1)
' "$DNS_BIND" "$DNS_ZONE"
    fi
    exec "$PYTHON" -c '
import sys, urllib.request
host, _, port = sys.argv[1].rpartition(":")
host = "127.0.0.1" if host in ("", "0.0.0.0", "[::]") else host.strip("[]")
with urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=5) as answer:
    sys.exit(0 if answer.status == 200 else 1)
' "$BIND"
    ;;
*)
    echo "entrypoint: unknown role '$role'" >&2
    usage
    ;;
esac
