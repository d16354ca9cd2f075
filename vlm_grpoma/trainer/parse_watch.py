"""A warning when answers stop parsing during RL: a policy that drifts from the answer format scores zero on
every malformed answer, and a user would want to hear of it before the run ends, not from its held-out table.

Watched: the training parse rate (``answers/parse_rate``, compared over a window of steps, since sampled answers
vary step to step) and each held-out set's (``eval/<set>/parse_rate``, greedy on fixed records: each evaluation
against the first). One warning per rate, the first time it falls more than :data:`DROP` below its start.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

TRAINING = "answers/parse_rate"
DROP = 0.2  # 20 points
TRAINING_WINDOW = 5  # steps averaged at the start and now


@dataclass
class _Rate:
    window: int
    first: list[float] = field(default_factory=list)
    recent: deque = field(default_factory=deque)
    warned: bool = False

    def observe(self, value: float) -> tuple[float, float] | None:
        """(start, now) when this value makes the fall exceed :data:`DROP` for the first time."""
        if len(self.first) < self.window:
            self.first.append(value)
        self.recent.append(value)
        if len(self.recent) > self.window:
            self.recent.popleft()
        if self.warned or len(self.first) < self.window:
            return None
        start, now = sum(self.first) / self.window, sum(self.recent) / len(self.recent)
        if start - now > DROP:
            self.warned = True
            return start, now
        return None


@dataclass
class ParseRateWatch:
    """Feed it each step's metrics; it returns the warning lines due (each rate warns once per run)."""

    rates: dict[str, _Rate] = field(default_factory=dict)

    def observe(self, step: int, metrics: dict[str, float]) -> list[str]:
        lines = []
        for name, value in metrics.items():
            if name != TRAINING and not (name.startswith("eval/") and name.endswith("/parse_rate")):
                continue
            rate = self.rates.setdefault(name, _Rate(TRAINING_WINDOW if name == TRAINING else 1))
            fall = rate.observe(value)
            if fall is None:
                continue
            start, now = fall
            what = (
                f"the training parse rate (mean of {rate.window} steps) fell from {start:.2f} to {now:.2f}"
                if name == TRAINING
                else f"held-out {name.removeprefix('eval/').removesuffix('/parse_rate')!r} parse rate fell "
                f"from {start:.2f} to {now:.2f}"
            )
            lines.append(
                f"step {step}: {what}: answers are drifting from the format the reward can read "
                "(look at samples.jsonl; a format reward weight or a KL anchor holds it)"
            )
        return lines
