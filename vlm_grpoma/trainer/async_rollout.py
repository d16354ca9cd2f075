"""Asynchronous rollout (``train.async_rollout``): the next step's prompts are sampled on the rollout server
while this step trains, one step off (verl's one_step_off_policy).

The prefetched rollout is sampled with the weights the trainer held when it was asked for: by the time it is
trained on, the trainer has made ``algorithm.policy_epochs`` more optimizer steps (its *staleness*, in weight
versions). A rollout staler than ``max_staleness`` is not used: its prompts are sampled again, synchronously,
with the current weights. The PPO ``old_logp`` stays the trainer's own log-probs before the update, and the
rollout correction (TIS/MIS) weighs the rollout's tokens by trainer over rollout probability, which now covers
the stale weights as well as the engine's numerics.

Only HTTP runs on the prefetch thread (the request is frozen on the main thread, see
:meth:`~vlm_grpoma.rollout.server.client.ServerRolloutEngine.request_sample`); collectives, weight pushes and
rewards stay on the main thread. The data position a checkpoint saves is the one before the prefetched prompts
were drawn, so a resumed run draws them again: no prompt is lost or repeated (the resumed run samples them with
newer weights, so it is not bitwise equal to an uninterrupted one).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.rollout.server.client import ServedRollout
from vlm_grpoma.rollout.tree import RolloutTree


@dataclass
class PendingRollout:
    """A rollout on its way: the prompts it samples and the data position before they were drawn."""

    records: list[Record]
    data_state: dict[str, Any]
    request: Callable[[], ServedRollout] = field(repr=False)
    sample_s: float = 0.0  # how long the server took, as the prefetch thread measured it
    _served: ServedRollout | None = None
    _error: BaseException | None = None
    _done: threading.Event = field(default_factory=threading.Event, repr=False)

    def start(self) -> None:
        # a daemon thread: a run that stops early (time budget, signal) leaves without waiting for the reply
        threading.Thread(target=self._run, name="vlm-grpoma-prefetch", daemon=True).start()

    def _run(self) -> None:
        began = time.perf_counter()
        try:
            self._served = self.request()
        except BaseException as err:  # handed to the main thread, which raises it where it takes the rollout
            self._error = err
        finally:
            self.sample_s = time.perf_counter() - began
            self._done.set()

    def result(self) -> ServedRollout:
        """The server's reply (waiting for it; the request's own timeout bounds the wait) or its error."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._served is not None
        return self._served


@dataclass(frozen=True)
class TakenRollout:
    """A prefetched rollout as the step receives it; ``tree`` is None when it was too stale to train on."""

    records: list[Record]
    tree: RolloutTree | None
    staleness: int
    wait_s: float
    sample_s: float

    @property
    def overlap_s(self) -> float:
        """Seconds the server sampled while the trainer was busy: the sampling the wait did not cover."""
        return max(self.sample_s - self.wait_s, 0.0) if self.tree is not None else 0.0

    def metrics(self) -> dict[str, float]:
        return {
            "async/staleness": float(self.staleness),
            "async/wait_s": self.wait_s,
            "async/overlap_s": self.overlap_s,
            "async/dropped": float(self.tree is None),
        }


#: the metrics of a step whose rollout was not prefetched (the first one, a resumed run's first one)
SYNCHRONOUS = {"async/staleness": 0.0, "async/wait_s": 0.0, "async/overlap_s": 0.0, "async/dropped": 0.0}


class RolloutPrefetch:
    """At most one rollout in flight: :meth:`submit` starts the next step's, :meth:`take` receives it."""

    def __init__(self, max_staleness: int) -> None:
        self.max_staleness = max_staleness
        self.pending: PendingRollout | None = None

    def submit(
        self, records: list[Record], data_state: dict[str, Any], request: Callable[[], ServedRollout]
    ) -> None:
        if self.pending is not None:
            raise RuntimeError("a prefetched rollout is already in flight; take it first")
        self.pending = PendingRollout(records, data_state, request)
        self.pending.start()

    def take(self, trained_version: int) -> TakenRollout | None:
        """The prefetched rollout (None if none is in flight), dropped if it lags ``trained_version`` by more
        than ``max_staleness``."""
        pending, self.pending = self.pending, None
        if pending is None:
            return None
        began = time.perf_counter()
        served = pending.result()
        wait_s = time.perf_counter() - began
        staleness = trained_version - served.version
        tree = served.tree if staleness <= self.max_staleness else None
        return TakenRollout(pending.records, tree, staleness, wait_s, pending.sample_s)

    def data_state(self) -> dict[str, Any] | None:
        """The data position to checkpoint while a rollout is in flight: before its prompts were drawn."""
        return None if self.pending is None else self.pending.data_state
