# The two set-up commands of the README: `make demo` and `make test`.
# Each creates .venv and installs what it needs on first use, and again only
# when pyproject.toml changes.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
# Real MCP peers for the tests (server-everything, the conformance suite), from npm.
PEERS := node_modules/.installed

.PHONY: demo test check lint typecheck pytest bench clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "toolkernel needs Python 3.11 or newer; set PYTHON=python3.11")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/toolkernel demo

test: lint typecheck pytest

$(PEERS): package.json
	@command -v npm >/dev/null || { echo "make test needs Node.js 20+ and npm for the MCP test peers"; exit 1; }
	npm install --no-audit --no-fund --loglevel=error
	@touch $(PEERS)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP) $(PEERS)
	$(BIN)/pytest

BENCHES := kernel_overhead validators sandbox_spawn kill_latency output_memory \
	search_vs_rg redaction_throughput ledger_backends mcp_bridge

bench: $(STAMP) $(PEERS)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,bench]'
	@for b in $(BENCHES); do echo "== $$b"; $(BIN)/python bench/$$b.py || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
