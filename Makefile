# Developer and CI entry points. `make check` is what CI runs (.ci/run).
VENV := .venv/bin
PYTEST_ARGS ?=

.PHONY: bootstrap run lint types test check bench

bootstrap:
	scripts/bootstrap

run:
	scripts/serve

lint: bootstrap
	$(VENV)/ruff check $(wildcard gateway tests bench)

types: bootstrap
	$(VENV)/mypy gateway

test: bootstrap
	scripts/test $(PYTEST_ARGS)

check: bootstrap lint types test

# Runs every bench/*.py in sequence (each script is self-contained).
bench: bootstrap
	@set -e; for f in bench/*.py; do \
		[ -e "$$f" ] || { echo "no bench scripts"; break; }; \
		echo "== $$f"; $(VENV)/python "$$f"; \
	done
