"""The trainer fixtures (make_config on the tiny model, one torch thread) and its test reward, for GPU tests."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer"))  # length_reward: test_answer_length

from tests.trainer.conftest import make_config, tiny_path  # noqa: E402, F401
