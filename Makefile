# Two entry points: `make demo` (main job on the embedded default) and `make test` (the test suite);
# on a machine with CUDA GPUs, `make gpu-test` runs every check that needs one.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CHECKOV := .venv-checkov/bin/checkov
CHECKOV_VERSION := 3.3.30
GPU_RESULTS ?= gpu-results

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

STACKS := $(patsubst Pulumi.%.yaml,%,$(wildcard Pulumi.*.yaml))
RENDERED := cluster/rendered

.PHONY: demo test quick gpu-test lint typecheck docs workflows prometheus clean install plan-diff image render render-check \
	pulumi-env publish-render scan

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch through pip (where a CPU build lies on this machine's disk, pip takes it; uv would fetch a CUDA build),
	# then uv for the rest: it keeps that torch and installs the other packages in seconds rather than minutes.
	# Compiled to bytecode as pip does: with PYTHONDONTWRITEBYTECODE set, every Ray worker would compile torch again.
	$(BIN)/pip install --quiet "$$(grep -o 'torch==[0-9.]*' pyproject.toml)" uv
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/spotray demo

lint: $(STAMP) workflows
	$(BIN)/ruff check .

# mypy over the package and the tests, as [tool.mypy] in pyproject.toml configures it.
typecheck: $(STAMP)
	$(BIN)/mypy

# The manual (docs/, mkdocs.yml) built into site/ with --strict: a broken link or anchor, or a page missing from the
# nav, fails it.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --quiet

# The GitHub workflows against GitHub's schema, and zizmor's security audit (offline).
workflows: $(STAMP)
	$(BIN)/check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml
	$(BIN)/zizmor --offline --min-severity medium .github/workflows

# The monitoring tests run a real Prometheus and promtool (Debian's package).
prometheus:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || { \
		$(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; }

# Every test and drill (those that need a GPU skip themselves without one), in two rounds: the tests not marked
# `serial` on $(PARALLEL_TESTS) pytest-xdist workers, then the serial ones (tests/conftest.py) one at a time, alone on
# the machine: a drill's node must start within Ray's fixed wait. The second round runs whatever the first's
# outcome; 5 is pytest's "no test selected" (a subset in PYTEST_ADDOPTS).
PARALLEL_TESTS ?= 2
test: lint typecheck docs prometheus $(CHECKOV)
	$(BIN)/python -m pytest -n $(PARALLEL_TESTS) -m "not serial"; parallel=$$?; \
	$(BIN)/python -m pytest -m serial; serial=$$?; \
	for rc in $$parallel $$serial; do [ $$rc = 0 ] || [ $$rc = 5 ] || exit $$rc; done

# Before a commit: every test but the whole training runs, the multi-node drills and the bench commands.
quick: lint typecheck docs prometheus $(CHECKOV)
	$(BIN)/python -m pytest -m "not cluster and not e2e"

# checkov in a virtualenv of its own (its pins are not the project's), run offline by tests/cluster/test_scan.py.
$(CHECKOV): | $(STAMP)
	$(BIN)/uv venv --quiet --python $(PYTHON) .venv-checkov
	$(BIN)/uv pip install --quiet --python .venv-checkov/bin/python checkov==$(CHECKOV_VERSION)

# checkov over every stack's render and spotray's pods; findings outside .ci/checkov-skips.yaml fail.
scan: $(STAMP) $(CHECKOV)
	$(BIN)/python -m pytest tests/cluster/test_scan.py -v

# NCCL DDP/FSDP2 on every GPU, exact resume, bf16 + torch.compile, a Transformers model, and the throughput and
# compile benches (their JSON, with tokens/s, MFU and compile seconds, goes to $(GPU_RESULTS)/ for BENCHMARKS.md).
# Fails where CUDA is missing.
gpu-test: $(STAMP)
	$(BIN)/python -c 'import torch; assert torch.cuda.is_available(), "no CUDA device: nothing to test"'
	SPOTRAY_GPU_RESULTS=$(GPU_RESULTS) $(BIN)/python -m pytest -m gpu tests/gpu -v

# The pipelines' steps (.github/workflows), callable from any CI.
install: $(STAMP)

# What a pull request changes in each stack's offline plan: make plan-diff BASE=<base commit>
plan-diff: $(STAMP)
	.ci/plan-diff $(BASE)

# Every stack's render (spotray render), committed so that a pull request shows what it changes in the cluster.
render: $(STAMP)
	for stack in $(STACKS); do $(BIN)/spotray render --stack $$stack --out $(RENDERED)/$$stack || exit 1; done

# Fails where the committed render is not what the code renders now.
render-check: $(STAMP)
	for stack in $(STACKS); do $(BIN)/spotray render --stack $$stack --out $(RENDERED)/$$stack --check || exit 1; done

# STACK's state backend and whether it has pipeline roles, as key=value lines for $$GITHUB_OUTPUT.
pulumi-env: $(STAMP)
	@$(BIN)/spotray pulumi-env --stack $(STACK)

# STACK's render committed to its environment branch rendered/STACK, which its cluster's GitOps controller follows.
publish-render: $(STAMP)
	.ci/publish-render $(STACK)

# The training image at TAG (the commit SHA) in STACK's ECR repository; prints image=<repo>@sha256:<digest>, the
# digest it pushed, for the pipeline: what runs is exactly what was built, whatever later happens to the tag.
image:
	@test -n "$(STACK)" -a -n "$(TAG)" || { echo "usage: make image STACK=<stack> TAG=<commit sha>" >&2; exit 2; }
	repo=$$(pulumi stack output ecrUrl --stack $(STACK)) && \
	aws ecr get-login-password | docker login --username AWS --password-stdin "$${repo%%/*}" && \
	docker build -f training/Dockerfile -t "$$repo:$(TAG)" . && docker push "$$repo:$(TAG)" && \
	echo "image=$$(docker inspect --format '{{index .RepoDigests 0}}' "$$repo:$(TAG)")" | \
	tee -a "$${GITHUB_OUTPUT:-/dev/null}"

clean:
	rm -rf $(VENV) .venv-checkov spotray-runs .pytest_cache .mypy_cache site
