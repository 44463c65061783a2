# Developer and CI entry points. `make check` is what CI runs (.ci/run).
VENV := .venv/bin
PYTEST_ARGS ?=

.PHONY: bootstrap run lint types test test-fast check bench lock newest

bootstrap:
	scripts/bootstrap test

# Refresh requirements/*.txt (hash-checked) from pyproject.toml's ranges, keeping locked
# versions the ranges still allow; `scripts/lock --upgrade` takes the newest instead.
lock:
	scripts/lock

# The fast suite on the newest releases the ranges allow, in .venv-newest (the kept lock
# is not touched): a release that breaks the gateway shows here the day it ships.
newest:
	scripts/newest $(PYTEST_ARGS)

run:
	scripts/serve

lint: bootstrap
	$(VENV)/ruff check $(wildcard gateway tests bench)

types: bootstrap
	$(VENV)/mypy gateway

test: bootstrap
	scripts/test $(PYTEST_ARGS)

# The inner loop: everything but the slow end-to-end `system` tests (tests/system/, the
# cluster tests, and a few marked one by one), on 6 xdist workers (each starts its own
# redis-server; the tests mostly wait on I/O): 70-75 s on the 2-core dev machine.
test-fast: bootstrap
	scripts/test -m "not system" -n 6 $(PYTEST_ARGS)

check: bootstrap lint types test

# Runs the benchmark scripts in sequence, each in its --quick mode (under 10 minutes in
# all on the 2-vCPU dev machine); every script prints its figures beside a baseline
# measured in the same run. bench/sse_load.py and bench/baselines.py are helpers, not
# benches. Full-length runs: call a script without --quick (see BENCHMARKS.md).
BENCH_SCRIPTS := bridge_publish publish_call bridge_fanout bridge_resume sse_memory sse_redis sse_idle sse_reconnect \
	http_publish producer_client sse_sweep sessions_index cluster_notifications workers \
	redis_connections lua_cost

bench:
	scripts/bootstrap bench
	@set -e; for f in $(BENCH_SCRIPTS); do \
		echo "== bench/$$f.py"; \
		if [ "$$f" = sessions_index ]; then $(VENV)/python "bench/$$f.py"; \
		else $(VENV)/python "bench/$$f.py" --quick; fi; \
	done
