# One-command setup: every target first brings .venv (and the project caches) up to date, idempotently.
PYTHON ?= python3
VENV := .venv
CACHE := $(CURDIR)/.cache
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# JIT-built DeepSpeed ops and other build caches stay inside the project's ignored cache folder.
export TORCH_EXTENSIONS_DIR := $(CACHE)/torch_extensions
export VLM_GRPOMA_CACHE := $(CACHE)
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: demo test lint setup clean

setup: $(STAMP) $(CACHE)/wheels/.dashscope $(CACHE)/mesa/.done

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
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

test: setup lint
	$(BIN)/pytest

demo: setup
	$(BIN)/vlm-grpoma demo

clean:
	rm -rf $(VENV) $(CACHE)
