#!/usr/bin/env bash
# Wheels a bare CUDA machine (a preinstalled torch, no network) lacks for scripts/device_check.sh, fetched here
# into an ignored folder that travels with the working tree (<= 64 MiB in all). Versions are this venv's, so
# the device runs what the CPU tests ran; DeepSpeed ships only an sdist, so it is built here (pure Python, no
# ops: they JIT-build on the device). The dashscope wheel carries Qwen's BPE ranks for the real tokenizer.
#
#   bash scripts/fetch_device_wheels.sh [PYTHON_VERSION (3.12)] [DEST (.device-wheels)]
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER=${1:-3.12}
DEST=${2:-.device-wheels}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
# What the device image lacks (its package list: /work/.library/device/KINDS.md; it has torch, peft,
# accelerate, tokenizers, huggingface-hub, safetensors, tiktoken, pytest, ...). transformers travels too:
# the image's 5.17 predates APIs the adapter uses.
PACKAGES=(transformers qwen-vl-utils hjson pydantic pydantic-core annotated-types typing-inspection)
version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
mkdir -p "$DEST"
platforms=()
for n in 17 27 28 31 34; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
for name in "${PACKAGES[@]}"; do
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
        "${platforms[@]}" --platform manylinux2014_x86_64 -d "$DEST" "$name==$(version "$name")"
done
"$PY" -m pip wheel --quiet --no-deps --no-build-isolation -w "$DEST" "deepspeed==$(version deepspeed)"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: -d "$DEST" dashscope==2.0.2
ls -l "$DEST"
du -cb "$DEST"/*.whl | tail -1 | awk '{printf "total %.1f MiB in %s\n", $1 / 1048576, "'"$DEST"'"}'
