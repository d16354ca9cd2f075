"""What the GRPO-MA vs GRPO comparison runs: tasks, T{K}A{M} arms, seeds, sizes (full and ``--quick``).

Four plans: ``toy`` (short thoughts that restate the answer; every arm trains the same number of steps),
``paper-regime`` (relational shapes: a ~120-token thought that decides which of 3-6 shapes the ~25-token answer
boxes) and ``reasoning`` (text-only multi-step arithmetic: the thought computes the chain the ~4-token answer ends
it with); the last two train every arm for the same seconds of step time, held-out scores read against time and
steps. ``crossover`` trains T16A1 and T4A4 on the arithmetic task with the answers' rewards flipped at random
(``rewards.noise.flip``), to find the noise at which M answers per thought start to pay (issue #52).
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
    """One sampling configuration: K thoughts per prompt, M answers per thought (T4A1 = GRPO with 4 samples);
    ``adaptive`` (T4A4-adaptive): the same K·M answers per prompt, 2 per thought first, the rest allocated by
    Neyman (``rollout.adaptive_answers``, 2..2M per thought); ``flip`` (T4A4-flip0.2): training rewards flipped
    with that probability per answer (``rewards.noise.flip``, the crossover plan's control)."""

    thoughts: int
    answers: int
    adaptive: bool = False
    flip: float = 0.0

    @property
    def name(self) -> str:
        return (
            f"T{self.thoughts}A{self.answers}"
            + ("-adaptive" if self.adaptive else "")
            + (f"-flip{self.flip:g}" if self.flip else "")
        )

    @property
    def base(self) -> str:
        """The name without the noise: the arm's sampling configuration."""
        return f"T{self.thoughts}A{self.answers}" + ("-adaptive" if self.adaptive else "")

    def overrides(self) -> tuple[str, ...]:
        """The run config's rollout (and, with ``flip``, reward-noise) keys for this arm."""
        keys = (f"rollout.num_thoughts={self.thoughts}", f"rollout.answers_per_thought={self.answers}")
        keys += (f"rewards.noise.flip={self.flip:g}",) if self.flip else ()
        if not self.adaptive:
            return keys
        return (
            *keys,
            "rollout.adaptive_answers.enabled=true",
            "rollout.adaptive_answers.first=2",
            f"rollout.adaptive_answers.budget={self.samples}",
            "rollout.adaptive_answers.min_per_thought=2",
            f"rollout.adaptive_answers.max_per_thought={2 * self.answers}",
        )

    @property
    def samples(self) -> int:
        return self.thoughts * self.answers

    @classmethod
    def parse(cls, text: str) -> Arm:
        match = re.fullmatch(r"T(\d+)A(\d+)(-adaptive)?(?:-flip(0(?:\.\d+)?))?", text)
        if (
            not match
            or int(match[1]) < 2
            or int(match[2]) < (2 if match[3] else 1)
            or float(match[4] or 0) > 0.5
        ):
            raise ValueError(
                f"arm {text!r}: write T<K>A<M> with K >= 2 thoughts and M >= 1 answers, e.g. T4A4, or "
                "T<K>A<M>-adaptive with M >= 2 (K·M answers per prompt allocated per thought), optionally "
                "ending -flip<p> (training rewards flipped with probability p <= 0.5)"
            )
        return cls(int(match[1]), int(match[2]), bool(match[3]), float(match[4] or 0))


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
    difficulty: str = ""  # make-data --difficulty (shapes, arithmetic)
    records_task: str = ""  # make-data --task when it differs from the name (relational shapes are detection)

    @property
    def headline_label(self) -> str:
        """The headline metric as the report's prose names it."""
        return HEADLINE_LABELS.get(self.headline, self.headline)

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
HEADLINE_LABELS = {"iou": "IoU", "manipulation/success": "success", "answer_match": "accuracy"}

#: text-only arithmetic ("Compute left to right: 7 +5 *3"): the reference thought writes each step out (~13
#: tokens at ``easy``), the answer is the last value; the answer cannot be read off the operands. Sizes from the
#: pilot (docs/comparison.md): at ``normal`` 300 SFT steps on 2,000 records left 0.055 held-out accuracy and no
#: arm's reward moved; ``easy`` with 600 steps on 5,000 records starts the arms at 0.555
ARITHMETIC = TaskSetup(
    "arithmetic",
    "arithmetic",
    5000,
    {"test": 128},
    sft_steps=600,
    sft_batch=32,
    headline="answer_match",
    steps=2000,
    difficulty="easy",
    records_task="answer",
)


#: the crossover plan: arms at 16 answers a prompt, flip probabilities bracketing the predicted crossover
#: (benchmarks/variance.py --crossover), seconds of step time per run
CROSSOVER_ARMS = ("T16A1", "T4A4")
CROSSOVER_FLIPS = (0.0, 0.2, 0.4)
CROSSOVER_SEEDS = (0, 1, 2, 3, 4)
CROSSOVER_BUDGET_S = 150.0
CROSSOVER_TITLE = "When do M answers per thought pay? T4A4 vs T16A1 as the answers' rewards get noisier"

PAPER_TITLE = "Results in the paper's regime: GRPO-MA vs GRPO at equal time"
REASONING_TITLE = "Results on a reasoning task: GRPO-MA vs GRPO at equal time"
REASONING_SCALE = (
    "a 0.8 M-parameter model, text only (no image), trained from scratch on multi-step arithmetic, 8 prompts "
    "per step, on CPU; perception plays no part, so the thought decides the answer. The paper trains "
    "pretrained 3B–7B models on competition math for thousands of steps. These runs test whether the method's "
    "mechanics show up at toy scale; they cannot confirm or refute the paper's numbers."
)


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
    title: str = "Results: GRPO-MA vs GRPO at CPU scale"  # the report's heading
    #: what the runs are and what they cannot show (the report's "Scale" line)
    scale: str = (
        "a 0.8 M-parameter model trained from scratch on 112×112 images, 8 prompts per step, at most a few hundred "
        "steps, on CPU. The paper trains pretrained 3B–7B models for thousands of steps. These runs test whether "
        "the method's mechanics show up at toy scale; they cannot confirm or refute the paper's numbers."
    )

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
    def equal_time_plan(cls, name: str, task: TaskSetup, quick: bool, **texts: str) -> ComparePlan:
        """An equal-time plan of one task (``texts``: its report ``title`` / ``scale``); ``quick``: 1 seed, 15 s
        an arm, 200 training and 16 held-out records, a 20-step warm start (a smoke test: one seed leaves every
        verdict inconclusive, whatever the warm start). The task's own step count stays: the budget must be what
        stops every arm (a fast machine ran 40 steps of T4A1 in 12 of its 15 s)."""
        if quick:
            small = replace(task, train_records=200, eval_records={"test": 16}, sft_steps=20)
            return cls(
                f"{name}-quick",
                (small,),
                seeds=(0,),
                eval_every=4,
                time_budget_s=15.0,
                arguments=f" --plan {name} --quick",
                **texts,
            )
        return cls(
            name,
            (task,),
            eval_every=PAPER_EVAL_EVERY,
            time_budget_s=PAPER_BUDGET_S,
            arguments=f" --plan {name}",
            **texts,
        )

    @classmethod
    def paper_regime(cls, quick: bool = False) -> ComparePlan:
        return cls.equal_time_plan("paper-regime", RELATIONAL, quick, title=PAPER_TITLE)

    @classmethod
    def paper_regime_quick(cls) -> ComparePlan:
        return cls.paper_regime(quick=True)

    @classmethod
    def reasoning(cls, quick: bool = False) -> ComparePlan:
        """The equal-time arithmetic plan; the whole plan also runs T4A4-adaptive (H5), the quick one does not."""
        plan = cls.equal_time_plan(
            "reasoning", ARITHMETIC, quick, title=REASONING_TITLE, scale=REASONING_SCALE
        )
        return plan if quick else replace(plan, arms=(*plan.arms, Arm.parse("T4A4-adaptive")))

    @classmethod
    def reasoning_quick(cls) -> ComparePlan:
        return cls.reasoning(quick=True)

    @classmethod
    def crossover(cls, quick: bool = False) -> ComparePlan:
        """T16A1 and T4A4 at every flip probability on the arithmetic task, one warm start for all of them."""
        plan = cls.equal_time_plan(
            "crossover", ARITHMETIC, quick, title=CROSSOVER_TITLE, scale=REASONING_SCALE
        )
        arms = tuple(
            replace(Arm.parse(name), flip=flip) for flip in CROSSOVER_FLIPS for name in CROSSOVER_ARMS
        )
        if quick:
            return replace(plan, arms=arms)
        return replace(plan, arms=arms, seeds=CROSSOVER_SEEDS, time_budget_s=CROSSOVER_BUDGET_S)

    @classmethod
    def crossover_quick(cls) -> ComparePlan:
        return cls.crossover(quick=True)

    @classmethod
    def named(cls, name: str, quick: bool = False) -> ComparePlan:
        """The plan ``benchmarks/compare.py --plan NAME [--quick]`` runs."""
        plans = {
            "toy": (cls.full, cls.quick),
            "paper-regime": (cls.paper_regime, cls.paper_regime_quick),
            "reasoning": (cls.reasoning, cls.reasoning_quick),
            "crossover": (cls.crossover, cls.crossover_quick),
        }
        if name not in plans:
            raise ValueError(f"--plan: unknown plan {name!r}; choose {', '.join(plans)}")
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

    def _subset_with(self, option: str, tasks: tuple[TaskSetup, ...]) -> ComparePlan:
        """This plan with ``tasks`` changed by a command-line ``option`` (``"--steps 40"``): a ``-subset`` plan whose
        arguments name the option, so its report says how it was run."""
        return replace(
            self,
            name=self.name if self.name.endswith("-subset") else f"{self.name}-subset",
            arguments=f"{self.arguments} {option}",
            tasks=tasks,
        )

    def with_steps(self, steps: int | None) -> ComparePlan:
        """This plan with every task's GRPO steps set to ``steps`` (``--steps``: a shorter run, the same for every
        arm); ``None`` keeps the plan's steps."""
        if steps is None:
            return self
        if steps < 1:
            raise ValueError(f"--steps: {steps} GRPO steps; give at least 1")
        return self._subset_with(f"--steps {steps}", tuple(replace(t, steps=steps) for t in self.tasks))

    def with_sft_steps(self, steps: int | None) -> ComparePlan:
        """This plan with every task's SFT warm start set to ``steps`` (``--sft-steps``: a shorter or longer warm
        start, shared by every arm as always); ``None`` keeps the plan's."""
        if steps is None:
            return self
        if steps < 1:
            raise ValueError(f"--sft-steps: {steps} SFT steps; give at least 1")
        return self._subset_with(
            f"--sft-steps {steps}", tuple(replace(t, sft_steps=steps) for t in self.tasks)
        )

    def with_time_budget(self, seconds: float | None) -> ComparePlan:
        """This equal-time plan with every arm trained for ``seconds`` of step time (``--time-budget``: a shorter
        run, the same for every arm); ``None`` keeps the plan's budget. A plan of equal steps has none to set."""
        if seconds is None:
            return self
        if not self.equal_time:
            raise ValueError(f"--time-budget: plan {self.name!r} compares at equal steps; use --steps")
        if not 0 < seconds < float("inf"):
            raise ValueError(f"--time-budget: {seconds:g} s; give a finite number of seconds > 0")
        return replace(
            self,
            name=self.name if self.name.endswith("-subset") else f"{self.name}-subset",
            arguments=f"{self.arguments} --time-budget {seconds:g}",
            time_budget_s=seconds,
        )

    def with_page(self, page: str | None) -> ComparePlan:
        """This plan with ``--page`` in its arguments, so the report names the command that wrote it (where
        it is written, ``--docs`` and ``--out``, is not part of what it measured)."""
        return replace(self, arguments=self.arguments + (f" --page {page}" if page else ""))
