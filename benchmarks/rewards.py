"""Rewards per second on one core: detection (10 predicted vs 10 gt boxes) and trajectory (32 points).

Run: ``.venv/bin/python benchmarks/rewards.py [--n 5000] [--repeats 5]``. Prints the best of ``repeats``
runs, as answers per second of this process's CPU time (robust to other load on the machine) and of wall
time; parsing the answer text is timed too.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import time  # noqa: E402
from functools import partial  # noqa: E402

import numpy as np  # noqa: E402

from vlm_grpoma.answers import Box, Boxes, Trajectory, format_answer, parse_answer  # noqa: E402
from vlm_grpoma.datasets.schema import Record  # noqa: E402
from vlm_grpoma.rewards import build_reward  # noqa: E402
from vlm_grpoma.rewards.registry import Completion  # noqa: E402

WIDTH, HEIGHT = 640, 480


def random_boxes(rng: np.random.Generator, n: int) -> Boxes:
    xy = rng.uniform(0, [WIDTH - 100, HEIGHT - 100], size=(n, 2))
    wh = rng.uniform(5, 100, size=(n, 2))
    return Boxes(tuple(Box(*b) for b in np.concatenate([xy, xy + wh], axis=1).round(1).tolist()))


def random_trajectory(rng: np.random.Generator, n: int) -> Trajectory:
    steps = rng.normal(scale=15, size=(n, 2)).cumsum(axis=0) + [WIDTH / 2, HEIGHT / 2]
    return Trajectory(tuple(map(tuple, steps.round(1).tolist())))


def best_rates(fn, n: int, repeats: int) -> tuple[float, float]:
    """(per CPU second, per wall second) of ``fn()`` handling ``n`` items, each the best of ``repeats``."""
    cpu = wall = float("inf")
    for _ in range(repeats):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu, wall = min(cpu, time.process_time() - c0), min(wall, time.perf_counter() - w0)
    return n / cpu, n / wall


def parse_all(texts: list[str], kind: str) -> list:
    return [parse_answer(t, kind, (WIDTH, HEIGHT)) for t in texts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000, help="answers per batch")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass
    rng = np.random.default_rng(0)
    cases = {
        "detection 10 pred vs 10 gt (iou)": ("iou", "detection", lambda: random_boxes(rng, 10)),
        "trajectory 32 points": ("trajectory", "trajectory", lambda: random_trajectory(rng, 32)),
    }
    print(f"{args.n} answers per batch, 1 thread, best of {args.repeats} runs")
    for label, (reward_name, task, make) in cases.items():
        records = [Record(f"r{i}", "x.png", task, "p", WIDTH, HEIGHT, make()) for i in range(args.n)]
        answers = [make() for _ in range(args.n)]
        completions = [Completion(a) for a in answers]
        reward = build_reward(reward_name)
        kind = "boxes" if task == "detection" else "trajectory"
        texts = [f"<think>t</think><answer>{format_answer(a)}</answer>" for a in answers]
        for what, fn in (
            ("reward", partial(reward.score, completions, records)),
            ("parse", partial(parse_all, texts, kind)),
        ):
            cpu, wall = best_rates(fn, args.n, args.repeats)
            print(f"{label:34s} {what:6s} {cpu:9,.0f} answers/CPU-s {wall:9,.0f} answers/wall-s")


if __name__ == "__main__":
    main()
