"""Damaged, tampered and half-written checkpoints: refused with one line naming the file, never executed;
``checkpoint.resume=auto`` falls back to the newest intact checkpoint and still ends bitwise-equal to an
uninterrupted run; no crash moment loses the newest checkpoint."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from fault_runs import error_lines, run_cli

from vlm_grpoma.errors import CheckpointError, StorageError
from vlm_grpoma.trainer import checkpoint as ckpt
from vlm_grpoma.trainer.checkpoint import list_checkpoints
from vlm_grpoma.trainer.elastic import plan_resume
from vlm_grpoma.trainer.grpo_ma import GRPOMATrainer

MODEL_STATES = "deepspeed/state/mp_rank_00_model_states.pt"


def parameters(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.engine.module.named_parameters()}


@pytest.fixture(scope="module")
def straight(tmp_path_factory, make_config_module):
    """The reference: 4 uninterrupted steps."""
    trainer = GRPOMATrainer(make_config_module(tmp_path_factory.mktemp("straight"), "train.steps=4"))
    trainer.train()
    return parameters(trainer)


@pytest.fixture(scope="module")
def make_config_module(tiny_path, shapes_path):
    from fault_runs import BASE

    from vlm_grpoma.config import load_config

    def make(out_dir, *extra):
        return load_config(
            None,
            [
                f"model.name_or_path={tiny_path}",
                f"data.train_path={shapes_path}",
                f"logging.output_dir={out_dir}",
                *BASE,
                *extra,
            ],
        )

    return make


@pytest.fixture(scope="module")
def two_saved(tmp_path_factory, make_config_module) -> Path:
    """A run folder with intact checkpoints of steps 1 and 2 (copy it before damaging it)."""
    out = tmp_path_factory.mktemp("two") / "run"
    GRPOMATrainer(
        make_config_module(out, "train.steps=2", "checkpoint.save_every=1", "checkpoint.keep_last=3")
    ).train()
    assert [p.name for p in list_checkpoints(out)] == ["step-00000001", "step-00000002"]
    return out


@pytest.fixture
def run_copy(two_saved, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(two_saved, copy)
    return copy


def _rewrite_manifest(folder: Path, name: str) -> None:
    """What a careful attacker does: make the manifest agree with the planted file."""
    meta = json.loads((folder / "checkpoint.json").read_text())
    data = (folder / name).read_bytes()
    meta["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / "checkpoint.json").write_text(json.dumps(meta))


class _Payload:
    """Unpickling this runs a shell command that creates ``marker`` (any command would run the same way)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch '{self.marker}'",))


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


#: Eight kinds of damage to step 2: (what, how, the file the error must name).
DAMAGE = {
    "truncated DeepSpeed state": (
        lambda d: (d / MODEL_STATES).write_bytes((d / MODEL_STATES).read_bytes()[:999]),
        MODEL_STATES,
    ),
    "deleted model.safetensors": (
        lambda d: (d / "model/model.safetensors").unlink(),
        "model/model.safetensors",
    ),
    "flipped byte in model.safetensors": (
        lambda d: _flip_byte(d / "model/model.safetensors"),
        "model/model.safetensors",
    ),
    "deleted rank RNG file": (lambda d: (d / "rng/rank-00000.pt").unlink(), "rng/rank-00000.pt"),
    # a file dropped into the folder after the save would be loaded unchecked (before: accepted)
    "unlisted extra shard": (
        lambda d: (d / "model/model-extra.safetensors").write_bytes(b"\0" * 16),
        "model/model-extra.safetensors: not in the checkpoint's manifest",
    ),
    "garbage trainer_state.pt": (lambda d: _flip_byte(d / "trainer_state.pt"), "trainer_state.pt"),
    "checkpoint.json not JSON": (
        lambda d: (d / "checkpoint.json").write_text("{not json"),
        "checkpoint.json",
    ),
    "checkpoint.json without world_size": (
        lambda d: (d / "checkpoint.json").write_text(
            json.dumps(
                {
                    k: v
                    for k, v in json.loads((d / "checkpoint.json").read_text()).items()
                    if k != "world_size"
                }
            )
        ),
        "checkpoint.json",
    ),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damaged_checkpoint_is_refused_with_one_line_naming_the_file(
    kind, run_copy, make_config_module, monkeypatch
):
    damage, named = DAMAGE[kind]
    step2 = run_copy / "checkpoints" / "step-00000002"
    damage(step2)
    monkeypatch.setattr(
        "vlm_grpoma.trainer.base.build_engine",
        lambda *a, **k: pytest.fail("the model loaded before the check"),
    )
    with pytest.raises(CheckpointError) as caught:
        GRPOMATrainer(make_config_module(run_copy, "train.steps=4", f"checkpoint.resume={step2}"))
    message = str(caught.value)
    assert "\n" not in message and message.startswith("checkpoint.resume: ")
    assert str(step2 / named) in message, message


def test_auto_falls_back_to_the_newest_intact_checkpoint_and_ends_bitwise_equal(
    run_copy, make_config_module, straight, caplog
):
    (run_copy / "checkpoints" / "step-00000002" / "model" / "model.safetensors").unlink()
    trainer = GRPOMATrainer(make_config_module(run_copy, "train.steps=4", "checkpoint.resume=auto"))
    assert trainer.step == 1
    assert "skipped step-00000002, damaged: " in caplog.text and "resuming from step-00000001" in caplog.text
    assert (run_copy / "checkpoints" / "damaged-step-00000002").is_dir()  # kept for inspection, never resumed
    trainer.train()
    got = parameters(trainer)
    assert all(torch.equal(got[name], value) for name, value in straight.items())
    rows = [json.loads(line)["step"] for line in (run_copy / "metrics.jsonl").read_text().splitlines()]
    assert rows == [1, 2, 3, 4]  # step 2 was redone: its old row is gone


def test_auto_with_every_checkpoint_damaged_is_an_error_not_a_restart(run_copy, make_config_module):
    for step in ("step-00000001", "step-00000002"):
        _flip_byte(run_copy / "checkpoints" / step / MODEL_STATES)
    with pytest.raises(CheckpointError, match=r"^checkpoint\.resume=auto: every checkpoint in .* is damaged"):
        GRPOMATrainer(make_config_module(run_copy, "train.steps=4", "checkpoint.resume=auto"))


@pytest.mark.parametrize("planted", [MODEL_STATES, "trainer_state.pt", "rng/rank-00000.pt"])
def test_a_planted_payload_is_refused_and_never_runs(planted, run_copy, make_config_module, tmp_path):
    step2 = run_copy / "checkpoints" / "step-00000002"
    marker = tmp_path / "MARKER"
    state = torch.load(step2 / planted, weights_only=False)  # the test trusts the file it wrote
    state["extra"] = _Payload(marker)
    torch.save(state, step2 / planted)
    _rewrite_manifest(step2, planted)
    pickle.loads(pickle.dumps(_Payload(marker)))
    assert marker.exists()  # the payload works when unpickled with arbitrary globals
    marker.unlink()
    with pytest.raises(CheckpointError, match=r"refused to load: it holds posix\.system"):
        trainer = GRPOMATrainer(make_config_module(run_copy, "train.steps=4", f"checkpoint.resume={step2}"))
        trainer.train()
    assert not marker.exists()


@pytest.mark.slow  # a CLI process end to end (~5-11 s)
def test_planted_payload_through_the_cli_is_one_line_and_exit_1(run_copy, overrides, tmp_path):
    step2 = run_copy / "checkpoints" / "step-00000002"
    marker = tmp_path / "MARKER"
    state = torch.load(step2 / MODEL_STATES, weights_only=False)
    state["extra"] = _Payload(marker)
    torch.save(state, step2 / MODEL_STATES)
    _rewrite_manifest(step2, MODEL_STATES)
    line = _resume_error_line(step2, run_copy, overrides, tmp_path)
    assert line.startswith(
        f"vlm-grpoma train: error: {step2 / MODEL_STATES}: refused to load: it holds posix.system"
    )
    assert not marker.exists()


def _resume_error_line(step: Path, run: Path, overrides, tmp_path: Path) -> str:
    """``vlm-grpoma train ... checkpoint.resume=STEP`` in a subprocess: exit 1, no traceback, its one error line."""
    config = tmp_path / "c.yaml"
    config.write_text("{}\n")
    result = run_cli(
        "train", "--config", str(config), *overrides(run, "train.steps=4", f"checkpoint.resume={step}")
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    (line,) = error_lines(result.stderr)
    return line


@pytest.mark.slow  # a CLI process end to end (~5-11 s)
@pytest.mark.parametrize("damaged", [MODEL_STATES, "trainer_state.pt"])
def test_damage_the_manifest_agrees_with_is_still_one_line_through_the_cli(
    damaged, run_copy, overrides, tmp_path
):
    """A checkpoint whose manifest was rewritten after the damage (or copied with it): the loader itself
    refuses the file, as the command line reports it."""
    step2 = run_copy / "checkpoints" / "step-00000002"
    (step2 / damaged).write_bytes((step2 / damaged).read_bytes()[:999])
    _rewrite_manifest(step2, damaged)
    line = _resume_error_line(step2, run_copy, overrides, tmp_path)
    assert line.startswith(f"vlm-grpoma train: error: {step2 / damaged}: cannot be read ("), line


def test_a_crash_between_the_renames_of_a_re_save_keeps_the_step(run_copy, make_config_module, monkeypatch):
    """Saving step 2 again (resumed from step 1 in the same folder, so the first step 2 was set aside as
    abandoned) dies before the new copy is renamed into place: nothing is lost, the abandoned copy is kept and
    never resumed from, and the next run resumes step 1 and tidies up."""
    real_rename = Path.rename

    def crash_on_the_second_rename(self, target):
        if self.name == ".tmp-step-00000002":
            raise OSError("simulated crash between the renames")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", crash_on_the_second_rename)
    step1 = run_copy / "checkpoints" / "step-00000001"
    trainer = GRPOMATrainer(
        make_config_module(run_copy, "train.steps=2", "checkpoint.keep_last=3", f"checkpoint.resume={step1}")
    )
    with pytest.raises(OSError, match="simulated crash"):
        trainer.train()
    monkeypatch.undo()
    root = run_copy / "checkpoints"
    assert not (root / "step-00000002").exists() and (root / "abandoned-step-00000002").is_dir()
    assert [p.name for p in list_checkpoints(run_copy)] == ["step-00000001"]
    resumed = GRPOMATrainer(
        make_config_module(run_copy, "train.steps=3", "checkpoint.keep_last=3", "checkpoint.resume=auto")
    )
    assert resumed.step == 1
    resumed.train()
    names = [p.name for p in list_checkpoints(run_copy)]
    assert names[0] == "step-00000001" and names[-1] == "step-00000003"
    assert not list(root.glob(".old-*")) and not list(root.glob(".tmp-*"))
    assert (root / "abandoned-step-00000002").is_dir()


def test_every_file_is_synced_before_the_checkpoint_is_renamed_into_place(
    make_config_module, tmp_path, monkeypatch
):
    events: list[tuple[str, str]] = []
    real_fsync, real_rename = os.fsync, Path.rename

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def rename(self, target):
        events.append(("rename", f"{self} -> {target}"))
        return real_rename(self, target)

    monkeypatch.setattr(os, "fsync", fsync)  # the os module every writer calls
    monkeypatch.setattr(Path, "rename", rename)
    trainer = GRPOMATrainer(make_config_module(tmp_path / "run", "train.steps=1"))
    trainer.train()
    monkeypatch.undo()
    final = tmp_path / "run" / "checkpoints" / "step-00000001"
    into_place = next(
        i for i, (kind, what) in enumerate(events) if kind == "rename" and what.endswith(str(final))
    )
    synced = {what for kind, what in events[:into_place] if kind == "fsync"}
    tmp = final.with_name(".tmp-step-00000001")
    written = {str(tmp / name) for name in json.loads((final / "checkpoint.json").read_text())["files"]}
    assert written <= synced, sorted(written - synced)


# ---------------------------------------------------------------------------------------------------------
# Round 3: no silent restart or rollback, the checkpoints folder checked up front, resume mismatches said


def test_rerunning_auto_with_only_damaged_checkpoints_left_refuses_until_told_to_restart(
    run_copy, make_config_module
):
    for step in ("step-00000001", "step-00000002"):
        _flip_byte(run_copy / "checkpoints" / step / MODEL_STATES)
    with pytest.raises(CheckpointError, match="every checkpoint in"):
        GRPOMATrainer(make_config_module(run_copy, "train.steps=4", "checkpoint.resume=auto"))
    metrics = (run_copy / "metrics.jsonl").read_text()
    with pytest.raises(
        CheckpointError
    ) as again:  # the same command again: before, a silent restart at step 0
        GRPOMATrainer(make_config_module(run_copy, "train.steps=4", "checkpoint.resume=auto"))
    assert "only damaged ones (damaged-step-00000001, damaged-step-00000002)" in str(again.value)
    assert "checkpoint.resume=restart" in str(again.value) and "\n" not in str(again.value)
    assert (run_copy / "metrics.jsonl").read_text() == metrics  # nothing emptied

    trainer = GRPOMATrainer(make_config_module(run_copy, "train.steps=4", "checkpoint.resume=restart"))
    assert trainer.step == 0 and (run_copy / "metrics.jsonl").read_text() == ""
    assert (run_copy / "checkpoints" / "damaged-step-00000002").is_dir()  # still there for inspection


def test_restart_in_a_folder_with_intact_checkpoints_sets_them_aside(run_copy, make_config_module, caplog):
    trainer = GRPOMATrainer(make_config_module(run_copy, "train.steps=4", "checkpoint.resume=restart"))
    assert trainer.step == 0 and list_checkpoints(run_copy) == []
    names = sorted(p.name for p in (run_copy / "checkpoints").iterdir())
    assert names == ["abandoned-step-00000001", "abandoned-step-00000002"]
    assert "moved to abandoned-step-00000002" in caplog.text


def test_resuming_an_older_checkpoint_moves_the_later_ones_aside_named(run_copy, make_config_module, caplog):
    step1 = run_copy / "checkpoints" / "step-00000001"
    trainer = GRPOMATrainer(make_config_module(run_copy, "train.steps=3", f"checkpoint.resume={step1}"))
    assert trainer.step == 1
    assert list_checkpoints(run_copy) == [step1]  # eval and a later resume=auto no longer see step 2
    assert (run_copy / "checkpoints" / "abandoned-step-00000002" / "checkpoint.json").is_file()
    assert "skipped step-00000002, later than step-00000001; moved to abandoned-step-00000002" in caplog.text
    trainer.train()
    assert [p.name for p in list_checkpoints(run_copy)] == ["step-00000001", "step-00000003"]


def _symlinked_step(run: Path) -> str:
    (run / "checkpoints" / "step-00000009").symlink_to(run / "checkpoints" / "step-00000001")
    return "step-00000009: a symlink"


def _checkpoints_file(run: Path) -> str:
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").write_text("not a folder")
    return "checkpoints is not a folder"


@pytest.mark.parametrize("plant", [_symlinked_step, _checkpoints_file], ids=["symlinked step", "file"])
def test_a_checkpoints_folder_the_first_save_would_trip_on_is_refused_up_front(
    plant, run_copy, make_config_module
):
    expected = plant(run_copy)
    with pytest.raises((CheckpointError, StorageError)) as refused:
        GRPOMATrainer(make_config_module(run_copy, "train.steps=4", "checkpoint.resume=auto"))
    assert expected in str(refused.value) and "\n" not in str(refused.value)


def test_a_stray_tmp_file_does_not_stop_the_save(run_copy, make_config_module):
    (run_copy / "checkpoints" / ".tmp-step-00000003").write_text("a stray file")
    trainer = GRPOMATrainer(make_config_module(run_copy, "train.steps=3", "checkpoint.resume=auto"))
    trainer.train()
    assert list_checkpoints(run_copy)[-1].name == "step-00000003"
    assert not (run_copy / "checkpoints" / ".tmp-step-00000003").exists()


def _edit_meta(folder: Path, edit) -> None:
    meta = json.loads((folder / "checkpoint.json").read_text())
    edit(meta)
    (folder / "checkpoint.json").write_text(json.dumps(meta))


HAND_EDITS = {
    "manifest name ../x": (lambda m: m["files"].update({"../x": {"size": 1, "sha256": "0"}}), "outside"),
    "manifest name /proc/kmsg": (
        lambda m: m["files"].update({"/proc/kmsg": {"size": 1, "sha256": "0"}}),
        "outside",
    ),
    "int manifest entry": (lambda m: m["files"].update({"trainer_state.pt": 7}), "has no size and sha256"),
    "string world_size": (lambda m: m.update(world_size="1"), "world_size '1' is not an integer"),
    "negative step": (lambda m: m.update(step=-2), "step -2 is not an integer"),
}


@pytest.mark.parametrize("edit", list(HAND_EDITS))
def test_a_hand_edited_checkpoint_json_is_one_line(edit, run_copy):
    step2 = run_copy / "checkpoints" / "step-00000002"
    change, expected = HAND_EDITS[edit]
    _edit_meta(step2, change)
    with pytest.raises(CheckpointError) as refused:
        ckpt.verify_checkpoint(step2)
    assert expected in str(refused.value) and str(step2 / "checkpoint.json") in str(refused.value)


def test_a_deeply_nested_checkpoint_json_is_one_line(run_copy):
    step2 = run_copy / "checkpoints" / "step-00000002"
    (step2 / "checkpoint.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CheckpointError, match="nested too deeply"):
        ckpt.read_meta(step2)


@pytest.mark.parametrize(
    "state", [{"step": 2, "data": [], "metrics": {}}, {"step": 2, "data": {}, "metrics": {}}, {"step": 5}]
)
def test_a_mis_shaped_trainer_state_is_one_line(state, run_copy, make_config_module):
    step2 = run_copy / "checkpoints" / "step-00000002"
    full = {"data": {}, "metrics": {}, **state}
    torch.save(full, step2 / "trainer_state.pt")
    _rewrite_manifest(step2, "trainer_state.pt")
    with pytest.raises(CheckpointError) as refused:
        GRPOMATrainer(make_config_module(run_copy, "train.steps=4", f"checkpoint.resume={step2}"))
    assert str(step2 / "trainer_state.pt") in str(refused.value) and "\n" not in str(refused.value)


def test_resume_with_another_zero_stage_is_one_line(run_copy, make_config_module):
    with pytest.raises(
        CheckpointError, match=r"saved with ZeRO stage 0, resuming with deepspeed.zero_stage=2"
    ):
        GRPOMATrainer(
            make_config_module(run_copy, "train.steps=4", "checkpoint.resume=auto", "deepspeed.zero_stage=2")
        )


@pytest.mark.parametrize(("saved", "resumed"), [(2, 0), (0, 2), (1, 0), (3, 2), (1, 3), (0, 3)])
def test_a_zero_stage_change_deepspeed_cannot_carry_is_one_line_either_way(saved, resumed, tmp_path):
    """L3 as reported was 2 -> 0 (an AttributeError): every pair across the 0 | 1/2 | 3 groups, both ways, is
    refused in one line naming both stages, even with elastic resume on."""
    with pytest.raises(CheckpointError) as refused:
        plan_resume(
            tmp_path, {"world_size": 2, "zero_stage": saved}, 1, resumed, elastic=True, tag="global_step2"
        )
    message = str(refused.value)
    assert f"saved with ZeRO stage {saved}, resuming with deepspeed.zero_stage={resumed}" in message
    assert f"set deepspeed.zero_stage={saved}" in message and "\n" not in message


def test_zero_1_and_2_resume_into_each_other_at_another_world_size(tmp_path):
    plan = plan_resume(tmp_path, {"world_size": 2, "zero_stage": 2}, 1, 1, elastic=True, tag="global_step2")
    assert (plan.saved_world, plan.saved_stage, plan.world, plan.stage) == (2, 2, 1, 1)


def test_resume_with_another_model_under_frozen_weights_is_refused(
    run_copy, make_config_module, tiny_path, tmp_path
):
    other = shutil.copytree(tiny_path, tmp_path / "other-model")
    with pytest.raises(
        CheckpointError, match=f"trained on model.name_or_path={tiny_path}, resuming with {other}"
    ):
        GRPOMATrainer(
            make_config_module(
                run_copy, "train.steps=4", "checkpoint.resume=auto", f"model.name_or_path={other}"
            )
        )


def test_resume_with_another_learning_rate_warns_that_the_saved_schedule_wins(
    run_copy, make_config_module, caplog
):
    GRPOMATrainer(
        make_config_module(run_copy, "train.steps=4", "checkpoint.resume=auto", "optim.learning_rate=5e-4")
    )
    assert "optim.learning_rate=0.0005 differs from the 0.001" in caplog.text
    assert "the checkpoint's learning-rate schedule wins" in caplog.text
