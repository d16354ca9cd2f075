"""Seeded multi-step arithmetic with a verifiable answer (task ``answer``, text only): the thought does the work.

A problem is a start number and operations applied left to right ("Compute left to right: 7 +5 *3 -4": short,
as the tiny models' vocabulary spells most words letter by letter); the answer (``32``) depends on every step
and, with ``*`` among the operations, cannot be read off the operands, so a policy must compute the chain.
The reference thought (``meta["thought"]``, the SFT warm start's target) writes each step out,
``7+5=12, 12*3=36, 36-4=32``: on the tiny tokenizer 13 / 22 / 47 tokens (easy / normal / hard), 8-18x the
answer's digits, 4-10x with the answer tags (digits and operators are one token each, as in Qwen's). Every value stays in ``[1, max_value]``, so numbers stay short.

Splits are disjoint by construction: a problem belongs to ``train``, ``val`` or ``test`` by a hash of its
text (8:1:1), and a split's generator keeps only its own problems; same seed and split -> the same records.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path

from vlm_grpoma.datasets.jsonl import record_from_json, write_records
from vlm_grpoma.datasets.schema import Record

OPERATORS: tuple[str, ...] = ("+", "-", "*")
#: Each split's share of the hash buckets 0-9: problems of different splits never coincide.
SPLIT_BUCKETS: dict[str, range] = {"train": range(0, 8), "val": range(8, 9), "test": range(9, 10)}


@dataclass(frozen=True)
class ArithmeticConfig:
    """How hard a problem is: the number of operations, the largest operand, the largest value any step may
    reach (start and results), and the operators to draw from."""

    steps: int = 3
    max_operand: int = 9
    max_value: int = 99
    operators: tuple[str, ...] = OPERATORS

    def validate(self) -> None:
        problems = []
        if not 1 <= self.steps <= 12:
            problems.append(f"steps must be in 1..12, got {self.steps}")
        if self.max_operand < 2:
            problems.append(f"max_operand must be >= 2, got {self.max_operand}")
        if self.max_value < 2 * self.max_operand:
            problems.append(
                f"max_value must be >= 2 * max_operand, got {self.max_value} < 2 * {self.max_operand}"
            )
        unknown = sorted(set(self.operators) - set(OPERATORS))
        if unknown or not self.operators:
            problems.append(f"operators must be a non-empty subset of {OPERATORS}, got {self.operators}")
        if problems:
            raise ValueError("; ".join(problems))


#: ``make-data --difficulty`` levels.
PRESETS: dict[str, ArithmeticConfig] = {
    "easy": ArithmeticConfig(steps=2, max_operand=9, max_value=99),
    "normal": ArithmeticConfig(steps=3, max_operand=9, max_value=99),
    "hard": ArithmeticConfig(steps=5, max_operand=20, max_value=999),
}


@dataclass(frozen=True)
class Problem:
    """A start value, the (operator, operand) steps, and the value after each step (the last is the answer)."""

    start: int
    steps: tuple[tuple[str, int], ...]
    values: tuple[int, ...]

    @property
    def answer(self) -> int:
        return self.values[-1]

    def prompt(self) -> str:
        ops = " ".join(f"{op}{operand}" for op, operand in self.steps)
        return f"Compute left to right: {self.start} {ops}"

    def thought(self) -> str:
        before = (self.start, *self.values[:-1])
        return ", ".join(
            f"{a}{op}{operand}={b}" for a, (op, operand), b in zip(before, self.steps, self.values)
        )


def apply(value: int, op: str, operand: int) -> int:
    return value + operand if op == "+" else value - operand if op == "-" else value * operand


def _allowed(value: int, op: str, cfg: ArithmeticConfig) -> list[int]:
    """The operands that keep ``value op operand`` in ``[1, max_value]`` (``*`` by at least 2): no zero, which
    would otherwise be the commonest answer (a guess that pays without the thought)."""
    low = 2 if op == "*" else 1
    return [o for o in range(low, cfg.max_operand + 1) if 1 <= apply(value, op, o) <= cfg.max_value]


def draw_problem(rng: random.Random, cfg: ArithmeticConfig) -> Problem:
    """A random problem: each step's operator uniform among those with an allowed operand, then the operand."""
    value = start = rng.randint(1, cfg.max_operand)
    steps, values = [], []
    for _ in range(cfg.steps):
        choices = {op: allowed for op in cfg.operators if (allowed := _allowed(value, op, cfg))}
        # never empty: "+" or "-" always fits since max_value >= 2*max_operand
        op = rng.choice(sorted(choices))
        operand = rng.choice(choices[op])
        value = apply(value, op, operand)
        steps.append((op, operand))
        values.append(value)
    return Problem(start, tuple(steps), tuple(values))


def split_of(problem: Problem) -> str:
    """The split a problem belongs to, from a hash of its text (stable across runs and machines)."""
    bucket = int(hashlib.sha256(problem.prompt().encode()).hexdigest(), 16) % 10
    return next(name for name, buckets in SPLIT_BUCKETS.items() if bucket in buckets)


def _split_seed(seed: int, split: str) -> int:
    return int.from_bytes(hashlib.sha256(f"arithmetic/{seed}/{split}".encode()).digest()[:8], "big")


def generate_problems(n: int, seed: int, split: str, cfg: ArithmeticConfig) -> list[Problem]:
    """``n`` problems of ``split`` (``train``, ``val`` or ``test``), deterministic in (seed, split, cfg)."""
    if split not in SPLIT_BUCKETS:
        raise ValueError(f"split must be one of {', '.join(SPLIT_BUCKETS)}, got {split!r}")
    cfg.validate()
    rng = random.Random(_split_seed(seed, split))
    problems: list[Problem] = []
    while len(problems) < n:
        problem = draw_problem(rng, cfg)
        if split_of(problem) == split:
            problems.append(problem)
    return problems


def make_record(index: int, problem: Problem, seed: int, split: str, difficulty: str) -> Record:
    """The ``answer`` record of one problem (numeric matcher, the stepwise reference thought in meta), built
    from its on-disk form so it is validated exactly as a trainer will read it."""
    line = {
        "id": f"arithmetic-{split}-{index:06d}",
        "task": "answer",
        "prompt": problem.prompt(),
        "ground_truth": {"answer": str(problem.answer), "matcher": "numeric"},
        "split": split,
        "meta": {
            "source": "arithmetic",
            "seed": seed,
            "difficulty": difficulty,
            "steps": len(problem.steps),
            "thought": problem.thought(),
        },
    }
    return record_from_json(line, Path("."))


def generate_arithmetic(
    n: int, out_dir: Path, seed: int, split: str, cfg: ArithmeticConfig, difficulty: str = "custom"
) -> Path:
    """Write ``n`` records of ``split`` to ``out_dir/records.jsonl``; returns the file."""
    problems = generate_problems(n, seed, split, cfg)
    records = [make_record(i, p, seed, split, difficulty) for i, p in enumerate(problems)]
    return write_records(Path(out_dir) / "records.jsonl", records)


__all__ = [
    "PRESETS",
    "SPLIT_BUCKETS",
    "ArithmeticConfig",
    "Problem",
    "draw_problem",
    "generate_arithmetic",
    "generate_problems",
    "split_of",
]
