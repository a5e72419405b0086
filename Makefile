# Everything installs itself into .venv from nothing; only python3 (3.11+) and make are assumed.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: run test bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

run: $(BIN)/.installed  ## the broker on its defaults (STOMP 61613, data in ./data)
	$(BIN)/gateway serve $(ARGS)

test: $(BIN)/.installed  ## the whole test suite
	$(BIN)/python -X dev -bb -m pytest $(PYTEST_ARGS)

bench: $(BIN)/.installed  ## throughput and latency benchmarks (prints msgs/s, percentiles, RSS)
	$(BIN)/python benchmarks/run.py $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
