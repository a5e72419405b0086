"""What the tests share and are not tests: clients, brokers and clusters as
processes, fakes of the core's ports, codec and store helpers, Hypothesis
strategies, and the pinned browser bundles (npm_bundles.py, also run by the
Makefile)."""
