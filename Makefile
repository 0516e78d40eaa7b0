# AERO. `make run` installs everything into .venv and starts the app; `make test` runs
# the whole suite (PostgreSQL + Redis on 127.0.0.1, see README).
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Compiled translations (not committed: built from the .po files, docs/i18n.md).
MO := $(patsubst %.po,%.mo,$(wildcard locale/*/LC_MESSAGES/django.po))

.PHONY: install messages run worker llm-runner test lint typecheck check bench clean

install: $(STAMP) messages

messages: $(MO)

locale/%.mo: locale/%.po
	@command -v msgfmt >/dev/null 2>&1 || scripts/install-system-deps.sh
	msgfmt --check-format -o $@ $<

$(STAMP): pyproject.toml
	@PY=$${PYTHON:-$$(scripts/find-python.sh)} && echo "Using $$PY" && \
	  { [ -x $(BIN)/python ] || "$$PY" -m venv $(VENV); }
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

run: install
	scripts/run.sh

worker: install
	$(BIN)/python manage.py aero_worker

llm-runner: install
	$(BIN)/python manage.py aero_llm_runner

# The suite runs in TEST_WORKERS pytest-xdist processes (2: the CI machine's cores; 0 runs
# it in this process). loadgroup keeps the tests marked xdist_group("faults") in one
# worker, one after another.
TEST_WORKERS ?= 2
# The project's bytecode is written once before the run: where PYTHONDONTWRITEBYTECODE is
# set, every Django process the suite starts (servers, workers, manage.py) would otherwise
# compile ~260 modules again (~0.5 s of its ~3 s start-up CPU).
PY_PACKAGES := aero api approvals diagnosis ingest packs replay scenarios_admin tools tests bench
test: install
	scripts/install-browser.sh
	scripts/install-system-deps.sh
	$(BIN)/python -m compileall -q $(PY_PACKAGES) manage.py >/dev/null
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy .

check: lint typecheck test

# BENCH_ARGS scales bench/perf.py (e.g. BENCH_ARGS="--at-once 1000 --push-sessions 100").
bench: install
	$(BIN)/python bench/timeline_render.py
	$(BIN)/python bench/perf.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) var staticfiles .pytest_cache .mypy_cache .ruff_cache $(MO)
