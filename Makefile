# flowtide — the two commands the README starts with:
#   make run    install into .venv and run examples/quickstart.yaml embedded
#   make test   install what the tests need (PostgreSQL server included) and run them all
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev

.PHONY: run test install lint typecheck bench clean

$(BIN)/python:
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  echo "python3 -m venv failed; installing python3-venv"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv; \
	  rm -rf $(VENV); $(PYTHON) -m venv $(VENV); }
	@$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[postgres,spark,dev]'
	@touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/flowtide run examples/quickstart.yaml

test: install
	@bash scripts/ensure-postgres.sh
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy
	$(BIN)/pytest

lint: install
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: install
	$(BIN)/mypy

bench: install
	$(BIN)/python bench/loop.py

clean:
	rm -rf $(VENV) .flowtide .pytest_cache .mypy_cache .ruff_cache
