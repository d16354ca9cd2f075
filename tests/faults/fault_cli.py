"""The ``vlm-grpoma`` CLI with the fault suite's rewards and fault hooks, for subprocess and launcher runs.

    fault_cli.py COMMAND --config ... [key=value ...]   # like vlm-grpoma
    fault_cli.py --config ... [key=value ...]           # under launch/train.sh (TRAIN_SCRIPT): COMMAND or train

Rewards it registers (use them in ``rewards.weights``):
  fault_length   longer answers score more (a signal the random tiny model's samples vary on)
  fault_nan      NaN for the first answer of every scoring call, the rest as fault_length
  fault_sleepy   sleeps SLEEP_S seconds on rank SLEEP_RANK at its first call (a hung rank)
  fault_kill     SIGKILLs its process at scoring call number KILL_AT_CALL (kill -9 mid-step)
  fault_signal   sends its process SIGNAL (SIGINT, SIGTERM, SIGUSR1) at scoring call SIGNAL_AT_CALL, mid-step
                 (on rank SIGNAL_RANK only, when set)
FAULT=kill-in-save:N SIGKILLs the process while it writes the checkpoint of step N, after every file but
checkpoint.json is written (kill -9 mid-save).
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time

from vlm_grpoma import cli
from vlm_grpoma.rewards.base import RewardResult
from vlm_grpoma.rewards.registry import register_reward


def _lengths(completions) -> list[float]:
    return [min(len(c.answer_text), 40) / 40 for c in completions]


class Length:
    def score(self, completions, records):
        return RewardResult(_lengths(completions))


class NaNFirst:
    def score(self, completions, records):
        return RewardResult([math.nan] + _lengths(completions)[1:])


class Sleepy:
    def __init__(self) -> None:
        self.slept = False

    def score(self, completions, records):
        if not self.slept and os.environ.get("RANK", "0") == os.environ.get("SLEEP_RANK", "1"):
            self.slept = True
            time.sleep(float(os.environ.get("SLEEP_S", "60")))
        return RewardResult([0.0] * len(completions))


class Kill:
    def __init__(self) -> None:
        self.calls = 0

    def score(self, completions, records):
        self.calls += 1
        if self.calls == int(os.environ.get("KILL_AT_CALL", "0")):
            os.kill(os.getpid(), signal.SIGKILL)
        return RewardResult([0.0] * len(completions))


def _kill_in_save(step: int) -> None:
    from vlm_grpoma.trainer import checkpoint

    real = checkpoint._manifest

    def manifest(folder, timeout_s):
        if folder.name == f".tmp-{checkpoint.checkpoint_name(step)}":
            os.kill(os.getpid(), signal.SIGKILL)
        return real(folder, timeout_s)

    checkpoint._manifest = manifest


class Signal:
    def __init__(self) -> None:
        self.calls = 0

    def score(self, completions, records):
        self.calls += 1
        on_this_rank = os.environ.get("SIGNAL_RANK") in (None, os.environ.get("RANK", "0"))
        if on_this_rank and self.calls == int(os.environ.get("SIGNAL_AT_CALL", "0")):
            os.kill(os.getpid(), signal.Signals[os.environ["SIGNAL"]])
        return RewardResult(_lengths(completions))


FACTORIES = {
    "fault_length": Length,
    "fault_nan": NaNFirst,
    "fault_sleepy": Sleepy,
    "fault_kill": Kill,
    "fault_signal": Signal,
}


def register_fault_rewards() -> None:
    """Register the rewards above (once per process)."""
    from vlm_grpoma.rewards.registry import registered_rewards

    for name, factory in FACTORIES.items():
        if name not in registered_rewards():
            register_reward(name, factory)


def main() -> None:
    register_fault_rewards()
    fault = os.environ.get("FAULT", "")
    if fault.startswith("kill-in-save:"):
        _kill_in_save(int(fault.split(":")[1]))
    if sys.argv[1:2] and sys.argv[1].startswith("--"):  # launch/train.sh passes no subcommand
        sys.argv.insert(1, os.environ.get("COMMAND", "train"))
    sys.exit(cli.main())


if __name__ == "__main__":
    main()
