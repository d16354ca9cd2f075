"""The manipulation success rule, as pure functions of what an episode measured.

ManipLLM's rule (``test/test_one_stick_clean.py``): the target joint moved ``|dq| > 0.03`` or more than half
its range, and for a pull the contact point moved along the intended direction (cosine > 0.3). Its data
collection keeps only demonstrations passing a stricter version (``data_collection/code/collect_data.py``:
``|dq| > 0.1``, cosine > 0.5).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SuccessRule:
    move_threshold: float = 0.03  # joint units: radians or object units
    range_fraction: float = 0.5
    direction_cosine: float = 0.3

    def judge(self, delta_q: float, joint_range: float, cosine: float, primitive: str) -> bool:
        """Whether a joint change ``delta_q`` (signed or not) over a joint of range ``joint_range`` and a contact
        motion at ``cosine`` to the intended direction counts as success for ``primitive`` (pull or push)."""
        moved = abs(delta_q)
        moved_enough = moved > self.move_threshold or moved > self.range_fraction * max(joint_range, 1e-9)
        return bool(moved_enough and (primitive != "pull" or cosine > self.direction_cosine))


TEST_RULE = SuccessRule()
COLLECTION_RULE = SuccessRule(move_threshold=0.1, range_fraction=0.5, direction_cosine=0.5)


def direction_cosine(start: np.ndarray, end: np.ndarray, intended: np.ndarray) -> float:
    """Cosine between a point's motion ``end - start`` and the ``intended`` direction; 0 when it did not move."""
    moved = np.asarray(end, dtype=np.float64) - np.asarray(start, dtype=np.float64)
    intended = np.asarray(intended, dtype=np.float64)
    length = float(np.linalg.norm(moved))
    if length <= 1e-9:
        return 0.0
    return float(moved @ intended / (length * float(np.linalg.norm(intended))))
