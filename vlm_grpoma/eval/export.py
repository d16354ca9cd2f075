"""``vlm-grpoma export CHECKPOINT --out DIR``: a checkpoint as a self-contained Hugging Face folder.

The folder holds the weights (safetensors; a LoRA chain merged with ``--merge-lora``), the processor
(tokenizer, image processor, chat template) and a generation config, and names no folder of the machine it
came from, so ``transformers.AutoModelForImageTextToText.from_pretrained(DIR)``, ``AutoProcessor`` and
``vllm.LLM(DIR)`` load it anywhere. Without ``--merge-lora`` a LoRA checkpoint is exported as an adapter only
when its base is a hub id (else the folder would not be self-contained). It is written into a temporary
folder beside ``DIR`` and renamed into place, so an interrupted export leaves no half folder.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from vlm_grpoma.errors import CheckpointError, CommandError, StorageError
from vlm_grpoma.models.sources import ADAPTER_CONFIG, AdapterChain, adapter_chain

#: Files of an exported adapter copied from the checkpoint (the processor is saved separately).
_ADAPTER_FILES = (ADAPTER_CONFIG, "adapter_model.safetensors")


@dataclass(frozen=True)
class Exported:
    """What :func:`export_checkpoint` wrote: the folder and what it holds."""

    out: Path
    kind: str  # "full weights", "merged LoRA" or "LoRA adapter on <hub id>"
    source: Path


def _prepare_out(out: Path) -> Path:
    """The temporary folder to write into; refuses an ``out`` that exists and is not empty."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise StorageError(f"--out {out}: exists and is not an empty folder; name a new one")
    tmp = out.parent / f".tmp-export-{out.name}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    except OSError as err:
        raise StorageError(f"--out {out}: cannot write there: {(err.strerror or str(err)).lower()}") from None
    return tmp


def _processor_source(model_dir: Path, chain: AdapterChain) -> str:
    """The checkpoint's own processor (the trainer saves it beside the weights), else the base model's."""
    if (model_dir / "preprocessor_config.json").is_file() or (model_dir / "processor_config.json").is_file():
        return str(model_dir)
    return chain.base


def _save_processor_and_generation(source: str, tmp: Path, model_config) -> None:
    """Processor with its chat template, and a generation config (from the model's when it has none)."""
    from transformers import AutoProcessor, GenerationConfig

    processor = AutoProcessor.from_pretrained(source)
    processor.save_pretrained(tmp)
    if not (tmp / "generation_config.json").is_file():
        generation = GenerationConfig.from_model_config(model_config)
        tokenizer = processor.tokenizer
        generation.eos_token_id = generation.eos_token_id or tokenizer.eos_token_id
        generation.pad_token_id = generation.pad_token_id or tokenizer.pad_token_id
        generation.save_pretrained(tmp)


def _export_merged(chain: AdapterChain, tmp: Path):
    """Load the base, merge every adapter of the chain, and save full weights; returns the model config."""
    import torch
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(chain.base, dtype="auto")
    if chain.adapters:
        from peft import PeftModel

        for folder in chain.adapters:
            model = PeftModel.from_pretrained(model, folder).merge_and_unload()
    name = tmp.parent.name if tmp.parent.name else "model"
    model.name_or_path = model.config.name_or_path = name  # no path of this machine in config.json
    with torch.no_grad():
        model.save_pretrained(tmp, safe_serialization=True)
    return model.config


def _check_own_files(model_dir: Path) -> None:
    """The adapter files export copies must be the folder's own: a symlink that leads out of it (a
    downloaded checkpoint pointing at ``~/.ssh/id_ed25519``) would be copied into the export verbatim."""
    folder = model_dir.resolve()
    for name in _ADAPTER_FILES:
        path = model_dir / name
        if path.is_symlink() and not path.resolve().is_relative_to(folder):
            raise CheckpointError(
                f"{path}: a symlink to {os.readlink(path)}, outside the model folder; export copies only the "
                "folder's own files (copy the real file in if it is yours)"
            )


def _export_adapter(model_dir: Path, chain: AdapterChain, tmp: Path):
    """Copy a one-adapter chain on a hub model, recording the hub id as its base."""
    from transformers import AutoConfig

    _check_own_files(model_dir)
    for name in _ADAPTER_FILES:
        shutil.copy2(model_dir / name, tmp / name)
    config = json.loads((tmp / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = chain.base
    (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return AutoConfig.from_pretrained(chain.base)


def export_checkpoint(
    checkpoint: str | Path, out: str | Path, *, merge_lora: bool = False, base: str | None = None
) -> Exported:
    """Export ``checkpoint`` (run, step or model folder) into the new folder ``out``; ``base`` replaces the
    full model a LoRA chain rests on (its recorded base is not on this machine)."""
    from vlm_grpoma.eval.loading import model_folder

    model_dir = model_folder(checkpoint)
    chain = adapter_chain(model_dir, base=base)
    out = Path(out)
    if chain.is_adapter and not merge_lora:
        if len(chain.adapters) > 1 or os.path.isdir(chain.base):
            what = f"{len(chain.adapters)} LoRA adapters" if len(chain.adapters) > 1 else "a LoRA adapter"
            raise CommandError(
                f"{model_dir}: {what} on the local model {chain.base}; pass --merge-lora for a self-contained "
                "folder (an adapter alone is exported only on a hub model)"
            )
    tmp = _prepare_out(out)
    try:
        if chain.is_adapter and not merge_lora:
            model_config, kind = _export_adapter(model_dir, chain, tmp), f"LoRA adapter on {chain.base}"
        else:
            model_config = _export_merged(chain, tmp)
            kind = "merged LoRA" if chain.is_adapter else "full weights"
        _save_processor_and_generation(_processor_source(model_dir, chain), tmp, model_config)
        if out.exists():
            out.rmdir()  # empty, checked above
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Exported(out, kind, model_dir)


def main(args: argparse.Namespace) -> int:
    """``vlm-grpoma export CHECKPOINT --out DIR [--merge-lora] [--base MODEL]``."""
    try:
        done = export_checkpoint(args.checkpoint, args.out, merge_lora=args.merge_lora, base=args.base)
    except StorageError:  # already one line naming --out (it is an OSError too)
        raise
    except OSError as err:  # reading the checkpoint or writing the folder
        raise CheckpointError(f"export {args.checkpoint}: {type(err).__name__}: {err}") from None
    print(f"exported {done.source} ({done.kind}) to {done.out}")
    return 0


__all__ = ["Exported", "export_checkpoint", "main"]
