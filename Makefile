# The two commands of README.md: `make run` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install bench-install run test test-fast test-live bench lint typecheck

# The service's exact versions (constraints.txt) within the app's ranges (pyproject.toml).
EXTRAS := dev,server,postgres,celery,redis,metrics,dns,comments
$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -c constraints.txt -e '.[$(EXTRAS)]'
	touch $(STAMP)

install: $(STAMP)

# The compiled peers the benchmarks compare against: only `make bench` needs them.
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(STAMP)
	$(VENV)/bin/pip install -q -c constraints.txt -e '.[bench]'
	touch $(BENCH_STAMP)

bench-install: $(BENCH_STAMP)

# `make run PORT=8001` for another port. A busy port stops it before anything is
# migrated or seeded; the system checks run once, by runserver, after the demo has
# built its filter file (before, they would warn that it is missing).
PORT ?= 8000
run: install
	@$(PY) -c 'import socket, sys; port = sys.argv[1]; s = socket.socket(); \
	s.bind(("127.0.0.1", int(port))) if port.isdigit() and 0 < int(port) < 65536 else \
	sys.exit(f"make run: PORT={port!r} is no port number (1-65535)")' "$(PORT)" \
	2>/dev/null || { echo "make run: port $(PORT) is busy or not a port: stop what uses it, or run \`make run PORT=8001\`" >&2; exit 1; }
	$(PY) manage.py migrate --noinput --skip-checks
	$(PY) manage.py seed_demo --skip-checks --base-url http://127.0.0.1:$(PORT)
	$(PY) manage.py runserver 127.0.0.1:$(PORT)

# Lint, format and type checks first, then two passes of the suite with the deterministic
# Hypothesis profile `ci` (tests/conftest.py): the same answer on every run.
# Pass one: everything on the embedded defaults (SQLite, Celery in-process), on two
# processes; `--dist load` hands each its tests in collection order, which keeps
# pytest-django's order (transactional tests last) within each process.
# Pass two: the `live` tests against real PostgreSQL, Redis and a Celery worker.
# The two run side by side: pass two mostly waits on its services and workers, so it
# costs pass one little CPU. Pass two's output is held in a file and printed after
# pass one's; the recipe fails if either pass failed.
test: lint typecheck
	@live_log=$$(mktemp) && trap 'rm -f "$$live_log"' EXIT && \
	{ $(LIVE_PYTEST) >"$$live_log" 2>&1 & } && live_pid=$$! && \
	{ $(PY) -m pytest -q --hypothesis-profile=ci -n 2 --dist load; one=$$?; } && \
	{ wait $$live_pid; two=$$?; } && \
	echo "=== pass two (make test-live) ===" && cat "$$live_log" && \
	test $$one -eq 0 && test $$two -eq 0

# The inner loop: pass one without the browser tests and the `slow` ones (each starts a
# server or a program of its own: gunicorn, manage.py, BIND, a wheel build), on two
# processes; no lint, no types, no live services. `make test` before a commit.
test-fast: install
	$(PY) -m pytest -q --hypothesis-profile=ci -n 2 --dist load -m "not live and not browser and not slow"

LIVE_PYTEST = DATABASE_URL=$${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/urlguard} \
	CELERY_BROKER_URL=$${TEST_CELERY_BROKER_URL:-redis://127.0.0.1:6379/15} \
	$(PY) -m pytest -q -m live --hypothesis-profile=ci

test-live: install
	$(LIVE_PYTEST)

bench: bench-install
	$(PY) bench/engine.py
	$(PY) bench/variants.py

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# filterengine strictly (it ships py.typed); urlguard with django-stubs: pyproject.toml's
# per-module settings, in one run (the Django plugin sets Django up once).
typecheck: install
	$(VENV)/bin/mypy filterengine urlguard urlguard_service
