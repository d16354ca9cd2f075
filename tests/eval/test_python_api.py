"""The training guide's Python API example (build a ``Config``, ``GRPOMATrainer(config).train()``, ``evaluate``) runs as
written, with only its model, data and output paths pointed at a tiny model and synthetic shapes."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

TRAINING_GUIDE = Path(__file__).resolve().parents[2] / "docs" / "training.md"


def _readme_example() -> str:
    section = TRAINING_GUIDE.read_text(encoding="utf-8").split("## From Python", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow  # two training steps and an evaluation (~25 s of CPU)
def test_the_training_guides_python_example_trains_and_evaluates(
    tmp_path, tiny_model_dir, monkeypatch, capsys
):
    from vlm_grpoma.datasets.synthetic.shapes import EASY, generate_shapes

    torch.set_num_threads(1)
    data = generate_shapes("detection", 4, tmp_path / "shapes", seed=2, config=EASY)
    code = _readme_example()
    paths = {"MODEL": tiny_model_dir("qwen2_5_vl"), "DATA": data, "OUT": tmp_path / "run"}
    for name, value in paths.items():
        code, n = re.subn(rf'^{name} = ".*"$', f"{name} = {str(value)!r}", code, flags=re.M)
        assert n == 1, f"the example no longer sets {name}"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "docs/training.md:From Python", "exec"), namespace)
    history, report = namespace["history"], namespace["report"]
    assert len(history) == 2 and math.isfinite(history[-1]["reward/total_mean"])
    assert json.loads((tmp_path / "run" / "eval" / "metrics.json").read_text())["records"] == 4
    assert "detection/Acc@0.5" in report.scalars() or "detection/mean_iou" in report.scalars()
    # the template of the example is what the trained adapter asks
    record = namespace["read_records"](str(data))[0]
    user = namespace["trainer"].adapter.messages(record)[-1]["content"][-1]["text"]
    assert user.startswith(f"Locate {record.prompt}.")
    assert str(history[-1]["reward/total_mean"]) in capsys.readouterr().out


def test_the_python_api_checks_optional_packages_before_any_model_loads(tmp_path, monkeypatch):
    """A notebook user gets the CLI's one line for a missing vLLM, not an import error after the model loaded."""
    from vlm_grpoma.config import Config, DataConfig, LoggingConfig, ModelConfig, RolloutConfig
    from vlm_grpoma.errors import MissingDependencyError
    from vlm_grpoma.trainer.grpo_ma import GRPOMATrainer

    monkeypatch.setattr("vlm_grpoma.config.dependencies._installed", lambda module: module != "vllm")
    config = Config(
        model=ModelConfig(name_or_path=str(tmp_path / "no-model-here")),
        data=DataConfig(train_path=str(tmp_path / "records.jsonl")),
        rollout=RolloutConfig(backend="vllm"),
        logging=LoggingConfig(output_dir=str(tmp_path / "run")),
    )
    with pytest.raises(MissingDependencyError, match=r"^rollout.backend=vllm needs vLLM"):
        GRPOMATrainer(config)
    assert not (tmp_path / "run").exists()  # refused before the output folder was claimed
