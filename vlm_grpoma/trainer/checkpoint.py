"""Checkpoints: a Hugging Face model folder plus the trainer state for exact resume, written atomically and
verified before they are resumed from.

Layout of ``<output_dir>/checkpoints/step-00000010/``::

    model/                 save_pretrained (safetensors) + processor; with LoRA the adapter, or merged weights
    deepspeed/state/       DeepSpeed save_checkpoint: trainable parameters, optimizer (ZeRO partitions), LR
                           scheduler; frozen parameters (a LoRA base, a frozen vision tower) are left out and
                           come back from model.name_or_path on resume
    rng/rank-00000.pt      python / numpy / torch (+cuda) RNG states of each rank
    trainer_state.pt       TrainerState (step, data position, metric trackers)
    checkpoint.json        written last: format, step, world size... and the manifest (size and SHA-256 of
                           every other file); a folder without it is incomplete and never resumed from
    universal/             only after an elastic resume: DeepSpeed's universal checkpoint of deepspeed/state
                           with its own checkpoint.json (see :mod:`~vlm_grpoma.trainer.elastic`)

Writing: every rank writes into ``.tmp-step-…`` (the output folder must be shared by all ranks); the ranks
share the hashing and fsync of the files, rank 0 writes and syncs checkpoint.json, renames the folder into
place and syncs its parent. Re-saving a step first renames the old copy to ``.old-step-…``, which stands for
that step until the new copy is in place, so at no moment is the step missing.

Loading: the manifest is checked first (sizes on every rank, hashes shared among the ranks), then every
``.pt`` file is unpickled with ``weights_only=True`` (DeepSpeed's through :mod:`~vlm_grpoma.trainer.safe_load`),
so a damaged or altered checkpoint is refused with one line and never runs code.
``checkpoint.resume=auto`` takes the newest checkpoint that passes, says which ones it skipped and moves them
aside (``damaged-step-…``); with only damaged ones left it refuses rather than start again from step 0, which
``checkpoint.resume=restart`` asks for. Resuming from a checkpoint moves the later ones of the output folder
aside (``abandoned-step-…``), so neither ``eval`` nor a later resume takes the abandoned line of training.
Same world size and ZeRO stage: the resume is exact, bitwise. Another world size (or ZeRO 1 <-> 2) is an
elastic resume (:mod:`~vlm_grpoma.trainer.elastic`): the same weights, optimizer state, schedule and data
position, converted once through DeepSpeed's universal checkpoint where the optimizer state is partitioned;
the same prompts per step, split over the new ranks, so not bitwise the run it would have been.
What a resume cannot honour is said up front, before the model loads: ZeRO 0 <-> 1/2/3 or 3 <-> 1/2, any
change of world size or stage under ``checkpoint.elastic_resume=false``, another model under frozen weights
(errors), another learning rate (a warning: the saved schedule wins).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vlm_grpoma.config import Config
from vlm_grpoma.errors import CheckpointError, StorageError
from vlm_grpoma.models.sources import local_path, record_portable_base
from vlm_grpoma.run_layout import (
    ABANDONED_PREFIX,
    DAMAGED_PREFIX,
    DEEPSPEED_DIR,
    META_FILE,
    MODEL_DIR,
    OLD_PREFIX,
    RNG_DIR,
    STEP_GLOB,
    TMP_PREFIX,
    TRAINER_STATE_FILE,
    checkpoint_name,
    checkpoint_root,
    rng_file,
    step_of,
)
from vlm_grpoma.trainer.checkpoint_manifest import FORMAT_VERSION, read_meta, verify_checkpoint
from vlm_grpoma.trainer.checkpoint_manifest import build_manifest as _manifest
from vlm_grpoma.trainer.checkpoint_manifest import rank as _rank
from vlm_grpoma.trainer.collectives import barrier
from vlm_grpoma.trainer.elastic import (
    ResumePlan,
    plan_resume,
    seed_new_rank,
    universal_folder,
    universal_loading,
)
from vlm_grpoma.trainer.engine import TrainingEngine
from vlm_grpoma.trainer.run_dir import atomic_write_text, fsync_dir, storage_errors
from vlm_grpoma.trainer.safe_load import safe_torch_load, use_safe_checkpoint_loading

log = logging.getLogger(__name__)

_DS_TAG = "state"
#: ``checkpoint.resume`` values besides a checkpoint's path.
RESUME_NONE, RESUME_AUTO, RESUME_RESTART = "none", "auto", "restart"


@dataclass
class TrainerState:
    """What the loop needs to continue: steps done, data position, metric trackers (plain types / tensors)."""

    step: int
    data: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------------
# RNG states in weights_only-loadable form (plain types and tensors only)


def rng_state() -> dict[str, Any]:
    """The python, numpy, torch (and CUDA) generator states of this process."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(state["python"])
    np_state = state["numpy"]
    np.random.set_state(
        (
            np_state["kind"],
            np_state["keys"].numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------------------------------------------
# Hugging Face export (ZeRO-3 gathered, LoRA merged on request)


def _full_state_dict(engine: TrainingEngine) -> dict[str, torch.Tensor] | None:
    """The unwrapped module's full state dict on rank 0 (None elsewhere); all ranks must call under ZeRO-3."""
    if engine.zero_stage == 3:
        return engine.deepspeed._zero3_consolidated_16bit_state_dict()
    if _rank() != 0:
        return None
    return {k: v.detach().cpu() for k, v in engine.module.state_dict().items()}


def merged_lora_state_dict(
    peft_model: torch.nn.Module, state: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Base-model state dict with every LoRA delta ``B @ A * scaling`` added to its weight, from ``state``.

    ``state`` is the PeftModel's own state dict (possibly gathered from ZeRO-3 partitions); the model is only
    read for adapter names and scalings, so nothing is mutated (merge/unmerge in place would perturb weights).
    """
    from peft.tuners.lora import LoraLayer

    adapter = peft_model.active_adapter
    prefix = "base_model.model."
    merged = {}
    scalings = {
        f"{prefix}{name}": m.scaling[adapter]
        for name, m in peft_model.base_model.model.named_modules()
        if isinstance(m, LoraLayer) and adapter in m.lora_A
    }
    for key, value in state.items():
        if ".lora_" in key or ".original_module." in key:
            continue
        name = key[len(prefix) :] if key.startswith(prefix) else key
        name = name.replace(f".modules_to_save.{adapter}.", ".").replace(".base_layer.", ".")
        layer = key.rsplit(".base_layer.", 1)[0] if ".base_layer." in key else None
        if layer in scalings and key.endswith(".base_layer.weight"):
            a = state[f"{layer}.lora_A.{adapter}.weight"].float()
            b = state[f"{layer}.lora_B.{adapter}.weight"].float()
            value = (value.float() + (b @ a) * scalings[layer]).to(value.dtype)
        merged[name] = value
    return merged


def save_model(engine: TrainingEngine, out: Path, *, processor: Any = None, merge_lora: bool = False) -> None:
    """``save_pretrained`` of the trained model (safetensors) and processor into ``out``; all ranks call."""
    state = _full_state_dict(engine)
    if _rank() != 0:
        return
    module = engine.module
    if engine.is_lora and merge_lora:
        module.get_base_model().save_pretrained(out, state_dict=merged_lora_state_dict(module, state))
    else:
        module.save_pretrained(out, state_dict=state)
        if engine.is_lora:
            record_portable_base(out)
    if processor is not None:
        processor.save_pretrained(out)


# ---------------------------------------------------------------------------------------------------------
# Save / find / load


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints under ``output_dir`` (with checkpoint.json), oldest first, one per step.

    A ``.old-step-N`` left by a crash during a re-save stands for step N when ``step-N`` is absent.
    """
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    by_step: dict[int, Path] = {}
    for path in sorted(root.iterdir(), key=lambda p: p.name.startswith(OLD_PREFIX)):  # step-N first
        step = step_of(path.name)
        if step is not None and step not in by_step and (path / META_FILE).is_file():
            by_step[step] = path
    return [by_step[step] for step in sorted(by_step)]


def _tidy(root: Path) -> None:
    """Before a save (rank 0): remove half-written folders; put back an old copy whose re-save never finished."""
    for path in root.iterdir():
        if path.name.startswith(TMP_PREFIX):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        elif path.name.startswith(OLD_PREFIX):
            final = root / path.name[len(OLD_PREFIX) :]
            if (final / META_FILE).is_file():
                shutil.rmtree(path)
            else:
                if final.exists():
                    shutil.rmtree(final)
                path.rename(final)


def save_checkpoint(
    engine: TrainingEngine,
    output_dir: str | Path,
    state: TrainerState,
    *,
    processor: Any = None,
    keep_last: int = 2,
    merge_lora: bool = False,
) -> Path:
    """Write the checkpoint of ``state.step`` atomically, keep the newest ``keep_last``; all ranks call.

    A full disk or read-only folder is a StorageError naming the path; the previous checkpoint stays intact.
    """
    root = checkpoint_root(output_dir)
    final = root / checkpoint_name(state.step)
    tmp = root / f"{TMP_PREFIX}{final.name}"
    kept = list_checkpoints(output_dir)
    hint = (
        f"the newest complete checkpoint, {kept[-1].name}, is intact; make room and continue with "
        "checkpoint.resume=auto"
        if kept
        else "no checkpoint was completed"
    )
    with storage_errors(tmp, f"saving the checkpoint of step {state.step}", hint):
        _write(
            engine, root, tmp, final, state, processor=processor, keep_last=keep_last, merge_lora=merge_lora
        )
    return final


def _write(
    engine: TrainingEngine,
    root: Path,
    tmp: Path,
    final: Path,
    state: TrainerState,
    *,
    processor: Any,
    keep_last: int,
    merge_lora: bool,
) -> None:
    rank, timeout_s = _rank(), engine.config.train.dist_timeout_s
    wait = f"the checkpoint barrier of step {state.step}"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        _tidy(root)
        tmp.mkdir()
        (tmp / RNG_DIR).mkdir()
    barrier(wait, timeout_s)
    save_model(engine, tmp / MODEL_DIR, processor=processor, merge_lora=merge_lora)
    with _without_frozen_aliases(engine.deepspeed):
        engine.deepspeed.save_checkpoint(
            str(tmp / DEEPSPEED_DIR),
            tag=_DS_TAG,
            client_state={},
            save_latest=False,
            exclude_frozen_parameters=True,
        )
    torch.save(rng_state(), tmp / rng_file(rank))
    if rank == 0:
        torch.save(asdict(state), tmp / TRAINER_STATE_FILE)
    barrier(wait, timeout_s)
    files = _manifest(tmp, timeout_s)
    if rank == 0:
        meta = {
            "format": FORMAT_VERSION,
            "step": state.step,
            "world_size": engine.dist.world_size,
            "zero_stage": engine.zero_stage,
            "lora": engine.is_lora,
            "merged_lora": engine.is_lora and merge_lora,
            "model": local_path(engine.config.model.name_or_path),
            "learning_rate": engine.config.optim.learning_rate,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "files": files,
        }
        for folder in sorted({(tmp / name).parent for name in files}, key=lambda p: -len(p.parts)):
            fsync_dir(folder)
        atomic_write_text(tmp / META_FILE, json.dumps(meta, indent=1) + "\n")
        if final.exists():  # re-saving a step: the old copy stands for it until the new one is in place
            old = root / f"{OLD_PREFIX}{final.name}"
            final.rename(old)
            tmp.rename(final)
            fsync_dir(root)
            shutil.rmtree(old)
        else:
            tmp.rename(final)
        fsync_dir(root)
        for older in list_checkpoints(root.parent)[:-keep_last]:
            shutil.rmtree(older)
    barrier(wait, timeout_s)


def _frozen_names(module: torch.nn.Module) -> set[str]:
    """State-dict names of frozen parameters, tied aliases included (a tied ``lm_head.weight``)."""
    return {n for n, p in module.named_parameters(remove_duplicate=False) if not p.requires_grad}


@contextmanager
def _without_frozen_aliases(ds_engine: Any) -> Iterator[None]:
    """DeepSpeed's ``exclude_frozen_parameters`` drops frozen parameters by their first name only, so a tied
    frozen output layer (``lm_head.weight``, the whole embedding) is still saved; drop every alias too."""
    original = ds_engine.module_state_dict

    def module_state_dict(*args: Any, exclude_frozen_parameters: bool = False, **kwargs: Any) -> Any:
        state = original(*args, exclude_frozen_parameters=exclude_frozen_parameters, **kwargs)
        if exclude_frozen_parameters:
            prefix = kwargs.get("prefix", "")
            for name in _frozen_names(ds_engine.module):
                state.pop(prefix + name, None)
        return state

    ds_engine.module_state_dict = module_state_dict
    try:
        yield
    finally:
        del ds_engine.module_state_dict  # the class method again


def _load_trainable(src: dict[str, torch.Tensor], dst: torch.nn.Module) -> None:
    """Load a module state saved without its frozen parameters: every trainable parameter and buffer must be
    in it, and only frozen parameters may be missing (they keep the values loaded from model.name_or_path)."""
    result = dst.load_state_dict(src, strict=False)
    frozen = _frozen_names(dst)
    missing = sorted(set(result.missing_keys) - frozen)
    if missing or result.unexpected_keys:
        raise ValueError(
            "the checkpoint's module state does not match the model: "
            f"missing {missing[:3]}{' ...' if len(missing) > 3 else ''}, "
            f"unexpected {result.unexpected_keys[:3]}{' ...' if len(result.unexpected_keys) > 3 else ''}"
        )


def checkpoint_bytes(path: str | Path) -> dict[str, int]:
    """Bytes on disk of a checkpoint's parts (``model``, ``deepspeed``, ``rng``, ...) and ``total``."""
    path = Path(path)
    sizes: dict[str, int] = {}
    for file in path.rglob("*"):
        if file.is_file():
            parts = file.relative_to(path).parts
            part = parts[0] if len(parts) > 1 else "metadata"  # checkpoint.json, trainer_state.pt
            sizes[part] = sizes.get(part, 0) + file.stat().st_size
    sizes["total"] = sum(sizes.values())
    return sizes


def check_checkpoint_folder(output_dir: str | Path) -> None:
    """Before any work: ``<output_dir>/checkpoints`` is a folder (or absent) whose step entries are real
    folders, so the first save, after the training it keeps, cannot fail on them."""
    root = checkpoint_root(output_dir)
    if root.exists() and not root.is_dir():
        raise StorageError(f"logging.output_dir: {root} is not a folder; move it away (checkpoints go there)")
    if not root.is_dir():
        return
    for path in sorted(root.iterdir()):
        if step_of(path.name) is not None and (path.is_symlink() or not path.is_dir()):
            kind = "a symlink" if path.is_symlink() else "not a folder"
            raise CheckpointError(
                f"{path}: {kind}; a checkpoint is a folder the trainer writes itself: move it out of {root}"
            )


def resume_candidates(resume: str, output_dir: str | Path) -> list[Path]:
    """``checkpoint.resume``: none/empty/restart → []; auto → complete checkpoints, newest first; a PATH → [PATH]."""
    if resume in ("", RESUME_NONE, RESUME_RESTART):
        return []
    if resume == RESUME_AUTO:
        return list_checkpoints(output_dir)[::-1]
    path = Path(resume)
    if not path.is_dir() or not (path / META_FILE).is_file():
        raise CheckpointError(
            f"checkpoint.resume: {path} is not a complete checkpoint folder "
            f"(no {META_FILE}); use auto or a step-NNNNNNNN folder"
        )
    return [path]


def _damaged_ones(output_dir: str | Path) -> list[str]:
    root = checkpoint_root(output_dir)
    return sorted(p.name for p in root.glob(f"{DAMAGED_PREFIX}{STEP_GLOB}")) if root.is_dir() else []


def choose_checkpoint(resume: str, output_dir: str | Path, timeout_s: float | None = None) -> Path | None:
    """The verified checkpoint to resume from (None: start at step 0); every rank must call.

    A PATH that fails verification is an error. ``auto`` skips damaged checkpoints, newest first, moves them
    aside to ``damaged-step-…`` and says so; if every one is damaged, or only damaged ones are left from an
    earlier attempt, it is an error, never a silent restart. ``restart`` starts at step 0 and moves every
    checkpoint of the folder aside (``abandoned-step-…``). The checkpoints after the one resumed from are moved
    aside too.
    """
    candidates = resume_candidates(resume, output_dir)
    skipped = []
    for path in candidates:
        try:
            verify_checkpoint(path, timeout_s)
        except CheckpointError as err:
            if resume != RESUME_AUTO:
                raise CheckpointError(f"checkpoint.resume: {err}") from None
            skipped.append((path, f"damaged: {err}"))
            continue
        _set_aside(skipped, DAMAGED_PREFIX, f"resuming from {path.name} instead", timeout_s)
        step = read_meta(path)["step"]
        later = [
            (p, f"later than {path.name}") for p in list_checkpoints(output_dir) if step_of(p.name) > step
        ]
        _set_aside(later, ABANDONED_PREFIX, f"resuming from {path.name}", timeout_s)
        return path
    restart = f"{RESUME_RESTART} (step 0, metrics.jsonl cleared)"
    if skipped:
        _set_aside(skipped, DAMAGED_PREFIX, "no intact checkpoint is left", timeout_s)
        raise CheckpointError(
            f"checkpoint.resume=auto: every checkpoint in {checkpoint_root(output_dir)} is damaged (newest: "
            f"{skipped[0][1].removeprefix('damaged: ')}); they were moved to damaged-step-…; start again with checkpoint.resume={restart} "
            "or in a new logging.output_dir"
        )
    if resume == RESUME_AUTO and (damaged := _damaged_ones(output_dir)):
        raise CheckpointError(
            f"checkpoint.resume=auto: {checkpoint_root(output_dir)} holds no intact checkpoint, only damaged "
            f"ones ({', '.join(damaged)}); start again with checkpoint.resume={restart}, or in a new "
            "logging.output_dir"
        )
    if resume == RESUME_RESTART:
        abandoned = [(p, "checkpoint.resume=restart") for p in list_checkpoints(output_dir)]
        _set_aside(abandoned, ABANDONED_PREFIX, "starting again at step 0", timeout_s)
    return None


def _set_aside(paths: list[tuple[Path, str]], prefix: str, outcome: str, timeout_s: float | None) -> None:
    """Rank 0 renames each checkpoint to ``<prefix><name>`` (never resumed, never pruned) and says why."""
    if not paths:
        return
    barrier("the checkpoint check", timeout_s)  # every rank is done reading them
    if _rank() != 0:
        return
    for path, why in paths:
        name = path.name.removeprefix(OLD_PREFIX)
        target, copies = path.with_name(f"{prefix}{name}"), 1
        while target.exists():  # an earlier one of that name stays
            target, copies = path.with_name(f"{prefix}{name}.{copies}"), copies + 1
        path.rename(target)
        log.warning(
            "checkpoint.resume: skipped %s, %s; moved to %s; %s", path.name, why, target.name, outcome
        )


def resume_plan(config: Config, world_size: int, path: Path) -> ResumePlan:
    """How checkpoint ``path`` resumes on ``world_size`` ranks of this config (exactly, or elastically), or a
    one-line CheckpointError when it cannot; cheap, so the trainer asks before it loads the model."""
    return plan_resume(
        path,
        read_meta(path),
        world_size,
        config.deepspeed.zero_stage,
        elastic=config.checkpoint.elastic_resume,
        tag=_DS_TAG,
    )


def load_checkpoint(engine: TrainingEngine, path: str | Path) -> TrainerState:
    """Restore model, optimizer, scheduler and this rank's RNG from a verified ``path``; return the trainer state.

    At another world size (or ZeRO 1 <-> 2) the resume is elastic (see :mod:`~vlm_grpoma.trainer.elastic`).
    Nothing is unpickled beyond tensors, plain containers and DeepSpeed's own state classes.
    """
    path = Path(path)
    meta = read_meta(path)
    plan = resume_plan(engine.config, engine.dist.world_size, path)
    _check_fits(engine, path, meta)
    load_dir, converted_s = path / DEEPSPEED_DIR, None
    if plan.universal:
        load_dir, converted_s = universal_folder(path, meta, _DS_TAG, engine.config.train.dist_timeout_s)
    use_safe_checkpoint_loading(engine.deepspeed)
    try:
        with universal_loading(engine.deepspeed) if plan.universal else nullcontext():
            loaded, _ = engine.deepspeed.load_checkpoint(
                str(load_dir),
                tag=_DS_TAG,
                load_optimizer_states=True,
                load_lr_scheduler_states=True,
                custom_load_fn=_load_trainable,
            )
    except (RuntimeError, KeyError, ValueError, AssertionError, AttributeError, TypeError) as err:
        detail = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        raise CheckpointError(
            f"{path}: does not fit this run's model and optimizer (model, LoRA or ZeRO settings differ?): {detail}"
        ) from None
    if loaded is None:
        raise CheckpointError(f"{load_dir}: DeepSpeed found no state to load")
    state = _trainer_state(path, meta)
    rank = engine.dist.rank
    if rank < meta["world_size"]:
        set_rng_state(safe_torch_load(str(path / rng_file(rank))))
    else:  # a rank the checkpoint had none for (elastic resume on more ranks)
        seed_new_rank(engine.config.seed, state.step, rank)
    if plan.elastic and rank == 0:
        where = ""
        if plan.universal:
            how = "reused" if converted_s is None else f"converted in {converted_s:.1f} s"
            where = f" ({load_dir}, {how})"
        log.warning("checkpoint %s: %s%s", path.name, plan.describe(), where)
    return state


def _trainer_state(path: Path, meta: dict[str, Any]) -> TrainerState:
    saved = safe_torch_load(str(path / TRAINER_STATE_FILE))
    try:
        state = TrainerState(**saved)
    except TypeError:
        raise CheckpointError(f"{path / TRAINER_STATE_FILE}: not a trainer state") from None
    if state.step != meta["step"] or not isinstance(state.data, dict) or not isinstance(state.metrics, dict):
        raise CheckpointError(
            f"{path / TRAINER_STATE_FILE}: not the trainer state of step {meta['step']} (step {state.step!r}, "
            "data and metrics must be mappings)"
        )
    return state


def _check_fits(engine: TrainingEngine, path: Path, meta: dict[str, Any]) -> None:
    """What this run cannot take over from the checkpoint beyond its world size and ZeRO stage
    (:func:`resume_plan`), said before DeepSpeed reads it: another model under frozen weights (an error);
    another learning rate (a warning)."""
    saved_model, model = meta.get("model"), local_path(engine.config.model.name_or_path)
    if saved_model and saved_model != model and _frozen_names(engine.module):
        raise CheckpointError(
            f"{path}: trained on model.name_or_path={saved_model}, resuming with {model}; its frozen weights "
            f"are not saved and would come from the new model: set model.name_or_path={saved_model}"
        )
    saved_lr, lr = meta.get("learning_rate"), engine.config.optim.learning_rate
    if saved_lr is not None and saved_lr != lr and _rank() == 0:
        log.warning(
            "optim.learning_rate=%g differs from the %g the checkpoint %s was trained with: the checkpoint's "
            "learning-rate schedule wins (exact resume); start a new run from its model to change it",
            lr,
            saved_lr,
            path.name,
        )
