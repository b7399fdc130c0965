# The two commands the README opens with. Both create .venv and install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0

.PHONY: train test setup

$(BIN)/qkov: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test]"
	touch $(BIN)/qkov

setup: $(BIN)/qkov

## The main job: train the default 2-layer model on the Python standard library (rerun to resume).
train: setup
	$(BIN)/qkov train --layers 2 --out runs/2-layer --resume

## The test suite (TransformerLens oracle tests included), then the linter.
test: setup
	$(BIN)/python -m pytest
	$(BIN)/ruff check src tests benchmarks
