# Two commands matter: `make run` and `make test`. Both set themselves up first.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
VENV ?= .venv
PY := $(VENV)/bin/python
# GPU machines take CUDA vLLM; everything else the CPU build.
DEVICE := $(if $(or $(filter gpu,$(HARNESS_DEVICE)),$(shell command -v nvidia-smi 2>/dev/null)),gpu,cpu)
# The extra installed: the device's, or HARNESS_EXTRA (the GPU nightly takes gpu-full).
EXTRA := $(or $(HARNESS_EXTRA),$(DEVICE))
STAMP := $(VENV)/.installed-$(EXTRA)
PIP_QUIET := 2>&1 | grep -v "^WARNING: Location" || true
RUN_ARGS ?= -s default
PYTEST_ARGS ?=
# Two pytest workers, whole modules each (tests/conftest.py says why and how); TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
PYTEST_WORKERS = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder)
BENCH ?=

.PHONY: setup run test test-build check lint docs docs-check bench browser clean

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@echo "installing refit-harness[$(EXTRA),dev] into $(VENV) (a few minutes the first time)"
	$(PY) -m pip install -q -e ".[$(EXTRA),dev]" 2>&1 | grep -v "^WARNING: Location" ; test $${PIPESTATUS[0]} -eq 0
	@# PyPI's torchvision/torchaudio/torchcodec break imports beside the CPU torch; text models need none.
	@if [ "$(DEVICE)" = cpu ]; then $(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec $(PIP_QUIET); fi
	@touch $@

setup: $(STAMP)

# Headless Chromium checks the HTML report; install Debian's when we can (root + apt).
# Under CI a browser that cannot be installed fails here: a report never rendered is not a pass.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) ; } || \
	  { [ -n "$$CI" ] && { echo "chromium could not be installed, and CI must render the report" >&2; exit 1; } ; } || \
	  echo "chromium not installed: the browser test will be skipped"

run: setup
	$(VENV)/bin/refit-harness run $(RUN_ARGS)

# Lint, format, types (the parent side) and the import contracts (pyproject.toml) first: seconds.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The documentation site, strictly: a broken link fails (NO_MKDOCS_2_WARNING: a banner, not a finding).
docs-check: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# Regenerate the pages made from the code (CLI reference, architecture, README layout), then build.
docs: setup
	$(PY) -m harness.cli.reference
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

test: lint docs-check browser
	$(PY) -m pytest $(PYTEST_WORKERS) $(PYTEST_ARGS)

# The developers' fast loop: lint, contracts and the engine-free tests (no vLLM engine starts).
check: lint
	$(PY) -m pytest tests/unit -q -x $(PYTEST_WORKERS) $(PYTEST_ARGS)

# The version adapter's tests under another vLLM build (a CPU source build of 0.34, a nightly):
# `make test-build BUILD=VENV`. The build's own interpreter runs them, with pytest added to it and
# the harness from this checkout on PYTHONPATH (no conftest: the plugin needs the harness's venv).
BUILD ?=
BUILD_TESTS ?= tests/unit/test_vllm_compat.py tests/unit/test_transfer_contracts.py
test-build: setup
	@test -n "$(BUILD)" || { echo "usage: make test-build BUILD=VENV_DIR (a vLLM build's venv)" >&2; exit 2; }
	$(VENV)/bin/refit-harness preflight --build build=$(BUILD)
	$(BUILD)/bin/python -m pip install -q pytest $(PIP_QUIET)
	PYTHONPATH=$(CURDIR) $(BUILD)/bin/python -m pytest --noconftest -p no:cacheprovider -q $(BUILD_TESTS)

bench: setup
	$(PY) -m benchmarks.run $(BENCH)

clean:
	rm -rf $(VENV) reports/*/ .pytest_cache
