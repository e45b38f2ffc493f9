# flowtide — the two commands the README starts with:
#   make run    install into .venv what running needs (flowtide, pyspark, the web UI's server;
#               Java for Spark) and run examples/quickstart.yaml and examples/spark_etl.yaml
#               embedded
#   make test   install what the tests need (PostgreSQL server, Java, the JDBC driver, HAProxy, nginx,
#               Chromium) and run
#               them all (examples/plugin's own tests too: tests/plugins installs it)
#   make dev    install, then start the distributed stack on loopback (`flowtide dev up`)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev
RUN_STAMP := $(VENV)/.installed-run

.PHONY: run test install dev lint typecheck bench clean

$(BIN)/python:
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  echo "python3 -m venv failed; installing python3-venv"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv; \
	  rm -rf $(VENV); $(PYTHON) -m venv $(VENV); }
	@$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[postgres,spark,nats,server,dev]'
	@touch $(STAMP)

# What running needs, without the test tools: pyspark (spark steps) and FastAPI/uvicorn
# (flowtide ui and flowtide server). `make test` installs the dev extras on top.
$(RUN_STAMP): pyproject.toml | $(BIN)/python
	@echo "make run: installing flowtide into .venv with pyspark (for spark steps) and the web UI's server (fastapi, uvicorn); the test tools come with make test"
	$(BIN)/pip install -q -e '.[spark,server]'
	@touch $@

install: $(STAMP)

run: $(RUN_STAMP)
	$(BIN)/flowtide run examples/quickstart.yaml
	@bash scripts/ensure-spark.sh --java-only
	$(BIN)/flowtide run examples/spark_etl.yaml
	@echo
	@echo "See these runs in the web UI: $(BIN)/flowtide ui   (then open the URL it prints; Ctrl-C stops it)"

test: install
	@bash scripts/ensure-postgres.sh
	@bash scripts/ensure-spark.sh
	@bash scripts/ensure-haproxy.sh
	@bash scripts/ensure-nginx.sh
	@bash scripts/ensure-chromium.sh
	$(BIN)/ruff check src tests bench examples/plugin
	$(BIN)/ruff format --check src tests bench examples/plugin
	$(BIN)/mypy
	@# Two processes, each module's tests in one of them (a module's stack is started once).
	$(BIN)/pytest -n 2 --dist loadscope

dev: install
	@bash scripts/ensure-postgres.sh
	$(BIN)/flowtide dev up

lint: install
	$(BIN)/ruff check src tests bench examples/plugin
	$(BIN)/ruff format --check src tests bench examples/plugin

typecheck: install
	$(BIN)/mypy

bench: install
	$(BIN)/python bench/loop.py
	$(BIN)/python bench/spark.py
	$(BIN)/python bench/distributed.py

clean:
	-@[ -x $(BIN)/flowtide ] && $(BIN)/flowtide dev down 2>/dev/null || true
	rm -rf $(VENV) .flowtide examples/.flowtide examples/out .pytest_cache .mypy_cache .ruff_cache
