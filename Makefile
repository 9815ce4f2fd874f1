# Both targets create or refresh .venv from pyproject.toml: nothing is installed by hand.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo data test-data test lint venv clean golden native

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# The hot path compiled with mypyc (simulator/native.py): a no-op when the sources are those
# compiled; where no C compiler works it says so and servesim runs as pure Python
native: $(STAMP)
	$(BIN)/python tools/build_native.py

demo: native
	$(BIN)/servesim run scenarios/quickstart.yaml --out results/quickstart --overwrite

# The public traces the *-replay scenarios read, saved as data/azure2023_conv.csv,
# data/azure2023_code.csv and data/mooncake_fast25_conversation_trace.jsonl (sha256-verified;
# a download, so neither demo nor test depends on it; `servesim fetch --list` shows them all)
data: $(STAMP)
	$(BIN)/servesim fetch traces

lint: $(STAMP)
	$(BIN)/ruff check simulator tests benchmarks
	$(BIN)/ruff format --check simulator tests benchmarks
	$(BIN)/mypy simulator

# The data files the tests read: those in neither ../shared/data nor data/ are downloaded into
# data/ (from $$SERVESIM_DATA_URL if set); silent and offline when none is missing
test-data: $(STAMP)
	$(BIN)/python -m tests.fetch_data

test: lint test-data native
	$(BIN)/python -m pytest -n 2 -q tests

# The scenario tests' golden figures, written anew after an intended change of behaviour
golden: $(STAMP)
	$(BIN)/python -m tests.regenerate_golden

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache simulator/_native.json
	find simulator -name "*.so" -delete
