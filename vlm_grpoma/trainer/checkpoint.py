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

Writing: every rank writes into ``.tmp-step-…`` (the output folder must be shared by all ranks); the ranks
share the hashing and fsync of the files, rank 0 writes and syncs checkpoint.json, renames the folder into
place and syncs its parent. Re-saving a step first renames the old copy to ``.old-step-…``, which stands for
that step until the new copy is in place, so at no moment is the step missing.

Loading: the manifest is checked first (sizes on every rank, hashes shared among the ranks), then every
``.pt`` file is unpickled with ``weights_only=True`` (DeepSpeed's through :mod:`~vlm_grpoma.trainer.safe_load`),
so a damaged or tampered checkpoint is refused with one line and never runs code.
``checkpoint.resume=auto`` takes the newest checkpoint that passes, says which ones it skipped and moves them
aside (``damaged-step-…``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vlm_grpoma.errors import CheckpointError
from vlm_grpoma.trainer.collectives import collective
from vlm_grpoma.trainer.engine import TrainingEngine
from vlm_grpoma.trainer.run_dir import atomic_write_text, fsync_dir, storage_errors
from vlm_grpoma.trainer.safe_load import safe_torch_load, use_safe_checkpoint_loading

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
_NAME = re.compile(r"^(?:\.old-)?step-(\d+)$")  # .old-step-N: the previous copy during a re-save
_DS_TAG = "state"
FORMAT_VERSION = 2  # 2: checkpoint.json carries the manifest
META_FILE = "checkpoint.json"
_HASH_CHUNK = 8 << 20


@dataclass
class TrainerState:
    """What the loop needs to continue: steps done, data position, metric trackers (plain types / tensors)."""

    step: int
    data: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def _barrier(what: str, timeout_s: float | None) -> None:
    if torch.distributed.is_initialized():
        with collective(what, timeout_s):
            torch.distributed.barrier()


def _rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def _world() -> int:
    return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1


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
    if processor is not None:
        processor.save_pretrained(out)


# ---------------------------------------------------------------------------------------------------------
# Manifest: sizes and hashes, computed and checked with the work shared among the ranks


def _digest(path: Path, sync: bool) -> tuple[int, str]:
    """(size, SHA-256) of a file, fsyncing it first when ``sync``."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        if sync:
            os.fsync(f.fileno())
        while chunk := f.read(_HASH_CHUNK):
            sha.update(chunk)
    return path.stat().st_size, sha.hexdigest()


def _shared(items: list[str], work, what: str, timeout_s: float | None) -> dict[str, Any]:
    """``{item: work(item)}`` with rank r doing ``items[r::world]``, gathered on every rank."""
    mine = {item: work(item) for item in items[_rank() :: _world()]}
    if _world() == 1:
        return mine
    parts: list[dict[str, Any]] = [{} for _ in range(_world())]
    with collective(what, timeout_s):
        torch.distributed.all_gather_object(parts, mine)
    return {key: value for part in parts for key, value in part.items()}


def _files(folder: Path) -> list[str]:
    """Every file under ``folder`` but checkpoint.json, as sorted POSIX paths relative to it."""
    return sorted(
        p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != META_FILE
    )


def _manifest(folder: Path, timeout_s: float | None) -> dict[str, dict[str, Any]]:
    digests = _shared(
        _files(folder), lambda name: _digest(folder / name, sync=True), "the checkpoint hashing", timeout_s
    )
    return {name: {"size": size, "sha256": sha} for name, (size, sha) in sorted(digests.items())}


def read_meta(path: Path) -> dict[str, Any]:
    """checkpoint.json of a checkpoint folder; a missing, unreadable or incomplete one is a CheckpointError."""
    meta_file = path / META_FILE
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{meta_file}: missing; the checkpoint is incomplete") from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise CheckpointError(f"{meta_file}: unreadable ({err})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise CheckpointError(
            f"{meta_file}: format {found!r}, expected {FORMAT_VERSION} (a checkpoint with a manifest); "
            "it was written by another version of vlm-grpoma or damaged"
        )
    missing = [k for k in ("step", "world_size", "files") if k not in meta]
    if missing or not isinstance(meta["files"], dict):
        raise CheckpointError(f"{meta_file}: damaged (no {', '.join(missing) or 'file list'})")
    return meta


def verify_checkpoint(path: Path, timeout_s: float | None = None) -> None:
    """Raise a CheckpointError naming the first file that is missing or differs from the manifest.

    Sizes are checked on every rank, the hashes shared among the ranks; every rank must call.
    """
    meta = read_meta(path)
    files = meta["files"]
    problems = []
    for name, entry in files.items():
        file = path / name
        if not file.is_file():
            problems.append(f"{file}: missing")
        elif file.stat().st_size != entry.get("size"):
            problems.append(f"{file}: {file.stat().st_size} bytes, the manifest says {entry.get('size')}")
    if not problems:
        hashes = _shared(
            sorted(files), lambda name: _digest(path / name, sync=False)[1], "the checkpoint check", timeout_s
        )
        problems = [
            f"{path / n}: content differs from the manifest"
            for n in sorted(files)
            if hashes[n] != files[n].get("sha256")
        ]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CheckpointError(f"{problems[0]}{more}")


# ---------------------------------------------------------------------------------------------------------
# Save / find / load


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / CHECKPOINT_DIR


def _step_of(path: Path) -> int | None:
    found = _NAME.match(path.name)
    return int(found.group(1)) if found else None


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints under ``output_dir`` (with checkpoint.json), oldest first, one per step.

    A ``.old-step-N`` left by a crash during a re-save stands for step N when ``step-N`` is absent.
    """
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    by_step: dict[int, Path] = {}
    for path in sorted(root.iterdir(), key=lambda p: p.name.startswith(".old-")):  # step-N first
        step = _step_of(path)
        if step is not None and step not in by_step and (path / META_FILE).is_file():
            by_step[step] = path
    return [by_step[step] for step in sorted(by_step)]


def _tidy(root: Path) -> None:
    """Before a save (rank 0): remove half-written folders; put back an old copy whose re-save never finished."""
    for path in root.iterdir():
        if path.name.startswith(".tmp-"):
            shutil.rmtree(path)
        elif path.name.startswith(".old-"):
            final = root / path.name[len(".old-") :]
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
    tmp = root / f".tmp-{final.name}"
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
    barrier = f"the checkpoint barrier of step {state.step}"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        _tidy(root)
        tmp.mkdir()
        (tmp / "rng").mkdir()
    _barrier(barrier, timeout_s)
    save_model(engine, tmp / "model", processor=processor, merge_lora=merge_lora)
    with _without_frozen_aliases(engine.deepspeed):
        engine.deepspeed.save_checkpoint(
            str(tmp / "deepspeed"),
            tag=_DS_TAG,
            client_state={},
            save_latest=False,
            exclude_frozen_parameters=True,
        )
    torch.save(rng_state(), tmp / "rng" / f"rank-{rank:05d}.pt")
    if rank == 0:
        torch.save(asdict(state), tmp / "trainer_state.pt")
    _barrier(barrier, timeout_s)
    files = _manifest(tmp, timeout_s)
    if rank == 0:
        meta = {
            "format": FORMAT_VERSION,
            "step": state.step,
            "world_size": engine.dist.world_size,
            "zero_stage": engine.zero_stage,
            "lora": engine.is_lora,
            "merged_lora": engine.is_lora and merge_lora,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "files": files,
        }
        for folder in sorted({(tmp / name).parent for name in files}, key=lambda p: -len(p.parts)):
            fsync_dir(folder)
        atomic_write_text(tmp / META_FILE, json.dumps(meta, indent=1) + "\n")
        if final.exists():  # re-saving a step: the old copy stands for it until the new one is in place
            old = root / f".old-{final.name}"
            final.rename(old)
            tmp.rename(final)
            fsync_dir(root)
            shutil.rmtree(old)
        else:
            tmp.rename(final)
        fsync_dir(root)
        for older in list_checkpoints(root.parent)[:-keep_last]:
            shutil.rmtree(older)
    _barrier(barrier, timeout_s)


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


def resume_candidates(resume: str, output_dir: str | Path) -> list[Path]:
    """``checkpoint.resume``: none/empty → []; auto → complete checkpoints, newest first; a PATH → [PATH]."""
    if resume in ("", "none"):
        return []
    if resume == "auto":
        return list_checkpoints(output_dir)[::-1]
    path = Path(resume)
    if not path.is_dir() or not (path / META_FILE).is_file():
        raise CheckpointError(
            f"checkpoint.resume: {path} is not a complete checkpoint folder "
            f"(no {META_FILE}); use auto or a step-NNNNNNNN folder"
        )
    return [path]


def choose_checkpoint(resume: str, output_dir: str | Path, timeout_s: float | None = None) -> Path | None:
    """The verified checkpoint to resume from (None: start afresh); every rank must call.

    A PATH that fails verification is an error. ``auto`` skips damaged checkpoints, newest first, moves them
    aside to ``damaged-step-…`` and says so; if every one is damaged it is an error, never a silent restart.
    """
    candidates = resume_candidates(resume, output_dir)
    skipped = []
    for path in candidates:
        try:
            verify_checkpoint(path, timeout_s)
        except CheckpointError as err:
            if resume != "auto":
                raise CheckpointError(f"checkpoint.resume: {err}") from None
            skipped.append((path, err))
            continue
        _set_aside(skipped, f"resuming from {path.name} instead", timeout_s)
        return path
    if skipped:
        _set_aside(skipped, "no intact checkpoint is left", timeout_s)
        raise CheckpointError(
            f"checkpoint.resume=auto: every checkpoint in {checkpoint_root(output_dir)} is damaged (newest: "
            f"{skipped[0][1]}); they were moved to damaged-step-…; start afresh in a new logging.output_dir"
        )
    return None


def _set_aside(skipped: list[tuple[Path, CheckpointError]], outcome: str, timeout_s: float | None) -> None:
    """Rank 0 renames each damaged checkpoint to ``damaged-<name>`` (never resumed, never pruned) and says so."""
    if not skipped:
        return
    _barrier("the checkpoint check", timeout_s)  # every rank is done reading them
    if _rank() != 0:
        return
    for path, err in skipped:
        target = path.with_name(f"damaged-{path.name.removeprefix('.old-')}")
        if target.exists():
            shutil.rmtree(target)
        path.rename(target)
        log.warning(
            "checkpoint.resume=auto: skipped %s, damaged: %s; moved to %s; %s",
            path.name,
            err,
            target.name,
            outcome,
        )


def load_checkpoint(engine: TrainingEngine, path: str | Path) -> TrainerState:
    """Restore model, optimizer, scheduler and this rank's RNG from a verified ``path``; return the trainer state.

    Nothing is unpickled beyond tensors, plain containers and DeepSpeed's own state classes.
    """
    path = Path(path)
    meta = read_meta(path)
    if meta["world_size"] != engine.dist.world_size:
        raise CheckpointError(
            f"{path}: saved with {meta['world_size']} ranks, resuming with {engine.dist.world_size}; "
            "exact resume needs the same world size"
        )
    use_safe_checkpoint_loading(engine.deepspeed)
    try:
        loaded, _ = engine.deepspeed.load_checkpoint(
            str(path / "deepspeed"),
            tag=_DS_TAG,
            load_optimizer_states=True,
            load_lr_scheduler_states=True,
            custom_load_fn=_load_trainable,
        )
    except (RuntimeError, KeyError, ValueError, AssertionError) as err:
        detail = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        raise CheckpointError(
            f"{path}: does not fit this run's model and optimizer (model, LoRA or ZeRO settings differ?): {detail}"
        ) from None
    if loaded is None:
        raise CheckpointError(f"{path / 'deepspeed'}: DeepSpeed found no state to load")
    set_rng_state(safe_torch_load(str(path / "rng" / f"rank-{engine.dist.rank:05d}.pt")))
    saved = safe_torch_load(str(path / "trainer_state.pt"))
    try:
        return TrainerState(**saved)
    except TypeError:
        raise CheckpointError(f"{path / 'trainer_state.pt'}: not a trainer state") from None
