# Two entry points: `make demo` (main job on the embedded default) and `make test` (the test suite).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test lint prometheus clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/spotray demo

lint: $(STAMP)
	$(BIN)/ruff check .

# The monitoring tests run a real Prometheus and promtool (Debian's package).
prometheus:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || { \
		$(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; }

test: lint prometheus
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) spotray-runs .pytest_cache
