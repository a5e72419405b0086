# Everything installs itself into .venv from nothing; only python3 (3.11+) and make are assumed.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: run test bench clean system-packages js-bundles fast unfast test-fast typecheck

# Two stamps in one .venv: the broker's own dependencies (all `make run`
# needs, about 200 MB), then the test extras on top (pyspark, pandas,
# selenium...: about 1 GB more), so a first `make run` costs what the broker
# costs, `make run` after `make test` installs nothing, and `make test` after
# `make run` adds only the extras.
$(BIN)/.installed-broker: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $@

$(BIN)/.installed: $(BIN)/.installed-broker
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

run: $(BIN)/.installed-broker  ## the broker on its defaults (STOMP 61613, data in ./data)
	$(BIN)/gateway serve $(ARGS)

test: $(BIN)/.installed system-packages js-bundles  ## the whole test suite
	$(BIN)/python -X dev -bb -m pytest $(PYTEST_ARGS)

# The WebSocket browser tests load stomp.js and MQTT.js from the npm registry at
# pinned versions, checked against their sha512 (tests/support/npm_bundles.py), into
# build/npm; when that is impossible (offline) those tests skip and say why.
js-bundles: $(BIN)/.installed
	@$(BIN)/python tests/support/npm_bundles.py >/dev/null || echo "npm bundles could not be fetched: the WebSocket browser tests will be skipped"

# The interop tests drive Debian's mosquitto_pub/mosquitto_sub, the console
# test Debian's chromium through chromedriver, the HA tests a real ZooKeeper
# (Debian's zookeeper package, on the Java it depends on); install them when
# missing and possible (root or passwordless sudo), one by one if together they
# fail, else those tests skip and say why.
SYSTEM_PACKAGES := mosquitto-clients chromium chromium-driver zookeeper
system-packages:
	@{ command -v mosquitto_pub && command -v chromium && command -v chromedriver && test -f /usr/share/java/zookeeper.jar; } >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; else exit 0; fi; \
	  command -v apt-get >/dev/null 2>&1 || exit 0; \
	  $$SUDO apt-get install -y -q $(SYSTEM_PACKAGES) >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -q >/dev/null 2>&1 && $$SUDO apt-get install -y -q $(SYSTEM_PACKAGES) >/dev/null 2>&1; } || \
	  for package in $(SYSTEM_PACKAGES); do \
	    $$SUDO apt-get install -y -q $$package >/dev/null 2>&1 || \
	    echo "$$package could not be installed: the tests that need it will be skipped"; \
	  done; }

bench: $(BIN)/.installed  ## throughput and latency benchmarks (prints msgs/s, percentiles, RSS)
	$(BIN)/python benchmarks/run.py $(ARGS)

# mypy in strict mode over what pyproject.toml's [tool.mypy] names (the
# codecs, the core, persistence); CI runs it.
typecheck: $(BIN)/.installed
	$(BIN)/pip install --quiet 'mypy==$(MYPY_VERSION)'
	$(BIN)/mypy

# Optional: the sans-IO hot path compiled with mypyc into extension modules
# next to their .py files, which the same imports then load; `make run` and
# `make test` use them while they are there. `make unfast` (or `make clean`)
# removes them: the .py files are the fallback and stay the source. Rebuild
# after editing any of them (tests/test_compiled.py fails on a stale build).
# build_fast.py names the modules (deploy/Dockerfile compiles the same ones
# into the image's wheel).
MYPY_VERSION := 2.4.1
FAST_MODULES = $(shell $(PYTHON) build_fast.py --list)

fast: $(BIN)/.installed  ## compile the hot path with mypyc (about a minute; `make unfast` undoes it)
	$(BIN)/pip install --quiet 'mypy==$(MYPY_VERSION)' 'setuptools>=68'
	$(MAKE) --no-print-directory unfast
	@mkdir -p build
	$(BIN)/python build_fast.py >build/fast.log 2>&1 || { cat build/fast.log; exit 1; }
	@echo "compiled: $(words $(FAST_MODULES)) modules"

# What CI runs against the compiled build (after `make test`, pure): the unit
# tests and the end-to-end files that drive STOMP and MQTT through it, and the
# image's compiled wheel built, installed and run on its own.
FAST_TESTS := tests/unit tests/test_layering.py tests/test_compiled.py tests/e2e/test_compiled_wheel.py \
	$(addprefix tests/e2e/test_,smoke.py connect.py acks.py queues.py topics.py transactions.py \
	selectors.py errors.py flow_control.py connection_writes.py mqtt.py mqtt_paho.py mqtt_clients.py \
	durability_queues.py durability_sigterm.py durability_subscriptions.py durability_transactions.py \
	store_corruption.py store_disk_full.py memory_bound.py websocket.py fault_isolation.py \
	mqtt5_publish.py mqtt5_sessions.py mqtt5_subscriptions.py mqtt5_shared_qos2.py)
test-fast: fast system-packages  ## build with mypyc, then run FAST_TESTS against the build (about 6 min)
	$(BIN)/python -X dev -bb -m pytest $(PYTEST_ARGS) $(FAST_TESTS)

unfast:  ## back to pure Python: remove what `make fast` built
	rm -rf build/temp.* build/lib.* build/__native* build/ops.txt build/fast.log build/core build/gateway .mypy_cache
	rm -f gateway/_fast__mypyc.*.so $(patsubst %.py,%.cpython-*.so,$(FAST_MODULES))

clean: unfast
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
