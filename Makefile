# Two commands for a fresh machine:
#   make run    set everything up, then start the service (`pipebd up`: API, worker, dashboard)
#   make test   set everything up, then lint, type-check and run the test suite
# and the inner loop: make test-unit   the pure-logic tier (tests/unit) alone, in under a minute
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test test-unit lint service-packages browser-packages

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile -e '.[dev]'
	@# byte-compiled on every core (pip compiles one file after another: a quarter of the set-up); the few
	@# files that are not Python 3.11 (packages' templates) are skipped, as pip skips them
	$(BIN)/python -m compileall -q -j 0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > /dev/null || true
	touch $(STAMP)

run: setup
	$(BIN)/pipebd up

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The service tests use the Redis and PostgreSQL running here, or start throw-away instances from
# Debian's packages; install those where neither is there (and skip, saying why, where we cannot).
service-packages:
	@if ! command -v redis-server >/dev/null || ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server postgresql >/dev/null; \
	  else \
	    echo "make: redis-server or postgresql is not installed; the tests that need them will be skipped"; \
	  fi; \
	fi

# The browser tests drive Debian's Chromium (Playwright cannot download a browser here); install it
# where it is missing (and skip those tests, saying why, where we cannot).
browser-packages:
	@if [ ! -x /usr/bin/chromium ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  else \
	    echo "make: /usr/bin/chromium is not installed; the browser tests will be skipped"; \
	  fi; \
	fi

# pytest's exit code 5 (no tests collected) fails too, and says so: a suite that collects nothing proves nothing.
# mypy (about a minute on a fresh clone, one core) type-checks while the tests run; either failing fails.
test: setup service-packages browser-packages
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@$(BIN)/mypy > $(VENV)/mypy.log 2>&1 & mypy=$$!; \
	$(BIN)/python -m pytest $(PYTEST_ARGS); code=$$?; \
	if [ $$code -eq 5 ]; then echo "make test: pytest collected no tests" >&2; fi; \
	wait $$mypy; typed=$$?; cat $(VENV)/mypy.log; \
	if [ $$typed -ne 0 ]; then echo "make test: mypy found errors (above)" >&2; [ $$code -ne 0 ] || code=1; fi; \
	exit $$code

# The pure-logic tier alone (tests/unit: no process started, no rank launched), in one process.
test-unit: setup
	$(BIN)/python -m pytest -n 0 tests/unit $(PYTEST_ARGS)
