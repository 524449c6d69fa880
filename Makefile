# Every target creates or updates .venv by itself, from requirements.lock (uv pip compile).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit bench lock clean mutants conformance-tools

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): requirements.lock pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q "uv==0.13.8"
	$(BIN)/uv pip sync -q --compile-bytecode --python $(BIN)/python requirements.lock
	$(BIN)/uv pip install -q --python $(BIN)/python --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/interlock demo

lint: $(STAMP)
	$(BIN)/ruff check --no-cache .
	$(BIN)/ruff format --no-cache --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# Node.js 22 and the pinned MCP conformance suite, into .tools/ (tests/conformance/install.sh).
# Without npm the conformance tests skip locally (CI installs npm first and never skips).
conformance-tools:
	@if command -v npm >/dev/null 2>&1; then bash tests/conformance/install.sh >/dev/null; \
	else echo "npm not found: the MCP conformance tests will be skipped"; fi

test: lint typecheck conformance-tools
	$(BIN)/python -m pytest -q -p no:cacheprovider

# Named dangerous mutations of a scratch copy; each must be killed by its tests (scripts/mutants.py).
mutants: $(STAMP)
	$(BIN)/python scripts/mutants.py

bench: $(STAMP)
	$(BIN)/python -m bench

lock: | $(BIN)/python
	$(BIN)/python -m pip install -q "uv==0.13.8"
	$(BIN)/uv pip compile pyproject.toml --extra dev --generate-hashes --universal --python-version 3.11 -q -o requirements.lock

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .tools
