# Two entry points: `make demo` (main job on the embedded default) and `make test` (the test suite);
# on a machine with CUDA GPUs, `make gpu-test` runs every check that needs one.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
GPU_RESULTS ?= gpu-results

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test gpu-test lint prometheus clean

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

# NCCL DDP/FSDP2 on every GPU, exact resume, bf16 + torch.compile, a Transformers model, and the throughput bench
# (its JSON, with tokens/s and MFU, goes to $(GPU_RESULTS)/ for BENCHMARKS.md). Fails where CUDA is missing.
gpu-test: $(STAMP)
	$(BIN)/python -c 'import torch; assert torch.cuda.is_available(), "no CUDA device: nothing to test"'
	SPOTRAY_GPU_RESULTS=$(GPU_RESULTS) $(BIN)/python -m pytest -m gpu tests/gpu -v

clean:
	rm -rf $(VENV) spotray-runs .pytest_cache
