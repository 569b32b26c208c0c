# The two commands of README.md: `make run` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run test test-services bench lint

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev,bench]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(PY) manage.py migrate --noinput
	$(PY) manage.py seed_demo
	$(PY) manage.py runserver 127.0.0.1:8000

# Pass one: everything on the embedded defaults (SQLite, Celery in-process).
# Pass two: the `services` tests against real PostgreSQL, Redis and a Celery worker.
test: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy filterengine
	$(PY) -m pytest -q
	# -o: `test` already depends on install; without it the sub-make re-runs install
	# whenever pyproject.toml is newer than the stamp (a fresh worktree checkout).
	$(MAKE) --no-print-directory -o install -o $(STAMP) test-services

test-services: install
	DATABASE_URL=$${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/urlguard} \
	CELERY_BROKER_URL=$${TEST_CELERY_BROKER_URL:-redis://127.0.0.1:6379/15} \
	$(PY) -m pytest -q -m services

bench: install
	$(PY) bench/engine.py
	$(PY) bench/variants.py

lint: install
	$(VENV)/bin/ruff check .
