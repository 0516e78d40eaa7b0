# AERO. `make run` installs everything into .venv and starts the app; `make test` runs
# the whole suite (PostgreSQL + Redis on 127.0.0.1, see README).
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run worker test lint typecheck check bench clean

install: $(STAMP)

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

test: install
	scripts/install-browser.sh
	scripts/install-system-deps.sh
	$(BIN)/pytest $(PYTEST_ARGS)

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
	rm -rf $(VENV) var staticfiles .pytest_cache .mypy_cache .ruff_cache
