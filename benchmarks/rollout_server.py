"""Seconds per training step: colocated vLLM vs a rollout server vs a rollout server with async training.

The same tiny model, data, batch and seed train three times through the real CLI (``vlm-grpoma train``):
``rollout.backend=vllm`` (the engine in the trainer's process, rollout and update take turns),
``rollout.backend=vllm_server`` (a ``vlm-grpoma rollout-server`` process this script starts; weights pushed
after every step) and the same with ``train.async_rollout.enabled=true`` (step t+1 sampled while step t
trains). Each arm's first step (engine warm-up) is left out; the median of the rest is reported, with the
rollout and update phases, the async wait and the ratios. On a CPU the server and the trainer share the cores,
so the overlap is bounded by them; on GPUs the server has its own devices and the async step approaches
max(rollout, update) instead of their sum (see the printed prediction). Run it in .venv-vllm::

    .venv-vllm/bin/python benchmarks/rollout_server.py --steps 6
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.rollout.server_process import TEST_ENGINE, start_server  # noqa: E402
from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes  # noqa: E402
from vlm_grpoma.models.tiny import build_tiny_model  # noqa: E402

ARMS = {
    "colocated": ["rollout.backend=vllm"],
    "server": ["rollout.backend=vllm_server"],
    "server+async": ["rollout.backend=vllm_server", "train.async_rollout.enabled=true"],
}


def run_arm(name: str, extra: list[str], args: argparse.Namespace, workdir: Path, common: list[str]) -> dict:
    """Train one arm; the medians of its steps after the first."""
    output = workdir / name.replace("+", "-")
    config = workdir / "run.yaml"
    config.write_text("seed: 0\n")  # everything else is in the overrides, the same for every arm
    command = [sys.executable, "-m", "vlm_grpoma.cli", "train", "--config", str(config), *common, *extra]
    command += [f"logging.output_dir={output}"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout_s)
    if run.returncode:
        raise SystemExit(f"{name}: training failed:\n{run.stderr[-3000:]}")
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()][1:]

    def median(key: str) -> float:
        return statistics.median(r.get(key, 0.0) for r in rows)

    return {
        "arm": name,
        "step_s": median("time/step_s"),
        "rollout_wait_s": median("time/rollout_s"),
        "update_s": median("time/update_s"),
        "async_wait_s": median("async/wait_s"),
        "staleness": median("async/staleness"),
        "steps_timed": len(rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--steps", type=int, default=6, help="training steps per arm (the first is not timed)"
    )
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument("--thought-tokens", type=int, default=32)
    parser.add_argument("--answer-tokens", type=int, default=16)
    parser.add_argument("--preset", default="small", help="tiny-model preset (vlm_grpoma.models.tiny)")
    parser.add_argument("--timeout-s", type=float, default=1800)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON lines too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        model = build_tiny_model("qwen2_5_vl", workdir / "model", seed=0, preset=args.preset)
        data = generate_shapes("detection", 16, workdir / "data", seed=0, config=EASY)
        server = start_server(model, workdir / "server.log", "model.max_pixels=12544")
        try:
            common = [
                f"model.name_or_path={model}",
                "model.dtype=float32",
                "model.max_pixels=12544",
                "model.prompt_style=compact",
                f"data.train_path={data}",
                "rollout.num_thoughts=4",
                "rollout.answers_per_thought=4",
                f"rollout.max_thought_tokens={args.thought_tokens}",
                f"rollout.max_answer_tokens={args.answer_tokens}",
                f'rollout.server.urls=["{server.url}"]',
                *(option for option in TEST_ENGINE if option.startswith("rollout.vllm")),
                "algorithm.kl_beta=0",
                f"train.steps={args.steps}",
                f"train.prompts_per_step={args.prompts}",
                "deepspeed.zero_stage=0",
                "logging.progress_bar=false",
                "logging.samples_every=0",
                "checkpoint.save_every=0",
            ]
            rows = [run_arm(name, extra, args, workdir, common) for name, extra in ARMS.items()]
        finally:
            server.stop()
    print(f"{'arm':<14}{'s/step':>9}{'rollout wait':>14}{'update':>9}{'async wait':>12}{'staleness':>11}")
    for row in rows:
        print(
            f"{row['arm']:<14}{row['step_s']:>9.2f}{row['rollout_wait_s']:>14.2f}{row['update_s']:>9.2f}"
            f"{row['async_wait_s']:>12.2f}{row['staleness']:>11.0f}"
        )
    colocated, served, overlapped = (row["step_s"] for row in rows)
    print(f"server / colocated: {served / colocated:.2f}x the time per step")
    print(f"server+async / server: {overlapped / served:.2f}x the time per step")
    rollout, update = rows[1]["rollout_wait_s"], rows[1]["update_s"]
    print(
        f"prediction with the server on its own devices: async step ~ max(rollout {rollout:.2f}, update "
        f"{update:.2f}) + push = {max(rollout, update) / max(rollout + update, 1e-9):.2f}x the sync step's "
        "rollout + update"
    )
    if args.json:
        for row in rows:
            print(json.dumps(row))


if __name__ == "__main__":
    main()
