"""Lean weight pushes for LoRA runs: the trainer sends the adapters, the server merges them onto its own base.

With LoRA only the adapter factors (and any fully trained module, such as an unfrozen vision tower) change
between steps, so the pushing rank sends those and the server streams every other tensor from the base
checkpoint it was started with, adding ``B·A`` (scale folded into ``B``) where an adapter sits: a push carries
``r·(in + out)`` numbers per adapted matrix instead of ``in·out``. Both sides fingerprint the base's safetensors
files (SHA-256 of their bytes); a lean push names the trainer's and the server refuses another, so the merged
weights are the trainer's exactly when the bases are equal, and the digest the server returns covers the base
and the pushed tensors together.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vlm_grpoma.rollout.server.wire import WireError, weights_digest
from vlm_grpoma.rollout.vllm.weights import vllm_weight_name

Pair = tuple[str, torch.Tensor]
#: ``(weight name, A [r, in], B·scale [out, r])``: one adapted matrix's update, ``B·A``.
Delta = tuple[str, torch.Tensor, torch.Tensor]

#: Checkpoint layouts of one weight: Qwen2/2.5-VL releases store ``model.layers.…`` and ``visual.…``,
#: transformers >= 4.52 names them ``model.language_model.…`` and ``model.visual.…`` (Qwen3-VL stores those).
_CANONICAL_PREFIXES = (("model.language_model.", "model."), ("model.visual.", "visual."))


def canonical_name(name: str) -> str:
    """One name per weight, whichever checkpoint layout spelled it."""
    for prefix, canonical in _CANONICAL_PREFIXES:
        if name.startswith(prefix):
            return canonical + name.removeprefix(prefix)
    return name


@dataclass(frozen=True)
class LeanPush:
    """What a LoRA run pushes: fully trained tensors and adapter deltas, by checkpoint name."""

    weights: list[Pair]
    deltas: list[Delta]

    def pairs(self) -> list[Pair]:
        """Everything pushed as ``(name, tensor)`` pairs (a delta's factors as ``name#A``, ``name#B``)."""
        return self.weights + [
            pair for name, a, b in self.deltas for pair in ((f"{name}#A", a), (f"{name}#B", b))
        ]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for _, t in self.pairs())


def served_digest(base_fingerprint: str, pushed: LeanPush) -> str:
    """The digest of what a server serves after a lean push: its base and the pushed tensors together."""
    return hashlib.sha256(f"{base_fingerprint}|{weights_digest(pushed.pairs())}".encode()).hexdigest()


def _plain_adapter(layer: Any) -> str | None:
    """The one active adapter of a PEFT LoRA linear layer whose update is ``scale·B·A``, else None (DoRA,
    transposed weights, embeddings, several adapters at once, merged in place)."""
    active = list(getattr(layer, "active_adapters", []))
    if len(active) != 1 or getattr(layer, "merged", False) or getattr(layer, "disable_adapters", False):
        return None
    adapter = active[0]
    if adapter not in getattr(layer, "lora_A", {}) or getattr(layer, "fan_in_fan_out", False):
        return None
    if getattr(layer, "use_dora", {}).get(adapter, False) or not isinstance(
        layer.base_layer, torch.nn.Linear
    ):
        return None
    return adapter


def lean_push(module: torch.nn.Module) -> LeanPush | None:
    """The LoRA run's push from ``module`` (materialised: ZeRO-3 gathered), or None where some adapter is not
    a plain ``scale·B·A`` (the full merged weights are pushed then)."""
    deltas: list[Delta] = []
    for name, layer in module.named_modules():
        if not (hasattr(layer, "get_delta_weight") and hasattr(layer, "base_layer")):
            continue
        adapter = _plain_adapter(layer)
        target = vllm_weight_name(f"{name}.base_layer.weight")
        if adapter is None or target is None:
            return None
        a = layer.lora_A[adapter].weight.detach()
        b = layer.lora_B[adapter].weight.detach() * layer.scaling[adapter]
        deltas.append((target, a.to("cpu").contiguous(), b.to("cpu").contiguous()))
    if not deltas:
        return None
    weights = [
        (target, param.detach().to("cpu").contiguous())
        for name, param in module.named_parameters()
        if param.requires_grad and (target := vllm_weight_name(name)) is not None
    ]
    return LeanPush(weights, deltas)


class BaseCheckpoint:
    """A model folder's safetensors files, read one tensor at a time (memory-mapped)."""

    def __init__(self, folder: str | Path) -> None:
        self.files = sorted(Path(folder).glob("*.safetensors"))
        if not self.files:
            raise FileNotFoundError(f"{folder}: no safetensors files")
        self._fingerprint = ""

    @classmethod
    def of_model(cls, name_or_path: str) -> BaseCheckpoint | None:
        """The checkpoint behind a full model folder or a hub id already in the local cache; None for an
        adapter folder (its served weights are not a file on disk) or a model without safetensors."""
        from vlm_grpoma.models.sources import adapter_chain

        if adapter_chain(name_or_path).is_adapter:
            return None
        folder = Path(name_or_path)
        if not folder.is_dir():
            try:
                from huggingface_hub import snapshot_download

                folder = Path(snapshot_download(name_or_path, local_files_only=True))
            except Exception:  # not cached (or not a hub id): pushes stay full
                return None
        try:
            return cls(folder)
        except FileNotFoundError:
            return None

    @property
    def fingerprint(self) -> str:
        """SHA-256 over the files' names and bytes (computed once; about a second per GB)."""
        if not self._fingerprint:
            digest = hashlib.sha256()
            for path in self.files:
                digest.update(f"{path.name}|{path.stat().st_size}|".encode())
                with open(path, "rb") as f:
                    while chunk := f.read(1 << 24):
                        digest.update(chunk)
            self._fingerprint = digest.hexdigest()
        return self._fingerprint

    @functools.cached_property
    def shapes(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Canonical name -> (stored name, shape) of every tensor (read from the headers once)."""
        from safetensors import safe_open

        found = {}
        for path in self.files:
            with safe_open(path, "pt") as f:
                for name in f.keys():
                    found[canonical_name(name)] = (name, tuple(f.get_slice(name).get_shape()))
        return found

    def check(self, push: LeanPush, what: str) -> None:
        """Every pushed name is a base tensor of the shape the push implies (WireError naming the first that
        is not), before anything is loaded."""
        shapes = self.shapes

        def expect(name: str, shape: tuple[int, ...]) -> None:
            stored = shapes.get(canonical_name(name))
            if stored is None:
                raise WireError(f"{what}: {name} is not a tensor of the server's base model")
            if stored[1] != shape:
                raise WireError(
                    f"{what}: {name} has shape {stored[1]} in the base model, the push implies {shape}"
                )

        for name, tensor in push.weights:
            expect(name, tuple(tensor.shape))
        for name, a, b in push.deltas:
            if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
                raise WireError(
                    f"{what}: {name}: adapter factors of shapes {tuple(a.shape)}, {tuple(b.shape)}"
                )
            expect(name, (b.shape[0], a.shape[1]))

    def merged(self, push: LeanPush) -> Iterator[Pair]:
        """Every base tensor, in file order, with the pushed tensors in place and each delta added (in float32,
        stored back in the base's dtype); one tensor in memory at a time."""
        from safetensors import safe_open

        replaced = {canonical_name(name): tensor for name, tensor in push.weights}
        deltas = {canonical_name(name): (a, b) for name, a, b in push.deltas}
        for path in self.files:
            with safe_open(path, "pt") as f:
                for name in f.keys():
                    key = canonical_name(name)
                    if key in replaced:
                        yield name, replaced[key]
                        continue
                    tensor = f.get_tensor(name)
                    if key in deltas:
                        a, b = deltas[key]
                        tensor = (tensor.float() + b.float() @ a.float()).to(tensor.dtype)
                    yield name, tensor


def decode_deltas(value: Any, what: str) -> list[Delta]:
    if not isinstance(value, list) or not all(
        isinstance(item, tuple)
        and len(item) == 3
        and isinstance(item[0], str)
        and all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in item[1:])
        for item in value
    ):
        raise WireError(f"{what}: 'deltas' must be a list of (name, A, B) triples of float tensors")
    return value
