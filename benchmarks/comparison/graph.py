"""The comparison's commands: tiny model and data, one SFT warm start per task, then every (task, arm, seed)
(and, for relational tasks, whether the warm start's answers follow its thought)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from comparison.jobs import Job
from comparison.plan import Arm, ComparePlan, TaskSetup
from vlm_grpoma.run_layout import checkpoint_name, checkpoint_root

MODEL_ARCH = "qwen2_5_vl"
MODEL_PRESET = "small"
DATA_SEED = 0  # training records; held-out sets use DATA_SEED + 1 (and, for SAPIEN, held-out instances)
SFT_THREADS = 64  # a warm start has nothing to run beside it: it takes every core the runner has


@dataclass(frozen=True)
class Layout:
    """Where everything of one comparison lives under ``root``."""

    root: Path

    @property
    def model(self) -> Path:
        return self.root / "model"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def data(self, task: TaskSetup, split: str) -> Path:
        return self.root / "data" / task.name / split

    def records(self, task: TaskSetup, split: str) -> Path:
        return self.data(task, split) / "records.jsonl"

    def sft(self, task: TaskSetup) -> Path:
        return self.root / task.name / "sft"

    def warm_start(self, task: TaskSetup) -> Path:
        return checkpoint_root(self.sft(task)) / checkpoint_name(task.sft_steps) / "model"

    def arm(self, task: TaskSetup, arm: Arm, seed: int) -> Path:
        return self.root / task.name / arm.name / f"seed{seed}"

    def thought_check(self, task: TaskSetup) -> Path:
        """``benchmarks/thought_matters.py``'s numbers for the warm start."""
        return self.root / task.name / "thought-matters" / "result.json"


def _data_job(layout: Layout, task: TaskSetup, split: str, n: int) -> Job:
    seed = DATA_SEED if split == "train" else DATA_SEED + 1
    args = [
        "make-data",
        "--task",
        task.data_task,
        "--source",
        task.source,
        "--n",
        str(n),
        "--seed",
        str(seed),
        "--split",
        split,
        "--out",
        str(layout.data(task, split)),
    ]
    if task.difficulty:
        args += ["--difficulty", task.difficulty]
    return Job(f"data/{task.name}/{split}", tuple(args), layout.data(task, split))


def _sft_job(layout: Layout, plan: ComparePlan, task: TaskSetup) -> Job:
    args = (
        "sft",
        "--config",
        str(task.config),
        f"model.name_or_path={layout.model}",
        f"data.train_path={layout.records(task, 'train')}",
        f"train.steps={task.sft_steps}",
        f"train.prompts_per_step={task.sft_batch}",
        f"train.micro_batch_prompts={task.sft_batch}",
        f"optim.learning_rate={plan.sft_learning_rate}",
        "optim.warmup_steps=50",
        "seed=0",
        f"logging.output_dir={layout.sft(task)}",
    )
    return Job(
        f"sft/{task.name}",
        args,
        layout.sft(task),
        after=("model", f"data/{task.name}/train"),
        threads=SFT_THREADS,
    )


def _yaml_scalar(text: str) -> str:
    """``text`` as it can stand in a YAML flow mapping: bare when that parses back unchanged, else quoted."""
    return json.dumps(text) if re.search(r"[:,\[\]{}#&*!|>'\"%@`]|^\s|\s$", text) else text


def arm_job(layout: Layout, plan: ComparePlan, task: TaskSetup, arm: Arm, seed: int) -> Job:
    eval_sets = ", ".join(
        f"{name}: {_yaml_scalar(str(layout.records(task, name)))}" for name in task.eval_records
    )
    args = (
        "train",
        "--config",
        str(task.config),
        f"model.name_or_path={layout.warm_start(task)}",
        f"data.train_path={layout.records(task, 'train')}",
        f"data.eval_sets={{{eval_sets}}}",
        *arm.overrides(),
        f"train.steps={task.steps}",
        *((f"train.time_budget_s={plan.time_budget_s:g}",) if plan.equal_time else ()),
        f"train.eval_every={plan.eval_every}",
        f"seed={seed}",
        f"logging.output_dir={layout.arm(task, arm, seed)}",
    )
    waits = (f"sft/{task.name}", *(f"data/{task.name}/{name}" for name in task.eval_records))
    return Job(f"train/{task.name}/{arm.name}/seed{seed}", args, layout.arm(task, arm, seed), after=waits)


def thought_check_job(layout: Layout, task: TaskSetup) -> Job:
    """The warm start's held-out IoU after the reference thought, a wrong one and its own."""
    [held_out] = list(task.eval_records)[:1]
    out = layout.thought_check(task)
    args = (
        str(layout.warm_start(task)),
        str(layout.records(task, held_out)),
        "--config",
        str(task.config),
        "--json",
        str(out),
    )
    return Job(
        f"thought-matters/{task.name}",
        args,
        out.parent,
        after=(f"sft/{task.name}", f"data/{task.name}/{held_out}"),
        script="benchmarks/thought_matters.py",
    )


def build_jobs(plan: ComparePlan, layout: Layout) -> list[Job]:
    """Every command of ``plan``, longest training runs first so the last ones to finish are short."""
    jobs = [
        Job(
            "model",
            (
                "make-tiny-model",
                "--arch",
                MODEL_ARCH,
                "--preset",
                MODEL_PRESET,
                "--seed",
                "0",
                "--out",
                str(layout.model),
            ),
            layout.model,
        )
    ]
    for task in plan.tasks:
        jobs.append(_data_job(layout, task, "train", task.train_records))
        jobs += [_data_job(layout, task, name, n) for name, n in task.eval_records.items()]
    jobs += [_sft_job(layout, plan, task) for task in plan.tasks]
    jobs += [thought_check_job(layout, task) for task in plan.tasks if task.difficulty == "relational"]
    arms = [(task, arm, seed) for task in plan.tasks for arm in plan.arms for seed in plan.seeds]
    arms.sort(key=lambda item: (item[0].source != "sapien", -item[1].samples, item[2]))
    jobs += [arm_job(layout, plan, task, arm, seed) for task, arm, seed in arms]
    return jobs
