"""The prefetch of ``train.async_rollout``: one rollout in flight on a thread, its staleness against the trained
weights, the data position a checkpoint saves while it flies, and its errors raised where the step takes it.

The request stands in for the HTTP call (the real server runs in ``test_train_vllm.py``); here its timing is
controlled, so the thread's overlap with the caller is measured, not assumed."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from vlm_grpoma.answers import Box, Boxes
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.errors import RolloutServerError
from vlm_grpoma.rollout.server.client import ServedRollout
from vlm_grpoma.trainer.async_rollout import RolloutPrefetch
from vlm_grpoma.trainer.sampler import PromptSampler


def served(version: int) -> ServedRollout:
    return ServedRollout(tree=object(), version=version, stats={"tokens": 3.0})  # type: ignore[arg-type]


def records(n: int) -> list[Record]:
    return [
        Record(f"r{i}", f"{i}.png", "detection", "the cup", 10, 10, Boxes((Box(0, 0, 5, 5),)))
        for i in range(n)
    ]


def test_nothing_in_flight_takes_none():
    assert RolloutPrefetch(max_staleness=1).take(trained_version=3) is None


def test_the_request_runs_while_the_caller_works_and_staleness_counts_the_pushes_since():
    release, started = threading.Event(), threading.Event()

    def request() -> ServedRollout:
        started.set()
        release.wait(10)
        return served(version=5)

    prefetch = RolloutPrefetch(max_staleness=1)
    prefetch.submit(records(2), {"position": 4}, request)
    assert started.wait(10)  # sent at once, on another thread, while this one goes on
    release.set()
    taken = prefetch.take(trained_version=6)
    assert taken is not None and taken.tree is not None and [r.id for r in taken.records] == ["r0", "r1"]
    assert taken.metrics() == {
        "async/staleness": 1.0,
        "async/wait_s": taken.wait_s,
        "async/overlap_s": max(taken.sample_s - taken.wait_s, 0.0),
        "async/dropped": 0.0,
    }
    assert prefetch.pending is None and prefetch.data_state() is None


def test_a_rollout_staler_than_max_staleness_keeps_its_prompts_and_drops_its_tree():
    prefetch = RolloutPrefetch(max_staleness=1)
    prefetch.submit(records(2), {}, lambda: served(version=1))
    taken = prefetch.take(trained_version=3)
    assert taken is not None and taken.tree is None and taken.staleness == 2
    assert [r.id for r in taken.records] == ["r0", "r1"]  # sampled again, not skipped
    assert taken.metrics()["async/dropped"] == 1.0 and taken.metrics()["async/overlap_s"] == 0.0


def test_wait_is_only_the_time_left_after_the_callers_work():
    prefetch = RolloutPrefetch(max_staleness=1)

    def request() -> ServedRollout:
        time.sleep(0.4)
        return served(version=0)

    prefetch.submit(records(1), {}, request)
    time.sleep(0.3)  # the trainer's update
    taken = prefetch.take(trained_version=1)
    assert taken is not None and taken.sample_s >= 0.4 and taken.wait_s < 0.35


def test_an_error_of_the_request_is_raised_where_the_step_takes_it():
    def request() -> ServedRollout:
        raise RolloutServerError("rollout server http://h:1: unreachable")

    prefetch = RolloutPrefetch(max_staleness=1)
    prefetch.submit(records(1), {}, request)
    with pytest.raises(RolloutServerError, match=r"^rollout server http://h:1: unreachable$"):
        prefetch.take(trained_version=1)
    assert prefetch.pending is None


def test_one_rollout_in_flight_at_most():
    prefetch = RolloutPrefetch(max_staleness=1)
    prefetch.submit(records(1), {}, lambda: served(0))
    with pytest.raises(RuntimeError, match="already in flight"):
        prefetch.submit(records(1), {}, lambda: served(0))


def test_a_checkpoint_during_a_rollout_in_flight_saves_the_position_before_its_prompts():
    """What GRPOMATrainer does: note the position, draw the next step's prompts, send them; a save meanwhile
    must give a resumed run those prompts again, and the run after them the same order as a straight run."""
    straight = PromptSampler(10, 4, seed=3)
    expected = [straight.next_step() for _ in range(4)]
    sampler = PromptSampler(10, 4, seed=3)
    sampler.next_step()  # step 1, sampled synchronously
    prefetch = RolloutPrefetch(max_staleness=1)
    before = sampler.state_dict()
    drawn = sampler.next_step()  # step 2's prompts, in flight
    prefetch.submit(records(4), before, lambda: served(0))
    saved = prefetch.data_state()
    resumed = PromptSampler(10, 4, seed=3)
    resumed.load_state_dict(torch.load(_roundtrip(saved), weights_only=True))
    assert drawn == expected[1] and [resumed.next_step() for _ in range(3)] == expected[1:]
    prefetch.take(trained_version=0)


def _roundtrip(state: dict):
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer
