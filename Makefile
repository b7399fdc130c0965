# The two commands the README opens with. Both create .venv and install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# a second environment with TransformerLens 4.x (.venv has 3.x, the tests' oracle)
TL4 := .venv-tl4/bin
TORCH := torch==2.13.0
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: reproduce train test setup chromium test-tl4 docs fuzz

$(BIN)/qkov: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test]"
	touch $(BIN)/qkov

setup: $(BIN)/qkov

## The main job: train 0-, 1- and 2-layer models on the Python standard library, analyse them, check
## the paper's claims, write runs/reproduce/report.html and results.json (rerun to resume).
reproduce: setup
	$(BIN)/qkov reproduce --out runs/reproduce

## Only the 2-layer model (rerun to resume).
train: setup
	$(BIN)/qkov train --layers 2 --out runs/2-layer --resume

## Headless Chromium and its driver for the report's and the explorer's browser tests (Debian
## packages), when either is missing.
chromium:
	@{ command -v chromium && command -v chromedriver; } >/dev/null 2>&1 || { \
		echo "installing chromium and chromium-driver (for the browser tests)"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium chromium-driver >/dev/null; \
	} || echo "warning: could not install chromium; the browser test will be skipped"

## The whole test suite (slow multi-process, kill/resume and determinism tests, TransformerLens oracle
## and headless-browser tests included), then the linter.
test: setup chromium
	$(BIN)/python -m pytest -m "slow or not slow"
	$(MAKE) test-tl4
	$(BIN)/ruff check src tests benchmarks studies

## The fuzzing suite at length: 2,000 generated cases per target (malformed checkpoints, token files,
## arguments, explorer requests; 200 in make test), its counts written to runs/fuzz.json.
fuzz: setup
	rm -f runs/fuzz.json && mkdir -p runs
	QKOV_FUZZ_EXAMPLES=2000 QKOV_FUZZ_REPORT=runs/fuzz.json $(BIN)/python -m pytest tests/test_fuzz.py -x -q
	cat runs/fuzz.json

## The documentation site: every tutorial executed in a kernel, every warning an error; then a check
## that no page loads anything from the network. Open docs/_build/html/index.html.
docs: setup
	$(BIN)/sphinx-build -W --keep-going -q -b html docs docs/_build/html
	@! grep -rlE '<(script|link)[^>]+(src|href)="(https?:)?//' docs/_build/html --include=*.html \
		|| { echo "error: a page above loads something from the network"; exit 1; }

$(TL4)/qkov: pyproject.toml
	$(PYTHON) -m venv .venv-tl4
	$(TL4)/pip install -q "$(TORCH)"
	$(TL4)/pip install -q -e . "transformer-lens>=4,<5" "pytest>=8" "hypothesis>=6.100"
	touch $(TL4)/qkov

## The TransformerLens 4 tests (TransformerBridge both ways) in .venv-tl4.
test-tl4: $(TL4)/qkov
	$(TL4)/python -m pytest tests/test_transformer_bridge.py -m "slow or not slow"
