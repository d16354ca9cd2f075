"""What ``eval`` and ``manip-eval`` load: the model folder of a run, step or model path, the run's saved config
found from it (and only from the trainer's layout), and the default splits."""

from __future__ import annotations

import pytest

from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.errors import CheckpointError, CommandError
from vlm_grpoma.eval.grounding import eval_splits
from vlm_grpoma.eval.loading import eval_config, model_folder, run_config_path


def make_run(root, steps, complete=True):
    for step in steps:
        model = root / "checkpoints" / f"step-{step:08d}" / "model"
        model.mkdir(parents=True)
        (model / "adapter_config.json").write_text("{}")
        if complete:
            (model.parent / "checkpoint.json").write_text("{}")
    return root


def test_run_step_and_model_folders_resolve_to_the_newest_complete_model(tmp_path):
    run = make_run(tmp_path / "run", [9, 10, 100])
    make_run(run, [200], complete=False)  # a crash mid-save: never picked
    newest = run / "checkpoints" / "step-00000100" / "model"
    assert model_folder(run) == newest
    assert model_folder(newest.parent) == newest and model_folder(newest) == newest
    with pytest.raises(CheckpointError, match="not a folder"):
        model_folder(tmp_path / "missing")
    with pytest.raises(CheckpointError, match="neither a model folder"):
        model_folder(run / "checkpoints")
    with pytest.raises(CheckpointError, match="without a complete checkpoint"):
        model_folder(make_run(tmp_path / "crashed", [1], complete=False))


def test_saved_config_is_found_only_in_the_trainers_layout(tmp_path):
    run = make_run(tmp_path / "run", [5])
    model = model_folder(run)
    assert run_config_path(model) is None
    (run / "config.yaml").write_text("rollout: {max_answer_tokens: 7}\nmodel: {max_pixels: 12544}\n")
    assert run_config_path(model) == (run / "config.yaml").resolve()
    resolved = eval_config(model, overrides=["rollout.max_thought_tokens=3"])
    assert "(the run's saved config)" in resolved.source
    assert (resolved.config.rollout.max_answer_tokens, resolved.config.rollout.max_thought_tokens) == (7, 3)
    assert resolved.config.model.max_pixels == 12544
    other = tmp_path / "elsewhere" / "model"  # a model folder not written by a run: no config found above it
    other.mkdir(parents=True)
    (tmp_path / "config.yaml").write_text("seed: 3\n")
    assert run_config_path(other) is None and "the defaults" in eval_config(other).source
    explicit = tmp_path / "mine.yaml"
    explicit.write_text("seed: 4\n")
    assert eval_config(model, str(explicit)).config.seed == 4


def test_a_saved_config_does_not_choose_code_servers_or_where_results_go(tmp_path):
    """Before: a downloaded run folder's config.yaml turned on trust_remote_code (the checkpoint's own Python
    ran) and sent every evaluated image to a server of its choosing. Its data paths are still read."""
    run = make_run(tmp_path / "downloaded", [5])
    (run / "config.yaml").write_text(
        "model: {trust_remote_code: true, max_pixels: 12544}\n"
        "rollout: {backend: vllm_server, server: {urls: ['http://203.0.113.9:80'], token_file: /tmp/t}}\n"
        "logging: {output_dir: /home/someone/.config}\n"
        "data: {eval_path: held-out/records.jsonl}\n"
    )
    resolved = eval_config(model_folder(run))
    config = resolved.config
    assert not config.model.trust_remote_code and config.rollout.backend == "hf"
    assert config.rollout.server.urls == [] and config.rollout.server.token_file == ""
    assert config.logging.output_dir == str(run.resolve())  # results beside the run, wherever it lives
    assert config.model.max_pixels == 12544 and config.data.eval_path == "held-out/records.jsonl"
    assert (
        "not taken from it: model.trust_remote_code, rollout.server.urls, rollout.server.token_file, "
        "rollout.backend (a run folder does not choose code to run" in resolved.source
    )
    # what the user passes is theirs
    mine = eval_config(
        model_folder(run), overrides=["model.trust_remote_code=true", "logging.output_dir=out"]
    )
    assert mine.config.model.trust_remote_code and mine.config.logging.output_dir == "out"
    assert "model.trust_remote_code" not in mine.source


def test_default_splits_are_the_held_out_ones_in_file_order():
    records = [
        Record(f"r{i}", "x.png", "detection", "p", 1, 1, None, split=s)
        for i, s in enumerate(["train", "val", "testA", "train", "testB"])
    ]
    assert eval_splits(records, None, "train") == ["val", "testA", "testB"]
    assert eval_splits(records, "testB, val", "train") == ["testB", "val"]
    with pytest.raises(CommandError, match="no records of split test"):
        eval_splits(records, "test", "train")
    with pytest.raises(CommandError, match="only the training split"):
        eval_splits(records[:1], None, "train")
