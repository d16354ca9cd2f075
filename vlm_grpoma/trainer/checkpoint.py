"""Checkpoints: a Hugging Face model folder plus the trainer state for exact resume, written atomically.

Layout of ``<output_dir>/checkpoints/step-00000010/``::

    model/                 save_pretrained (safetensors) + processor; with LoRA the adapter, or merged weights
    deepspeed/state/       DeepSpeed save_checkpoint: trainable parameters, optimizer (ZeRO partitions), LR
                           scheduler; frozen parameters (a LoRA base, a frozen vision tower) are left out and
                           come back from model.name_or_path on resume
    rng/rank-00000.pt      python / numpy / torch (+cuda) RNG states of each rank
    trainer_state.pt       TrainerState (step, data position, metric trackers); loads with weights_only=True
    checkpoint.json        written last: a folder without it is incomplete and never resumed from

Every rank writes into ``.tmp-step-…`` (the output folder must be shared by all ranks); rank 0 renames it
into place once all ranks are done, so a crash mid-save leaves the previous checkpoint as the newest.
"""

from __future__ import annotations

import json
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

from vlm_grpoma.trainer.engine import TrainingEngine

CHECKPOINT_DIR = "checkpoints"
_NAME = re.compile(r"^step-(\d+)$")
_DS_TAG = "state"
FORMAT_VERSION = 1


@dataclass
class TrainerState:
    """What the loop needs to continue: steps done, data position, metric trackers (plain types / tensors)."""

    step: int
    data: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def _barrier() -> None:
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def _rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


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
# Save / find / load


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / CHECKPOINT_DIR


def is_complete(path: Path) -> bool:
    return _NAME.match(path.name) is not None and (path / "checkpoint.json").is_file()


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints under ``output_dir``, oldest first."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and is_complete(p)]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def save_checkpoint(
    engine: TrainingEngine,
    output_dir: str | Path,
    state: TrainerState,
    *,
    processor: Any = None,
    keep_last: int = 2,
    merge_lora: bool = False,
) -> Path:
    """Write the checkpoint of ``state.step`` atomically, keep the newest ``keep_last``; all ranks call."""
    root = checkpoint_root(output_dir)
    final = root / checkpoint_name(state.step)
    tmp = root / f".tmp-{final.name}"
    rank = _rank()
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):  # left by a crash
            shutil.rmtree(stale)
        tmp.mkdir()
        (tmp / "rng").mkdir()
    _barrier()
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
    _barrier()
    if rank == 0:
        torch.save(asdict(state), tmp / "trainer_state.pt")
        meta = {
            "format": FORMAT_VERSION,
            "step": state.step,
            "world_size": engine.dist.world_size,
            "zero_stage": engine.zero_stage,
            "lora": engine.is_lora,
            "merged_lora": engine.is_lora and merge_lora,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (tmp / "checkpoint.json").write_text(json.dumps(meta, indent=2) + "\n")
        if final.exists():  # re-saving a step (e.g. the final save right after a periodic one)
            trash = root / f".tmp-old-{final.name}"
            final.rename(trash)
            tmp.rename(final)
            shutil.rmtree(trash)
        else:
            tmp.rename(final)
        for old in list_checkpoints(output_dir)[:-keep_last]:
            shutil.rmtree(old)
    _barrier()
    return final


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


def resolve_resume(resume: str, output_dir: str | Path) -> Path | None:
    """``checkpoint.resume``: none/empty → None; auto → the newest complete checkpoint or None; a PATH."""
    if resume in ("", "none"):
        return None
    if resume == "auto":
        found = list_checkpoints(output_dir)
        return found[-1] if found else None
    path = Path(resume)
    if not path.is_dir() or not (path / "checkpoint.json").is_file():
        raise FileNotFoundError(
            f"checkpoint.resume: {path} is not a complete checkpoint folder "
            "(no checkpoint.json); use auto or a step-NNNNNNNN folder"
        )
    return path


def load_checkpoint(engine: TrainingEngine, path: str | Path) -> TrainerState:
    """Restore model, optimizer, scheduler and this rank's RNG from ``path``; return the trainer state."""
    path = Path(path)
    meta = json.loads((path / "checkpoint.json").read_text())
    if meta["world_size"] != engine.dist.world_size:
        raise ValueError(
            f"{path}: saved with {meta['world_size']} ranks, resuming with {engine.dist.world_size}; "
            "exact resume needs the same world size"
        )
    loaded, _ = engine.deepspeed.load_checkpoint(
        str(path / "deepspeed"),
        tag=_DS_TAG,
        load_optimizer_states=True,
        load_lr_scheduler_states=True,
        custom_load_fn=_load_trainable,
    )
    if loaded is None:
        raise FileNotFoundError(f"{path / 'deepspeed'}: DeepSpeed found no state to load")
    rng_file = path / "rng" / f"rank-{engine.dist.rank:05d}.pt"
    set_rng_state(torch.load(rng_file, weights_only=True))
    return TrainerState(**torch.load(path / "trainer_state.pt", weights_only=True))
