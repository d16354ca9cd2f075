"""Elastic resume: continue a checkpoint saved at another world size (ZeRO stage 1 and 2 also across each
other) with its optimizer state, through DeepSpeed's universal checkpoint.

What carries over, and how exactly:

* same world size and ZeRO stage: everything, bitwise (the plain resume of :mod:`.checkpoint`);
* another world size: the fp32 weights, Adam's ``exp_avg``/``exp_avg_sq`` and step count, the LR schedule,
  the trainer step and the data position, unchanged to the bit (DeepSpeed's conversion only cuts and joins
  the saved tensors). The data order is global (:class:`~vlm_grpoma.trainer.sampler.PromptSampler`: one
  seeded permutation per epoch, a position in it), so every step trains on the same ``prompts_per_step``
  records as the uninterrupted run would, none lost or repeated within an epoch; only their split over the
  ranks changes. What differs from an uninterrupted run: the rollouts (each rank samples with its own seed)
  and the float rounding of the gradient reduction (other micro-batch grouping and rank sums), so the run is
  not bitwise the same. A rank that did not exist takes an RNG state seeded from (seed, step, rank);
  a rank that did takes its own saved state.

ZeRO 0 in fp32 keeps the whole optimizer state on every rank (no partitions), so it resumes directly at any
world size. ZeRO 1/2 (and ZeRO 0 in bf16, whose fp32 master weights DeepSpeed partitions) and ZeRO 3 are
converted with ``deepspeed.checkpoint.ds_to_universal`` once, into ``step-N/universal/`` (written in
``.tmp-universal`` and renamed, with its own manifest, verified before every use and reused), then loaded
with DeepSpeed's ``checkpoint.load_universal``. Refused with one line: ZeRO 0 <-> 1/2/3 and 3 <-> 1/2 (the
optimizer layouts differ: DeepSpeed's ZeRO-3 universal format keeps no step count for ZeRO-1/2 and its
ZeRO-1/2 one lacks the ZeRO-3 optimizer header), and any change when ``checkpoint.elastic_resume=false``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import logging
import random
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vlm_grpoma.errors import CheckpointError, UserError
from vlm_grpoma.run_layout import DEEPSPEED_DIR, META_FILE, TMP_PREFIX, UNIVERSAL_DIR
from vlm_grpoma.trainer.checkpoint_manifest import FORMAT_VERSION, build_manifest, rank, verify_checkpoint
from vlm_grpoma.trainer.collectives import barrier, raise_on_every_rank
from vlm_grpoma.trainer.run_dir import atomic_write_text, fsync_dir, storage_errors, storage_problem
from vlm_grpoma.trainer.safe_load import safe_torch_loads

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResumePlan:
    """How a checkpoint saved by ``saved_world`` ranks at ZeRO ``saved_stage`` resumes on ``world`` ranks at
    ZeRO ``stage``: exactly, directly at another world size, or through the universal checkpoint."""

    saved_world: int
    saved_stage: int
    world: int
    stage: int
    universal: bool

    @property
    def elastic(self) -> bool:
        return (self.saved_world, self.saved_stage) != (self.world, self.stage)

    def describe(self) -> str:
        ranks = lambda n: f"{n} rank{'s' if n != 1 else ''}"  # noqa: E731
        how = "DeepSpeed's universal checkpoint" if self.universal else "its unpartitioned optimizer state"
        return (
            f"elastic resume from {ranks(self.saved_world)}/ZeRO {self.saved_stage} to {ranks(self.world)}/"
            f"ZeRO {self.stage} through {how}: weights, optimizer moments and step, LR schedule and data "
            "position carried over exactly; the same prompts per step, split over the new ranks (rollouts and "
            "gradient rounding differ from an uninterrupted run)"
        )


def _partitioned(path: Path, tag: str) -> bool:
    """Whether the saved optimizer state is split over the ranks (ZeRO 1/2/3, or ZeRO 0's bf16 optimizer)."""
    return any((path / DEEPSPEED_DIR / tag).glob("*optim_states.pt"))


def plan_resume(
    path: Path, meta: dict[str, Any], world: int, stage: int, *, elastic: bool, tag: str
) -> ResumePlan:
    """The resume plan of checkpoint ``path`` (its ``checkpoint.json`` is ``meta``) on this run, or a one-line
    CheckpointError saying what this run must change."""
    saved_world, saved_stage = meta["world_size"], meta.get("zero_stage", stage)
    same = f"resume with {saved_world} rank{'s' if saved_world != 1 else ''} and deepspeed.zero_stage={saved_stage}"
    if not elastic and (saved_world, saved_stage) != (world, stage):
        raise CheckpointError(
            f"{path}: saved with {saved_world} ranks and ZeRO stage {saved_stage}, resuming with {world} and "
            f"deepspeed.zero_stage={stage}; checkpoint.elastic_resume=false asks for an exact resume: {same}, "
            "or set checkpoint.elastic_resume=true"
        )
    groups = {0: "0", 1: "1/2", 2: "1/2", 3: "3"}
    if groups[saved_stage] != groups[stage]:
        raise CheckpointError(
            f"{path}: saved with ZeRO stage {saved_stage}, resuming with deepspeed.zero_stage={stage}; DeepSpeed "
            f"cannot carry the optimizer state from ZeRO {groups[saved_stage]} to ZeRO {groups[stage]}: set "
            f"deepspeed.zero_stage={saved_stage} (any world size), or start a new run from {path}/model"
        )
    universal = (saved_world, saved_stage) != (world, stage) and _partitioned(path, tag)
    return ResumePlan(saved_world, saved_stage, world, stage, universal)


def _sha256(file: Path) -> str:
    return hashlib.sha256(file.read_bytes()).hexdigest()


def _usable(folder: Path, source_sha: str, timeout_s: float | None) -> bool:
    """A converted folder of this very checkpoint whose files match its manifest (every rank calls)."""
    try:
        meta = json.loads((folder / META_FILE).read_text())
        verify_checkpoint(folder, timeout_s)
    except (OSError, ValueError, CheckpointError):
        return False
    return meta.get("source_sha256") == source_sha


def universal_folder(
    path: Path, meta: dict[str, Any], tag: str, timeout_s: float | None
) -> tuple[Path, float | None]:
    """``path/universal`` holding the universal checkpoint of ``path``'s DeepSpeed state under ``tag``,
    converted on rank 0 unless a verified one of this checkpoint is there; all ranks call. Returns the folder
    and the conversion's seconds (None: reused)."""
    final, tmp = path / UNIVERSAL_DIR, path / f"{TMP_PREFIX}{UNIVERSAL_DIR}"
    source_sha = _sha256(path / META_FILE)
    if final.is_dir() and _usable(final, source_sha, timeout_s):
        return final, None
    error: UserError | None = None
    seconds = 0.0
    if rank() == 0:
        start = time.perf_counter()
        try:
            with storage_errors(tmp, f"converting {path} to DeepSpeed's universal checkpoint"):
                for stale in (tmp, final):
                    if stale.exists():
                        shutil.rmtree(stale)
                _convert(path / DEEPSPEED_DIR / tag, tmp / tag)
        except UserError as err:
            error = err
        seconds = time.perf_counter() - start
    raise_on_every_rank(error, "the universal checkpoint conversion", timeout_s)
    files = build_manifest(tmp, timeout_s)
    if rank() == 0:
        own = {
            "format": FORMAT_VERSION,
            "step": meta["step"],
            "world_size": meta["world_size"],
            "source_sha256": source_sha,
            "files": files,
        }
        with storage_errors(tmp, f"writing the universal checkpoint of {path}"):
            atomic_write_text(tmp / META_FILE, json.dumps(own, indent=1) + "\n")
            tmp.rename(final)
            fsync_dir(path)
    barrier("the universal checkpoint conversion", timeout_s)
    return final, seconds


def _convert(state: Path, out: Path) -> None:
    """``ds_to_universal`` of DeepSpeed state folder ``state`` into ``out``, in this process (no worker pool),
    every file read with ``weights_only=True``; DeepSpeed's progress output is kept back unless it fails."""
    from deepspeed.checkpoint import ds_to_universal

    args = argparse.Namespace(
        input_folder=str(state),
        output_folder=str(out),
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,  # a Hugging Face model declares no tensor-parallel layout: there is none
    )
    chatter = io.StringIO()
    try:
        with safe_torch_loads(), contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
            ds_to_universal.main(args)
    except CheckpointError:
        raise
    except (
        Exception
    ) as err:  # DeepSpeed reports an unsupported layout by assert/ValueError/NotImplementedError
        if storage_problem(err, out) is not None:
            raise  # disk full, read-only: storage_errors names it
        detail = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        raise CheckpointError(
            f"{state.parent.parent}: DeepSpeed cannot convert it to a universal checkpoint ({type(err).__name__}: "
            f"{detail}); resume it with the world size and deepspeed.zero_stage it was saved with"
        ) from None


@contextlib.contextmanager
def universal_loading(ds_engine: Any) -> Iterator[None]:
    """DeepSpeed's ``checkpoint.load_universal`` for one ``load_checkpoint`` call: the engine reads the flag
    only while loading, and a run decides it per checkpoint, after the engine is built. Every file is read with
    ``weights_only=True`` (DeepSpeed's universal loader calls ``torch.load`` itself)."""
    config = ds_engine._config
    before = config.load_universal_checkpoint
    config.load_universal_checkpoint = True
    try:
        with safe_torch_loads():
            yield
    finally:
        config.load_universal_checkpoint = before


def seed_new_rank(seed: int, step: int, rank: int) -> None:
    """The python, numpy and torch generators of a rank the checkpoint had no state for, from (seed, step,
    rank): reproducible, and distinct across ranks."""
    value = (seed * 1_000_003 + step * 7_919 + rank * 104_729 + 1) % (2**32)
    random.seed(value)
    np.random.seed(value)
    torch.manual_seed(value)
