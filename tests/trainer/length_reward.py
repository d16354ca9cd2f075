"""A reward a random tiny model's samples actually vary on (longer answers score more), so GRPO-MA steps change
the weights; and, as a script, ``vlm-grpoma train`` with that reward registered::

    length_reward.py --config CONFIG.yaml [key=value ...]      # also as launch/train.sh's TRAIN_SCRIPT
"""

from __future__ import annotations

import sys

from vlm_grpoma.rewards import RewardResult, register_reward


class AnswerLength:
    """Answer length in characters, capped at 40, scaled to [0, 1]."""

    def score(self, completions, records):
        total = [min(len(c.answer_text), 40) / 40 for c in completions]
        return RewardResult(total, {"chars": [float(len(c.answer_text)) for c in completions]})


register_reward("test_answer_length", AnswerLength)


if __name__ == "__main__":
    from vlm_grpoma.cli import main

    sys.exit(main(["train", *sys.argv[1:]]))
