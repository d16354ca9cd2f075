"""``vlm-grpoma demo`` (the default task): GRPO-MA raising SAPIEN manipulation success of a tiny Qwen2.5-VL,
on CPU, in minutes.

Stages: the tiny model and SAPIEN records (``vlm-grpoma make-data``, two processes: training instances, then
held-out ``seen`` instances of the training categories and ``unseen`` categories); a greedy evaluation of the
untrained model on both held-out sets; the SFT warm start; its evaluation; GRPO-MA (T4A4, the run config
``vlm_grpoma/configs/demo_manipulation.yaml``) with held-out evaluation every ``eval_every`` steps; the final
evaluation; then a table, a paired before/after comparison, a plot and a grid of contacts. Success is the
``manipulation`` reward: the answer executed in SAPIEN opened the target part. Data and the warm start are
cached under ``<out>/cache``, keyed by what produced them (:mod:`vlm_grpoma.demo.cache`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path

import torch
from tqdm.auto import tqdm

from vlm_grpoma import __version__
from vlm_grpoma.config import Config, load_config
from vlm_grpoma.datasets.jsonl import read_records
from vlm_grpoma.demo.cache import CacheEntry, source_digest
from vlm_grpoma.demo.heldout import evaluate_checkpoint
from vlm_grpoma.demo.report import (
    StageResult,
    change_lines,
    changes,
    contact_grid_png,
    parse_failure_lines,
    plot_training,
    stage_table,
)
from vlm_grpoma.demo.stages import (
    MODEL_ARCH,
    MODEL_PRESET,
    StageClock,
    demo_config,
    mean_step_seconds,
    quiet_library_bars,
    read_metrics,
)
from vlm_grpoma.envs.sapien.vulkan import configure_icd
from vlm_grpoma.errors import CommandError
from vlm_grpoma.models.tiny import build_tiny_model
from vlm_grpoma.rewards.registry import build_rewards
from vlm_grpoma.run_layout import METRICS_FILE, MODEL_DIR, checkpoint_name, checkpoint_root
from vlm_grpoma.trainer.grpo_ma import GRPOMATrainer
from vlm_grpoma.trainer.sft import SFTTrainer

HELD_OUT = ("seen", "unseen")
SUCCESS = "manipulation/success"
SFT_LEARNING_RATE = 2e-3
SFT_WARMUP_STEPS = 50
DATA_CODE = ("answers.py", "cli.py", "datasets", "envs")  # what make-data runs
DATA_PROCESSES = 2


@dataclass(frozen=True)
class ManipulationPlan:
    """Sizes of the demo (those of the GRPO vs GRPO-MA comparison); :meth:`quick` is a smoke test."""

    train_records: int = 1500
    eval_records: int = 64  # per held-out set
    sft_steps: int = 300
    sft_prompts: int = 16
    grpo_steps: int = 60
    grpo_prompts: int | None = None  # prompts per GRPO-MA step; None: the run config's
    eval_every: int = 20
    grid_episodes: int = 6  # per held-out set, before and after

    @classmethod
    def quick(cls) -> ManipulationPlan:
        return cls(
            train_records=16,
            eval_records=6,
            sft_steps=3,
            sft_prompts=8,
            grpo_steps=2,
            grpo_prompts=2,
            eval_every=1,
            grid_episodes=2,
        )


@dataclass(frozen=True)
class ManipulationDemo:
    """What a run produced: the table rows (untrained, after SFT, after GRPO-MA), its files and which cache
    entries it reused."""

    stages: list[StageResult]
    files: dict[str, Path]
    reused: dict[str, float | None]  # cache entry -> seconds it took to build, None when built by this run


def _renderer() -> str:
    """The Vulkan driver that renders the images (its version changes pixels)."""
    icd = configure_icd() or "none"
    stamp = Path(icd).parent / "VERSION"
    return f"lavapipe {stamp.read_text().strip()}" if stamp.is_file() else icd


def data_entry(root: Path, plan: ManipulationPlan, seed: int) -> CacheEntry:
    return CacheEntry(
        root,
        "data",
        {
            "train_records": plan.train_records,
            "eval_records": plan.eval_records,
            "seed": seed,
            "code": source_digest(DATA_CODE),
            "versions": {name: version(name) for name in ("sapien", "numpy", "pillow")},
            "renderer": _renderer(),
        },
    )


def warm_start_entry(root: Path, plan: ManipulationPlan, seed: int, data: CacheEntry) -> CacheEntry:
    return CacheEntry(
        root,
        "warm-start",
        {
            "data": data.key,
            "model": {"arch": MODEL_ARCH, "preset": MODEL_PRESET, "seed": seed},
            "steps": plan.sft_steps,
            "prompts_per_step": plan.sft_prompts,
            "learning_rate": SFT_LEARNING_RATE,
            "warmup_steps": SFT_WARMUP_STEPS,
            "seed": seed,
            "code": source_digest(["."]),
            "versions": {
                name: version(name) for name in ("torch", "transformers", "deepspeed", "tokenizers")
            },
            "package": __version__,
        },
    )


def _records_path(data_dir: Path, split: str) -> Path:
    return data_dir / split / "records.jsonl"


def _count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def render_data(data_dir: Path, plan: ManipulationPlan, seed: int) -> None:
    """Write the training and held-out records with ``vlm-grpoma make-data``, two processes at a time."""
    jobs = [("train", plan.train_records, seed)] + [(s, plan.eval_records, seed + 1) for s in HELD_OUT]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    pending, running = list(jobs), {}
    try:
        with tqdm(total=sum(n for _, n, _ in jobs), desc="render SAPIEN records", unit="record") as bar:
            while pending or running:
                while pending and len(running) < DATA_PROCESSES:
                    split, n, split_seed = pending.pop(0)
                    args = ["make-data", "--task", "manipulation", "--source", "sapien", "--n", str(n)]
                    args += ["--seed", str(split_seed), "--split", split, "--out", str(data_dir / split)]
                    tqdm.write("  vlm-grpoma " + " ".join(args))
                    log = data_dir / f"{split}.log"
                    with log.open("w") as handle:
                        process = subprocess.Popen(
                            [sys.executable, "-m", "vlm_grpoma.cli", *args],
                            stdout=handle,
                            stderr=subprocess.STDOUT,
                            env=env,
                        )
                    running[split] = (process, log)
                time.sleep(0.5)
                for split, (process, log) in list(running.items()):
                    if process.poll() is None:
                        continue
                    del running[split]
                    if process.returncode:
                        tail = log.read_text(errors="replace").strip().splitlines()[-1:]
                        raise CommandError(
                            f"make-data --split {split} failed (exit {process.returncode}): "
                            f"{tail[0] if tail else 'no output'} (log: {log})"
                        )
                bar.n = sum(_count_lines(_records_path(data_dir, split)) for split, _, _ in jobs)
                bar.refresh()
    finally:
        for process, _ in running.values():
            process.kill()
            process.wait()


def _held_out_sets(data_dir: Path) -> dict[str, list]:
    return {name: read_records(_records_path(data_dir, name)) for name in HELD_OUT}


def run_manipulation_demo(out: Path, plan: ManipulationPlan, seed: int = 0) -> ManipulationDemo:
    """Run every stage (reusing cached data and warm start when their keys match) and print the report."""
    quiet_library_bars()
    # the simulator worker has the other core; one thread is fastest for 0.8 M params
    torch.set_num_threads(1)
    out = Path(out)
    clock = StageClock(stages=7)
    cache = out / "cache"
    data = data_entry(cache, plan, seed)
    warm = warm_start_entry(cache, plan, seed, data)
    reused = {"data": data.built_seconds(), "warm start": warm.built_seconds()}

    with clock.stage(
        "model and data",
        f"tiny Qwen2.5-VL ({MODEL_PRESET}); SAPIEN records: {plan.train_records} train, "
        f"{plan.eval_records} seen, {plan.eval_records} unseen",
    ):
        model_dir = build_tiny_model(MODEL_ARCH, out / "model", seed=seed, preset=MODEL_PRESET)
        if reused["data"] is None:
            started = time.perf_counter()
            render_data(data.start(), plan, seed)
            data.finish(time.perf_counter() - started)
        else:
            clock.notes["model and data"] = f"data reused from {data.path}"
            print(f"  reusing {data.path} (rendered in {reused['data']:.0f} s)")
    sets = _held_out_sets(data.path)
    eval_sets = json.dumps({name: str(_records_path(data.path, name)) for name in HELD_OUT})

    def config(*overrides: str) -> Config:
        common = [f"data.train_path={_records_path(data.path, 'train')}", f"data.eval_sets={eval_sets}"]
        return load_config(demo_config("manipulation"), [*common, f"seed={seed}", *overrides])

    grpo_dir = out / "grpo"
    shutil.rmtree(grpo_dir, ignore_errors=True)  # metrics.jsonl appends and checkpoints would resume
    warm_dir = checkpoint_root(warm.path) / checkpoint_name(plan.sft_steps) / MODEL_DIR
    grpo_config = config(
        f"model.name_or_path={warm_dir}",
        f"train.steps={plan.grpo_steps}",
        f"train.eval_every={plan.eval_every}",
        f"logging.output_dir={grpo_dir}",
        *(
            [f"train.prompts_per_step={plan.grpo_prompts}", f"train.micro_batch_prompts={plan.grpo_prompts}"]
            if plan.grpo_prompts
            else []
        ),
    )
    rewards = build_rewards(grpo_config.rewards.weights, grpo_config.rewards.options)
    try:

        def evaluate(model: Path, name: str, seconds_per_step: float | None) -> StageResult:
            sets_result = evaluate_checkpoint(grpo_config, model, sets, rewards, SUCCESS, name)
            return StageResult(name, sets_result, seconds_per_step)

        with clock.stage("evaluate untrained", "greedy answers on the held-out sets, executed in SAPIEN"):
            stages = [evaluate(model_dir, "untrained", None)]

        with clock.stage(
            "SFT warm start", f"{plan.sft_steps} steps of {plan.sft_prompts} prompts on ground-truth contacts"
        ):
            if reused["warm start"] is None:
                started = time.perf_counter()
                sft_config = config(
                    f"model.name_or_path={model_dir}",
                    f"train.steps={plan.sft_steps}",
                    f"train.prompts_per_step={plan.sft_prompts}",
                    f"train.micro_batch_prompts={plan.sft_prompts}",
                    f"optim.learning_rate={SFT_LEARNING_RATE}",
                    f"optim.warmup_steps={SFT_WARMUP_STEPS}",
                    f"logging.output_dir={warm.start()}",
                )
                sft = SFTTrainer(sft_config)
                sft.train()
                sft.engine.close()
                warm.finish(time.perf_counter() - started)
            else:
                clock.notes["SFT warm start"] = f"reused from {warm.path}"
                print(f"  reusing {warm.path} (trained in {reused['warm start']:.0f} s)")
        sft_metrics = read_metrics(warm.path)

        with clock.stage("evaluate SFT", "greedy answers of the warm start"):
            stages.append(evaluate(warm_dir, "after SFT", mean_step_seconds(sft_metrics)))

        with clock.stage(
            "GRPO-MA",
            f"{plan.grpo_steps} steps of {grpo_config.train.prompts_per_step} prompts x "
            f"{grpo_config.rollout.num_thoughts} thoughts x {grpo_config.rollout.answers_per_thought} answers, "
            f"held-out evaluation every {plan.eval_every} steps",
        ):
            trainer = GRPOMATrainer(grpo_config)
            trainer.train()
            trainer.engine.close()
        grpo_metrics = read_metrics(grpo_dir)

        with clock.stage("evaluate GRPO-MA", "greedy answers of the final model"):
            stages.append(evaluate(trainer.final_model_dir, "after GRPO-MA", mean_step_seconds(grpo_metrics)))
    finally:
        rewards.close()

    with clock.stage("report", "table, plot, contact grid"):
        files = {
            "plot": plot_training(sft_metrics, grpo_metrics, HELD_OUT, out / "training.png"),
            "contacts": contact_grid_png(stages[1], stages[2], plan.grid_episodes, out / "contacts.png"),
            "metrics": grpo_dir / METRICS_FILE,
            "model": trainer.final_model_dir,
            "summary": out / "summary.json",
        }
    demo = ManipulationDemo(stages, files, reused)
    _print_report(demo, plan, clock)
    _write_summary(demo, plan, seed, clock)
    return demo


def _print_report(demo: ManipulationDemo, plan: ManipulationPlan, clock: StageClock) -> None:
    print(
        "\nHeld-out greedy success in SAPIEN (seen: new instances of the 6 training categories; unseen: "
        "4 categories never trained on), 95 % Wilson intervals:"
    )
    print(stage_table(demo.stages))
    for line in parse_failure_lines(demo.stages):
        print(line)
    print()
    print(change_lines(demo.stages[1], demo.stages[2]))
    files = demo.files
    print(
        f"\nplot: {files['plot']}\ncontacts: {files['contacts']} (first {plan.grid_episodes} episodes of each "
        f"set, after SFT and after GRPO-MA)\nmetrics: {files['metrics']}\nmodel: {files['model']}\n"
        f"summary: {files['summary']}"
    )
    for name, seconds in demo.reused.items():
        state = "built by this run" if seconds is None else f"reused (built earlier in {seconds:.0f} s)"
        print(f"cache, {name}: {state}")
    print(clock.summary())


def _write_summary(demo: ManipulationDemo, plan: ManipulationPlan, seed: int, clock: StageClock) -> None:
    """Everything the report shows, as JSON (numbers a script can compare between runs)."""
    summary = {
        "plan": asdict(plan),
        "seed": seed,
        "stages": {
            stage.name: {
                "seconds_per_step": stage.seconds_per_step,
                **{
                    name: {
                        "successes": result.rate.successes,
                        "episodes": result.rate.trials,
                        "success_rate": result.rate.value,
                        "wilson95": [result.rate.low, result.rate.high],
                        "parsed": result.parsed,
                        "parse_failures": result.parse_failures(),
                    }
                    for name, result in stage.sets.items()
                },
            }
            for stage in demo.stages
        },
        "grpo_ma_minus_sft": {
            name: {
                "difference": change.difference,
                "newcombe95": [change.low, change.high],
                "gained": change.gained,
                "lost": change.lost,
                "mcnemar_p": change.p_value,
            }
            for name, change in changes(demo.stages[1], demo.stages[2]).items()
        },
        "cache_built_seconds": demo.reused,
        "wall_seconds": {**clock.seconds, "total": clock.total},
        "load_average_at_start": clock.load_at_start,
        "files": {name: str(path) for name, path in demo.files.items()},
    }
    demo.files["summary"].write_text(json.dumps(summary, indent=2))
