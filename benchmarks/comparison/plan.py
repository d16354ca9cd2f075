"""What the GRPO-MA vs GRPO comparison runs: tasks, T{K}A{M} arms, seeds, sizes (full and ``--quick``).

Two plans: ``toy`` (short thoughts that restate the answer; every arm trains the same number of steps) and
``paper-regime`` (relational shapes: a ~120-token thought that decides which of 3-6 shapes the ~25-token answer
boxes; every arm trains for the same seconds of step time, held-out scores read against time and steps).
Every arm of a task starts from the same SFT warm start and sees the same data; arms differ only in K and M
(and their seed, which sets the data order and the sampling).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent / "configs"


@dataclass(frozen=True)
class Arm:
    """One sampling configuration: K thoughts per prompt, M answers per thought (T4A1 = GRPO with 4 samples)."""

    thoughts: int
    answers: int

    @property
    def name(self) -> str:
        return f"T{self.thoughts}A{self.answers}"

    @property
    def samples(self) -> int:
        return self.thoughts * self.answers

    @classmethod
    def parse(cls, text: str) -> Arm:
        match = re.fullmatch(r"T(\d+)A(\d+)", text)
        if not match or int(match[1]) < 2 or int(match[2]) < 1:
            raise ValueError(
                f"arm {text!r}: write T<K>A<M> with K >= 2 thoughts and M >= 1 answers, e.g. T4A4"
            )
        return cls(int(match[1]), int(match[2]))


@dataclass(frozen=True)
class TaskSetup:
    """One task of the comparison: its data, its held-out sets, its warm start and its headline metric."""

    name: str
    source: str  # make-data --source
    train_records: int
    eval_records: dict[str, int]  # held-out set name -> records (the set name is also the data split)
    sft_steps: int
    sft_batch: int
    headline: str  # reward component reported as the held-out score, e.g. "iou" or "manipulation/success"
    steps: int  # GRPO steps of every arm (with a time budget: the most any arm may take)
    difficulty: str = ""  # make-data --difficulty (shapes only)
    records_task: str = ""  # make-data --task when it differs from the name (relational shapes are detection)

    @property
    def data_task(self) -> str:
        return self.records_task or self.name

    @property
    def config(self) -> Path:
        return CONFIG_DIR / f"{self.name}.yaml"


#: relational shapes detection: the thought enumerates the shapes and decides which one the answer boxes
RELATIONAL = TaskSetup(
    "relational",
    "shapes",
    2000,
    {"test": 64},
    sft_steps=600,
    sft_batch=32,
    headline="iou",
    steps=1000,
    difficulty="relational",
    records_task="detection",
)
PAPER_BUDGET_S = 300.0  # seconds of step time per arm
PAPER_EVAL_EVERY = 10


@dataclass(frozen=True)
class ComparePlan:
    """Sizes of one comparison; :meth:`full` fits 60 minutes on 2 cores, :meth:`quick` 10 minutes."""

    name: str
    tasks: tuple[TaskSetup, ...]
    arms: tuple[Arm, ...] = field(
        default_factory=lambda: tuple(map(Arm.parse, ("T4A1", "T16A1", "T4A4", "T8A2")))
    )
    seeds: tuple[int, ...] = (0, 1, 2)
    eval_every: int = 20
    sft_learning_rate: float = 2e-3
    arguments: str = ""  # the benchmarks/compare.py arguments that give this plan
    time_budget_s: float = 0.0  # > 0: every arm trains for these seconds of step time (train.time_budget_s)

    @property
    def equal_time(self) -> bool:
        return self.time_budget_s > 0

    @classmethod
    def full(cls) -> ComparePlan:
        return cls(
            "full",
            (
                TaskSetup(
                    "detection",
                    "shapes",
                    2000,
                    {"test": 64},
                    sft_steps=900,
                    sft_batch=32,
                    headline="iou",
                    steps=100,
                    difficulty="easy",
                ),
                TaskSetup(
                    "manipulation",
                    "sapien",
                    1500,
                    {"seen": 64, "unseen": 64},
                    sft_steps=300,
                    sft_batch=16,
                    headline="manipulation/success",
                    steps=60,
                ),
            ),
        )

    @classmethod
    def quick(cls) -> ComparePlan:
        return cls(
            "quick",
            (
                TaskSetup(
                    "detection",
                    "shapes",
                    1000,
                    {"test": 32},
                    sft_steps=300,
                    sft_batch=32,
                    headline="iou",
                    steps=24,
                    difficulty="easy",
                ),
                TaskSetup(
                    "manipulation",
                    "sapien",
                    400,
                    {"seen": 32, "unseen": 32},
                    sft_steps=200,
                    sft_batch=16,
                    headline="manipulation/success",
                    steps=24,
                ),
            ),
            seeds=(0,),
            eval_every=8,
            arguments=" --quick",
        )

    @classmethod
    def paper_regime(cls) -> ComparePlan:
        return cls(
            "paper-regime",
            (RELATIONAL,),
            eval_every=PAPER_EVAL_EVERY,
            time_budget_s=PAPER_BUDGET_S,
            arguments=" --plan paper-regime",
        )

    @classmethod
    def paper_regime_quick(cls) -> ComparePlan:
        return cls(
            "paper-regime-quick",
            (replace(RELATIONAL, train_records=200, eval_records={"test": 16}, sft_steps=40, steps=40),),
            seeds=(0,),
            eval_every=4,
            time_budget_s=15.0,
            arguments=" --plan paper-regime --quick",
        )

    @classmethod
    def named(cls, name: str, quick: bool = False) -> ComparePlan:
        """The plan ``benchmarks/compare.py --plan NAME [--quick]`` runs."""
        plans = {
            "toy": (cls.full, cls.quick),
            "paper-regime": (cls.paper_regime, cls.paper_regime_quick),
        }
        if name not in plans:
            raise ValueError(f"--plan: unknown plan {name!r}; choose {' or '.join(plans)}")
        return plans[name][quick]()

    def select(
        self, tasks: list[str] | None = None, arms: list[str] | None = None, seeds: list[int] | None = None
    ) -> ComparePlan:
        """A subset of this plan, named ``<name>-subset`` (unknown task names are an error naming the known ones)."""
        if not (tasks or arms or seeds):
            return self
        known = {t.name: t for t in self.tasks}
        for name in tasks or ():
            if name not in known:
                raise ValueError(f"--tasks: unknown task {name!r}; this plan has {', '.join(known)}")
        chosen = [
            (flag, values)
            for flag, values in (("--tasks", tasks), ("--arms", arms), ("--seeds", seeds))
            if values
        ]
        arguments = self.arguments + "".join(
            f" {flag} {' '.join(map(str, values))}" for flag, values in chosen
        )
        return replace(
            self,
            name=f"{self.name}-subset",
            arguments=arguments,
            tasks=tuple(known[n] for n in tasks) if tasks else self.tasks,
            arms=tuple(map(Arm.parse, arms)) if arms else self.arms,
            seeds=tuple(seeds) if seeds else self.seeds,
        )
