#!/usr/bin/env bash
# Train under the DeepSpeed launcher: one process per GPU (or per CPU rank) on this node, or across nodes.
#
#   launch/train.sh CONFIG.yaml [key=value ...]     # every GPU of this machine
#   NUM_GPUS=1 launch/train.sh CONFIG               # one GPU
#   CPU_RANKS=2 launch/train.sh CONFIG              # no GPU: 2 CPU ranks (gloo, fp32)
#   HOSTFILE=hostfile launch/train.sh CONFIG        # all nodes, started from the first over passwordless ssh
#   HOSTFILE=hostfile NODE_RANK=i MASTER_PORT=p launch/train.sh CONFIG   # one call on each node, no ssh
#                                                   # (what launch/slurm.sbatch does)
#   ROLLOUT_SERVERS=2 launch/train.sh CONFIG        # GPUs 0-1 serve rollouts (one vLLM server each),
#                                                   # the other GPUs train through them (vllm_server)
#   ROLLOUT_SERVERS=1 CPU_RANKS=2 launch/train.sh CONFIG   # no GPU: 1 server process, 2 CPU trainer ranks
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
#   ROLLOUT_SERVERS  serve-and-train layout on this node: start this many `vlm-grpoma rollout-server`s
#                 (the first GPUs, one each; on CPU, processes) with CONFIG and the overrides, wait for them,
#                 train on the rest with rollout.backend=vllm_server and their URLs, stop them at the end
#   ROLLOUT_PORT  first server's port (default 8400; server i listens on ROLLOUT_PORT + i)
#   ROLLOUT_WAIT_S  seconds to wait for the servers to answer (default 900); ROLLOUT_LOG_DIR their logs
#                 (default ./rollout-servers)
#   ROLLOUT_SERVE_ONLY=1  only serve (ROLLOUT_SERVERS, default one per GPU, on ROLLOUT_HOST, default
#                 127.0.0.1) until stopped: slurm.sbatch's serving nodes; ROLLOUT_URLS: the run's server list
# The arguments after CONFIG are dotted overrides, e.g. train.steps=10 deepspeed.zero_stage=3.
# `vlm-grpoma launch-scripts --out DIR` writes this script, slurm.sbatch and hostfile.example into DIR.
set -euo pipefail

usage() { sed -n '2,35p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
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
# Numbers only: bash evaluates a variable inside [[ -gt ]] or $(( )) as an expression, so a value such as
# 'a[$(command)]' would run the command.
for name in NUM_GPUS CPU_RANKS NUM_NODES NODE_RANK MASTER_PORT ROLLOUT_SERVERS ROLLOUT_PORT ROLLOUT_WAIT_S; do
    value=${!name-}
    [[ -z "$value" || "$value" =~ ^[0-9]+$ ]] || die "$name must be a whole number, got '$value'"
done
# Over ssh (a hostfile without NODE_RANK) DeepSpeed hands the overrides to a remote shell as text: refuse the
# characters that shell would run or redirect instead of passing on.
if [[ -n "${HOSTFILE:-}" && -z "${NODE_RANK:-}" ]]; then
    for arg in "$@"; do
        [[ "$arg" != *[\$\`\\\;\&\|\<\>\(\)\"]* && "$arg" != *$'\n'* ]] \
            || die "override $(printf '%q' "$arg") holds a shell character (\$ \` \\ ; & | < > ( ) \" or a newline) that the ssh launch would run remotely; put the value in the config file"
    done
fi

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

SERVERS=${ROLLOUT_SERVERS:-0}
if [[ "${ROLLOUT_SERVE_ONLY:-0}" == 1 ]]; then  # every GPU serves (one server on a CPU node)
    SERVERS=${ROLLOUT_SERVERS:-$((GPUS > 0 ? GPUS : 1))}
    [[ "$SERVERS" -gt 0 ]] || die "ROLLOUT_SERVE_ONLY=1 needs ROLLOUT_SERVERS >= 1"
fi
[[ "$SERVERS" =~ ^[0-9]+$ ]] || die "ROLLOUT_SERVERS must be a number of servers, got '$SERVERS'"
if [[ "${ROLLOUT_SERVE_ONLY:-0}" != 1 && "$SERVERS" -gt 0 && -n "${HOSTFILE:-}" ]]; then
    die "ROLLOUT_SERVERS serves from this node only; across nodes use launch/slurm.sbatch with ROLLOUT_NODES, or start \`vlm-grpoma rollout-server\` on the serving nodes and set rollout.server.urls"
fi
if [[ "${ROLLOUT_SERVE_ONLY:-0}" != 1 && "$SERVERS" -gt 0 && "$GPUS" -gt 0 && "$GPUS" -le "$SERVERS" ]]; then
    die "ROLLOUT_SERVERS=$SERVERS leaves none of this node's $GPUS GPU(s) to train on"
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
elif [[ "$GPUS" -gt 0 && "$SERVERS" -gt 0 ]]; then
    ARGS+=(--include "localhost:$(seq -s, "$SERVERS" $((GPUS - 1)))")  # the GPUs after the servers' ones
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
    RANK_COMMAND=("$TRAIN_SCRIPT" --config "$CONFIG" "$@")
else
    RANK_COMMAND=(--module vlm_grpoma.cli "${COMMAND:-train}" --config "$CONFIG" "$@")
fi
if [[ "$SERVERS" -eq 0 ]]; then
    exec "$DEEPSPEED" "${ARGS[@]}" "${RANK_COMMAND[@]}"
fi

# Serve-and-train: the servers first (the run's config and overrides: the same model, pixels and engine
# options), each answering /health before any rank starts; stopped however the training ends, and by
# themselves (--stop-with) if this script is killed with SIGKILL. Serve-only (ROLLOUT_SERVE_ONLY=1): the
# servers alone, until one ends or the script is stopped.
LOGS=${ROLLOUT_LOG_DIR:-rollout-servers}
mkdir -p "$LOGS"
PORT0=${ROLLOUT_PORT:-8400}
URLS=()
LOCAL=()
for ((i = 0; i < SERVERS; i++)); do
    URLS+=("\"http://127.0.0.1:$((PORT0 + i))\"")
    LOCAL+=("http://127.0.0.1:$((PORT0 + i))")
done
LAYOUT=(rollout.backend=vllm_server "rollout.server.urls=${ROLLOUT_URLS:-[$(IFS=,; echo "${URLS[*]}")]}")
SERVER_PIDS=()
stop_servers() {
    [[ ${#SERVER_PIDS[@]} -gt 0 ]] || return 0
    kill "${SERVER_PIDS[@]}" 2> /dev/null || true
    wait "${SERVER_PIDS[@]}" 2> /dev/null || true
}
trap stop_servers EXIT
WATCH=()
for ((i = 0; i < SERVERS; i++)); do
    if [[ "$GPUS" -gt 0 ]]; then DEVICE=(env CUDA_VISIBLE_DEVICES="$i"); else DEVICE=(env); fi
    "${DEVICE[@]}" "$PYTHON" -m vlm_grpoma.cli rollout-server --config "$CONFIG" --host "${ROLLOUT_HOST:-127.0.0.1}" \
        --port $((PORT0 + i)) --stop-with $$ "$@" "${LAYOUT[@]}" > "$LOGS/server-$i.log" 2>&1 &
    SERVER_PIDS+=($!)
    WATCH+=(--watch "$!=$LOGS/server-$i.log")
done
"$PYTHON" -m vlm_grpoma.rollout.server.readiness --prefix "train.sh: " --timeout-s "${ROLLOUT_WAIT_S:-900}" \
    "${WATCH[@]}" "${LOCAL[@]}" || exit 2
if [[ "${ROLLOUT_SERVE_ONLY:-0}" == 1 ]]; then
    echo "train.sh: ${SERVERS} rollout server(s) serving on $(hostname) ports $PORT0.. (logs in $LOGS)"
    trap 'exit 0' TERM INT  # stopped by the job: the EXIT trap stops the servers
    STATUS=0
    wait -n "${SERVER_PIDS[@]}" || STATUS=$?
    echo "train.sh: a rollout server on $(hostname) exited ($STATUS); see $LOGS" >&2
    exit 1
fi
echo "train.sh: ${SERVERS} rollout server(s) ready (logs in $LOGS), training through them"
STATUS=0
"$DEEPSPEED" "${ARGS[@]}" "${RANK_COMMAND[@]}" "${LAYOUT[@]}" &
TRAIN_PID=$!
trap 'kill -TERM "$TRAIN_PID" 2> /dev/null' TERM INT
while true; do
    wait "$TRAIN_PID" && STATUS=0 || STATUS=$?
    kill -0 "$TRAIN_PID" 2> /dev/null || break  # a trapped signal interrupted the wait: keep waiting
done
exit "$STATUS"
