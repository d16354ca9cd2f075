#!/usr/bin/env bash
# Train under the DeepSpeed launcher: one process per GPU (or per CPU rank) on this node, or across nodes.
#
#   launch/train.sh CONFIG.yaml [key=value ...]        # every GPU of this machine
#   NUM_GPUS=1 launch/train.sh vlm_grpoma/configs/demo_manipulation.yaml     # one GPU
#   CPU_RANKS=2 launch/train.sh vlm_grpoma/configs/demo_manipulation.yaml    # no GPU: 2 CPU ranks (gloo, fp32)
#   HOSTFILE=launch/hostfile launch/train.sh CFG       # several nodes over passwordless ssh (pdsh)
#   HOSTFILE=... NODE_RANK=i MASTER_ADDR=host0 launch/train.sh CFG   # one call per node, no ssh (launch/slurm.sbatch)
#
# Environment:
#   NUM_GPUS      GPUs per node (default: all visible ones; CUDA_VISIBLE_DEVICES is honoured)
#   CPU_RANKS     ranks on a machine without GPUs (default 1); sets DS_ACCELERATOR=cpu
#   HOSTFILE      DeepSpeed hostfile ("host slots=N" per line, see launch/hostfile.example); NUM_NODES: first N hosts
#   NODE_RANK     this node's index in HOSTFILE when every node runs this script itself (no ssh)
#   MASTER_ADDR   rendezvous host (default: DeepSpeed's choice, the first host); MASTER_PORT (default: a free port)
#   COMMAND       the vlm-grpoma subcommand to run per rank: train (default) or sft
#   TRAIN_SCRIPT  a Python script to run instead of `python -m vlm_grpoma.cli train` (same arguments; tests)
#   DEEPSPEED     the launcher executable (default: <repo>/.venv/bin/deepspeed if present, else `deepspeed`)
# The arguments after CONFIG are dotted overrides, e.g. train.steps=10 deepspeed.zero_stage=3.
set -euo pipefail

if [[ $# -lt 1 || "$1" == -h || "$1" == --help ]]; then
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
CONFIG=$1
shift
if [[ ! -f "$CONFIG" ]]; then
    echo "launch/train.sh: config file $CONFIG not found" >&2
    exit 2
fi

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$REPO/.cache/torch_extensions}
if [[ -z "${DEEPSPEED:-}" ]]; then
    if [[ -x "$REPO/.venv/bin/deepspeed" ]]; then DEEPSPEED=$REPO/.venv/bin/deepspeed; else DEEPSPEED=deepspeed; fi
fi
PYTHON=$(dirname "$(command -v "$DEEPSPEED")")/python
[[ -x "$PYTHON" ]] || PYTHON=python3
MASTER_PORT=${MASTER_PORT:-$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')}

count_gpus() {
    if [[ -n "${CUDA_VISIBLE_DEVICES+x}" ]]; then
        [[ -z "$CUDA_VISIBLE_DEVICES" ]] && { echo 0; return; }
        awk -F, '{print NF}' <<< "$CUDA_VISIBLE_DEVICES"
    elif command -v nvidia-smi > /dev/null 2>&1; then
        nvidia-smi -L 2> /dev/null | grep -c '^GPU' || true
    else
        echo 0
    fi
}

ARGS=(--master_port "$MASTER_PORT" --no_local_rank)
[[ -n "${MASTER_ADDR:-}" ]] && ARGS+=(--master_addr "$MASTER_ADDR")
if [[ -n "${HOSTFILE:-}" ]]; then
    ARGS+=(--hostfile "$HOSTFILE")
    [[ -n "${NUM_NODES:-}" ]] && ARGS+=(--num_nodes "$NUM_NODES")
    [[ -n "${NUM_GPUS:-}" ]] && ARGS+=(--num_gpus "$NUM_GPUS")
    [[ -n "${NODE_RANK:-}" ]] && ARGS+=(--no_ssh --node_rank "$NODE_RANK")
else
    GPUS=${NUM_GPUS:-$(count_gpus)}
    if [[ "$GPUS" -gt 0 ]]; then
        ARGS+=(--num_nodes 1 --num_gpus "$GPUS")
    else
        # --include localhost:0,1 fails on CPU; --num_accelerators picks the rank count.
        export DS_ACCELERATOR=cpu
        ARGS+=(--num_nodes 1 --num_accelerators "${CPU_RANKS:-1}")
    fi
fi

if [[ -n "${TRAIN_SCRIPT:-}" ]]; then
    exec "$DEEPSPEED" "${ARGS[@]}" "$TRAIN_SCRIPT" --config "$CONFIG" "$@"
fi
exec "$DEEPSPEED" "${ARGS[@]}" --module vlm_grpoma.cli "${COMMAND:-train}" --config "$CONFIG" "$@"
