#!/usr/bin/env bash
# Train under the DeepSpeed launcher: one process per GPU (or per CPU rank) on this node, or across nodes.
#
#   launch/train.sh CONFIG.yaml [key=value ...]     # every GPU of this machine
#   NUM_GPUS=1 launch/train.sh CONFIG               # one GPU
#   CPU_RANKS=2 launch/train.sh CONFIG              # no GPU: 2 CPU ranks (gloo, fp32)
#   HOSTFILE=hostfile launch/train.sh CONFIG        # all nodes, started from the first over passwordless ssh
#   HOSTFILE=hostfile NODE_RANK=i MASTER_PORT=p launch/train.sh CONFIG   # one call on each node, no ssh
#                                                   # (what launch/slurm.sbatch does)
#
# Environment:
#   NUM_GPUS      GPUs per node (default: all visible ones; CUDA_VISIBLE_DEVICES is honoured)
#   CPU_RANKS     ranks on a machine without GPUs (default 1); sets DS_ACCELERATOR=cpu
#   HOSTFILE      DeepSpeed hostfile, "host slots=N" per line (hostfile.example): N ranks on that host, its
#                 GPUs or, where this node has no GPU, CPU ranks (gloo); NUM_NODES: only the first N hosts
#   NODE_RANK     this node's line in HOSTFILE (from 0) when every node runs this script itself (no ssh);
#                 all nodes must then get the same HOSTFILE, MASTER_ADDR and MASTER_PORT
#   MASTER_ADDR   rendezvous host (default: 127.0.0.1 on one node, HOSTFILE's first host with NODE_RANK)
#   MASTER_PORT   rendezvous port (default: a free port on one node, 29500 with NODE_RANK)
#   COMMAND       the vlm-grpoma subcommand to run per rank: train (default) or sft
#   TRAIN_SCRIPT  a Python script to run instead of `python -m vlm_grpoma.cli train` (same arguments; tests)
#   DEEPSPEED     the launcher executable (default: .venv/bin/deepspeed of this checkout, else `deepspeed`)
# The arguments after CONFIG are dotted overrides, e.g. train.steps=10 deepspeed.zero_stage=3.
# `vlm-grpoma launch-scripts --out DIR` writes this script, slurm.sbatch and hostfile.example into DIR.
set -euo pipefail

usage() { sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
    usage
    exit 0
fi
if [[ $# -lt 1 ]]; then
    usage >&2
    exit 2
fi
CONFIG=$1
shift
die() {
    echo "train.sh: $1" >&2
    exit 2
}
[[ -f "$CONFIG" ]] || die "config file $CONFIG not found"

if [[ -z "${DEEPSPEED:-}" ]]; then
    CHECKOUT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    if [[ -x "$CHECKOUT/.venv/bin/deepspeed" ]]; then DEEPSPEED=$CHECKOUT/.venv/bin/deepspeed; else DEEPSPEED=deepspeed; fi
fi
command -v "$DEEPSPEED" > /dev/null || die "the deepspeed launcher ($DEEPSPEED) is not on PATH: activate the environment that has vlm-grpoma installed, or set DEEPSPEED"
PYTHON=$(dirname "$(command -v "$DEEPSPEED")")/python
[[ -x "$PYTHON" ]] || PYTHON=python3

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
GPUS=${NUM_GPUS:-$(count_gpus)}
if [[ "$GPUS" -eq 0 ]]; then
    # No GPU on this node: ranks run on the CPU (gloo); with a hostfile, "slots" is the CPU rank count.
    export DS_ACCELERATOR=${DS_ACCELERATOR:-cpu}
fi

ARGS=(--no_local_rank)
if [[ -n "${HOSTFILE:-}" ]]; then
    [[ -f "$HOSTFILE" ]] || die "HOSTFILE $HOSTFILE not found (copy hostfile.example and list your nodes)"
    ARGS+=(--hostfile "$HOSTFILE")
    [[ -n "${NUM_NODES:-}" ]] && ARGS+=(--num_nodes "$NUM_NODES")
    [[ -n "${NUM_GPUS:-}" ]] && ARGS+=(--num_gpus "$NUM_GPUS")
    if [[ -n "${NODE_RANK:-}" ]]; then
        # Without ssh every node must name the same rendezvous: default to the hostfile's first host.
        FIRST_HOST=$(awk '$1 !~ /^#/ && NF {print $1; exit}' "$HOSTFILE")
        [[ -n "$FIRST_HOST" ]] || die "HOSTFILE $HOSTFILE lists no host"
        MASTER_ADDR=${MASTER_ADDR:-$FIRST_HOST}
        MASTER_PORT=${MASTER_PORT:-29500}
        ARGS+=(--no_ssh --node_rank "$NODE_RANK")
    fi
elif [[ "$GPUS" -gt 0 ]]; then
    ARGS+=(--num_nodes 1 --num_gpus "$GPUS")
else
    # --include localhost:0,1 fails on CPU; --num_accelerators picks the rank count.
    ARGS+=(--num_nodes 1 --num_accelerators "${CPU_RANKS:-1}")
fi
MASTER_PORT=${MASTER_PORT:-$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')}
ARGS+=(--master_port "$MASTER_PORT")
[[ -n "${MASTER_ADDR:-}" ]] && ARGS+=(--master_addr "$MASTER_ADDR")

# SIGUSR1 (Slurm's warning before the time limit) is for the ranks, which finish their step, save and stop;
# the launcher processes ignore it (they would die of it), and each rank installs its own handler.
trap '' USR1
if [[ -n "${TRAIN_SCRIPT:-}" ]]; then
    exec "$DEEPSPEED" "${ARGS[@]}" "$TRAIN_SCRIPT" --config "$CONFIG" "$@"
fi
exec "$DEEPSPEED" "${ARGS[@]}" --module vlm_grpoma.cli "${COMMAND:-train}" --config "$CONFIG" "$@"
