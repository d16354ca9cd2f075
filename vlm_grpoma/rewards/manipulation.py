"""The ``manipulation`` reward: execute ContactAction answers in SAPIEN and score task success.

Each record's ``meta`` holds the episode spec (object category + instance seed, camera, target part,
primitive, initial joint state; see ``vlm_grpoma.envs.sapien.task``), so every one of a prompt's K x M
answers is executed on the same object from the same view. ``total`` is success (0/1, ManipLLM's rule);
components, for analysis: ``success``, ``joint_progress`` (|dq| / joint range, clipped to [0, 1]),
``direction`` (cosine of the contact point's motion with the pull direction, clipped at 0) and
``executed`` (the action ran to the end: its pixel hit a movable part and no step limit, timeout or
physics blow-up stopped it). A malformed answer scores 0 and is counted in
``failures`` under its parse reason; simulator failures are counted under their outcome reason.
"""

from __future__ import annotations

import math
import weakref
from collections import Counter
from collections.abc import Sequence

from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.envs.sapien.pool import HARD_DEADLINE_SLACK_S, SimPool
from vlm_grpoma.envs.sapien.task import EpisodeSpec, ExecConfig, Outcome
from vlm_grpoma.rewards.base import Completion, RewardResult, valid_answers

COMPONENTS = ("success", "joint_progress", "direction", "executed")


class ManipulationReward:
    """``ManipulationReward(workers=0, timeout_s=10.0, max_steps=400, job_deadline_s=None)``; workers 0 = this
    rank's share of cores; a worker still busy after ``job_deadline_s`` (default timeout_s + 60) is killed as
    frozen and its answer fails with reason ``timeout``."""

    def __init__(
        self,
        workers: int = 0,
        timeout_s: float = 10.0,
        max_steps: int = 400,
        job_deadline_s: float | None = None,
    ):
        self.workers = workers
        self.config = ExecConfig(timeout_s=timeout_s, max_steps=max_steps)
        self.job_deadline_s = timeout_s + HARD_DEADLINE_SLACK_S if job_deadline_s is None else job_deadline_s
        if not (math.isfinite(self.job_deadline_s) and self.job_deadline_s > 0):
            raise ValueError(f"job_deadline_s must be a positive number of seconds, got {job_deadline_s}")
        self._pool: SimPool | None = None

    @property
    def pool(self) -> SimPool:
        if self._pool is None:
            self._pool = SimPool(self.workers, job_deadline_s=self.job_deadline_s)
            weakref.finalize(self, self._pool.close)
        return self._pool

    def score(self, completions: Sequence[Completion], records: Sequence[Record]) -> RewardResult:
        slots, answers, parse_failures = valid_answers("manipulation", completions, records, "contact_action")
        failures: Counter[str] = Counter(parse_failures)
        jobs = []
        for i, answer in zip(slots, answers):
            try:
                spec = EpisodeSpec.from_meta(records[i].meta)
            except ValueError as err:
                raise ValueError(f"record {records[i].id!r}: {err}") from err
            jobs.append((spec, answer))
        outcomes = self.pool.execute(jobs, self.config) if jobs else []
        columns = {name: [0.0] * len(completions) for name in COMPONENTS}
        for i, outcome in zip(slots, outcomes):
            for name, value in _components(outcome).items():
                columns[name][i] = value
            if outcome.failure:
                failures[outcome.failure] += 1
        return RewardResult(list(columns["success"]), columns, dict(failures))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def _components(outcome: Outcome) -> dict[str, float]:
    executed = outcome.failure == ""
    return {
        "success": float(outcome.success),
        "joint_progress": outcome.progress,
        "direction": max(0.0, outcome.direction_cos),
        "executed": float(executed),
    }
