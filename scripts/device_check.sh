#!/usr/bin/env bash
# The one-command GPU check (make device-check): on a bare CUDA machine with a preinstalled torch and no
# network, install the project --no-deps plus the wheels carried in .device-wheels (scripts/fetch_device_wheels.sh
# fetches them here), run the tests marked gpu, then one GRPO-MA step of a random-init Qwen2.5-VL-3B at
# configs/detection/qwen2_5_vl_3b_T4A4.yaml's lengths (peak memory next to plan's estimate) and the same step
# at T16A1 (rollout / update tokens per second), and write every number to one JSON. A missing package, a
# too-old torch or no CUDA device is one line and a non-zero exit.
#
#   bash scripts/device_check.sh [--dry-run]      # results in $OUT (the device tool's folder), else .device-check
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
for arg in "$@"; do
    case $arg in
        --dry-run) DRY=1 ;;
        *) echo "usage: bash scripts/device_check.sh [--dry-run]" >&2; exit 2 ;;
    esac
done
PY=${PYTHON:-python3}
WHEELS=${DEVICE_WHEELS:-.device-wheels}
RESULTS=${OUT:-.device-check}
SITE=${DEVICE_SITE:-/tmp/vlm-grpoma-site}
MIN_TORCH=2.6
MODEL=Qwen2.5-VL-3B-Instruct
# configs/detection/qwen2_5_vl_3b_T4A4.yaml: LoRA r64, checkpointing, ZeRO-2, bf16, thought 256 / answer 64
# tokens, max_pixels 401408 (616 px: 484 image tokens); the hf rollout (vLLM is not carried)
STEP_ARGS=(--model "$MODEL" --lora-r 64 --zero 2 --image 616 --thought-tokens 256 --answer-tokens 64 --prompts 1)
SHAPES=("4 4" "16 1")

wheels=()
for w in "$WHEELS"/*.whl; do
    [ -e "$w" ] && [[ $(basename "$w") != dashscope-* ]] && wheels+=("$w")
done
failed=()
run() {  # print the step; run it unless --dry-run, remembering a failure (the later steps still run)
    echo "+ $*"
    [ "$DRY" = 1 ] || "$@" || failed+=("$(basename "$2") exit $?")
}

echo "device check: results -> $RESULTS"
if [ "${#wheels[@]}" = 0 ]; then
    echo "wheels: none in $WHEELS (run here: bash scripts/fetch_device_wheels.sh 3.12, then carry $WHEELS)"
else
    echo "wheels ($(du -cb "${wheels[@]}" | tail -1 | awk '{printf "%.1f MiB", $1 / 1048576}')):"
    printf '  %s\n' "${wheels[@]##*/}"
fi
if [ "$DRY" = 0 ]; then
    if ! "$PY" -c "import torch" 2>/dev/null; then echo "device check: $PY has no torch" >&2; exit 3; fi
    if ! "$PY" - "$MIN_TORCH" <<'PYEOF'
import sys, torch
need = tuple(int(x) for x in sys.argv[1].split("."))
have = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
if have < need:
    sys.exit(f"device check: torch {torch.__version__} is older than {sys.argv[1]} (the project's floor)")
if not torch.cuda.is_available():
    sys.exit(f"device check: torch {torch.__version__} sees no CUDA device")
PYEOF
    then exit 3; fi
    [ "${#wheels[@]}" = 0 ] && { echo "device check: no wheels in $WHEELS to install" >&2; exit 3; }
    mkdir -p "$RESULTS" "$SITE"
fi
export PYTHONPATH="$SITE:$PWD" VLM_GRPOMA_CACHE=${VLM_GRPOMA_CACHE:-/tmp/vlm-grpoma-cache}
export TORCH_EXTENSIONS_DIR="$VLM_GRPOMA_CACHE/torch_extensions" PYTHONUNBUFFERED=1
run "$PY" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "${wheels[@]}"
run "$PY" -m pip install --quiet --no-index --no-deps --no-build-isolation --no-cache-dir --target "$SITE" .
if [ "$DRY" = 0 ]; then
    mkdir -p "$VLM_GRPOMA_CACHE/wheels" && cp "$WHEELS"/dashscope-*.whl "$VLM_GRPOMA_CACHE/wheels/" 2>/dev/null
    "$PY" - <<'PYEOF' || exit 3
import importlib, sys
for name in ("deepspeed", "qwen_vl_utils", "transformers", "peft", "accelerate", "vlm_grpoma"):
    try:
        importlib.import_module(name)
    except Exception as err:  # one line, whatever broke
        sys.exit(f"device check: cannot import {name}: {type(err).__name__}: {str(err).splitlines()[0]}")
PYEOF
    "$PY" -c "import json, sys, torch, transformers, deepspeed; json.dump({'torch': torch.__version__,
'cuda': torch.version.cuda, 'gpu': torch.cuda.get_device_name(), 'transformers': transformers.__version__,
'deepspeed': deepspeed.__version__, 'python': sys.version.split()[0]}, open('$RESULTS/env.json', 'w'))"
fi
run "$PY" -m pytest -m gpu tests/gpu -q -p no:cacheprovider -o addopts="" --junitxml "$RESULTS/gpu_tests.xml"
for shape in "${SHAPES[@]}"; do
    read -r k m <<<"$shape"
    run "$PY" benchmarks/real_size.py "${STEP_ARGS[@]}" --thoughts "$k" --answers "$m" \
        --json "$RESULTS/step_T${k}A${m}.json"
done
run "$PY" scripts/device_report.py "$RESULTS" "${failed[@]}"
if [ "$DRY" = 1 ]; then echo "dry run: nothing installed or run"; exit 0; fi
[ "${#failed[@]}" = 0 ] || { echo "device check: failed: ${failed[*]}" >&2; exit 1; }
