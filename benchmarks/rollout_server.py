"""Seconds per training step: colocated vLLM vs a rollout server vs a rollout server with async training.

The same tiny model, data, batch and seed train three times through the real CLI (``vlm-grpoma train``):
``rollout.backend=vllm`` (the engine in the trainer's process, rollout and update take turns),
``rollout.backend=vllm_server`` (a ``vlm-grpoma rollout-server`` process this script starts; weights pushed
after every step) and the same with ``train.async_rollout.enabled=true`` (step t+1 sampled while step t
trains). Each arm's first step (engine warm-up) is left out; the median of the rest is reported, with the
rollout and update phases, the async wait and the ratios. On a CPU the server and the trainer share the cores,
so the overlap is bounded by them; on GPUs the server has its own devices and the async step approaches
max(rollout, update) instead of their sum (see the printed prediction).

Then the weight push itself, on the small and the bench preset (the tiny one's 16-wide heads are below what
vLLM's CPU attention serves): bytes and seconds per push to a real server,
full (the merged weights) vs LoRA-only (the adapters, merged by the server onto its base), and the same bytes
computed for the released 3B/7B architectures from their parameter counts (bfloat16). Run it in .venv-vllm::

    .venv-vllm/bin/python benchmarks/rollout_server.py --steps 6
    .venv-vllm/bin/python benchmarks/rollout_server.py --quick   # 3 short steps per arm, pushes on small
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
from vlm_grpoma.config import Config, LoraConfig, ModelConfig, RolloutConfig, RolloutServerConfig  # noqa: E402
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


def measure_pushes(preset: str, workdir: Path, repeats: int, rank: int) -> list[dict]:
    """Bytes and median seconds per push to a real server on ``preset``: full weights, then LoRA-only."""
    from vlm_grpoma.models.loading import load_model, prepare_trainable
    from vlm_grpoma.rollout.server.client import ServerRolloutEngine

    folder = build_tiny_model("qwen2_5_vl", workdir / f"push-{preset}", seed=0, preset=preset)
    server = start_server(folder, workdir / f"push-{preset}.log", "model.lora.enabled=true")
    rows = []
    try:
        for lora in (False, True):
            model_cfg = ModelConfig(
                name_or_path=str(folder),
                dtype="float32",
                lora=LoraConfig(enabled=lora, r=rank, alpha=2 * rank),
            )
            loaded = load_model(model_cfg)
            module = prepare_trainable(loaded.model, model_cfg)
            server_cfg = RolloutServerConfig([server.url], timeout_s=120)
            config = Config(model=model_cfg, rollout=RolloutConfig(backend="vllm_server", server=server_cfg))
            engine = ServerRolloutEngine.create(config, loaded.adapter)
            pushes = []
            for _ in range(repeats):
                engine.update_weights(module)
                pushes.append(engine.last_push)
            rows.append(
                {
                    "preset": preset,
                    "push": f"LoRA r={rank}" if lora else "full",
                    "lean": all(push.lean for push in pushes),
                    "bytes": pushes[-1].nbytes,
                    "seconds": statistics.median(push.seconds for push in pushes),
                }
            )
    finally:
        server.stop()
    return rows


def released_push_bytes(rank: int) -> list[dict]:
    """Full vs LoRA push bytes (bfloat16) of released architectures, from their parameter counts on the meta
    device: LoRA on the default targets, vision tower frozen."""
    from vlm_grpoma.models.architecture import load_architecture, meta_model
    from vlm_grpoma.models.loading import lora_targets

    rows = []
    for name in ("Qwen2.5-VL-3B-Instruct", "Qwen2.5-VL-7B-Instruct"):
        model = meta_model(load_architecture(name).transformers_config())
        modules = dict(model.named_modules())
        adapted = sum(
            rank * (modules[target].in_features + modules[target].out_features)
            for target in lora_targets(model, LoraConfig().target_modules)
        )
        full = sum(p.numel() for p in model.parameters())
        rows.append({"model": name, "full_bytes": 2 * full, "lora_bytes": 2 * adapted})
    return rows


def print_pushes(rows: list[dict], released: list[dict]) -> None:
    print(f"\n{'preset':<8}{'push':<12}{'bytes':>12}{'s/push':>9}{'of full':>9}")
    full = {row["preset"]: row["bytes"] for row in rows if not row["lean"]}
    for row in rows:
        print(
            f"{row['preset']:<8}{row['push']:<12}{row['bytes']:>12,}{row['seconds']:>9.3f}"
            f"{row['bytes'] / full[row['preset']]:>9.1%}"
        )
    for row in released:
        print(
            f"{row['model']:<24} full {row['full_bytes'] / 1e9:.2f} GB, LoRA {row['lora_bytes'] / 1e6:.0f} MB "
            f"({row['lora_bytes'] / row['full_bytes']:.2%}) per push in bfloat16"
        )


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
    parser.add_argument("--push-repeats", type=int, default=5, help="weight pushes timed per preset and mode")
    parser.add_argument("--lora-rank", type=int, default=16, help="LoRA rank of the LoRA-only pushes")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON lines too")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 3 short steps per arm, 2 pushes on the small preset",
    )
    args = parser.parse_args()
    if args.quick:
        args.steps, args.prompts, args.thought_tokens, args.answer_tokens = 3, 1, 8, 4
        args.push_repeats = 2
    push_presets = ("small",) if args.quick else ("small", "bench")
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
    with tempfile.TemporaryDirectory() as tmp:
        pushes = [
            row
            for preset in push_presets
            for row in measure_pushes(preset, Path(tmp), args.push_repeats, args.lora_rank)
        ]
    released = released_push_bytes(args.lora_rank)
    print_pushes(pushes, released)
    if args.json:
        for row in rows + pushes + released:
            print(json.dumps(row))


if __name__ == "__main__":
    main()
