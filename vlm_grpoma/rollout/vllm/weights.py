"""Weight sync into vLLM: the checkpoint name vLLM expects for each training parameter, the weights with LoRA
deltas merged out of place, a counter of what was streamed, and the CPU build's re-packing of a tied output
layer after an in-place reload.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch


def vllm_weight_name(name: str) -> str | None:
    """The checkpoint name vLLM's ``load_weights`` expects for a training parameter, or None to skip it.

    PEFT wraps the model (``base_model.model.``), moves LoRA-wrapped weights to ``.base_layer`` and keeps
    ``lora_*`` factors and, for ``modules_to_save``, a frozen ``original_module`` next to the trained copy.
    """
    name = name.removeprefix("base_model.model.")
    if ".lora_" in name or ".original_module." in name:
        return None
    return name.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")


def merged_weights(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(vLLM name, tensor)`` for every weight of ``module`` with LoRA deltas added out of place.

    The training weights are never modified (merging in place and unmerging in bf16 drifts); tensors come
    detached, one at a time, so ``load_weights`` can stream them. Parameters must be materialised (gathered
    under ZeRO-3) while the iterator runs.
    """
    lora_layers = {
        name: layer
        for name, layer in module.named_modules()
        if hasattr(layer, "get_delta_weight") and hasattr(layer, "base_layer")
    }
    for name, param in module.named_parameters():
        target = vllm_weight_name(name)
        if target is None:
            continue
        tensor = param.detach()
        owner = name.rsplit(".", 2)[0] if name.endswith(".base_layer.weight") else None
        layer = lora_layers.get(owner) if owner else None
        if (
            layer is not None
            and not getattr(layer, "merged", False)
            and not getattr(layer, "disable_adapters", False)
        ):
            for adapter in layer.active_adapters:
                if adapter in getattr(layer, "lora_A", {}):
                    tensor = tensor + layer.get_delta_weight(adapter).to(tensor.dtype)
        yield target, tensor


class Counted:
    """An iterable of ``(name, tensor)`` pairs that counts what it yields."""

    def __init__(self, pairs: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.pairs, self.count = pairs, 0

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for pair in self.pairs:
            self.count += 1
            yield pair


def repack_tied_output_layers(model: torch.nn.Module) -> int:
    """CPU vLLM only: rebuild the packed kernel weight of every output layer tied to an input embedding.

    The CPU build packs each linear weight into a kernel layout after loading. An in-place reload writes the
    shared embedding tensor, but the tied output layer loads nothing by name, so its post-load step does not
    run again and it would keep computing logits from the old packed copy. Returns the layers repacked.
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    embeddings = {
        layer.weight.data_ptr()
        for layer in model.modules()
        if isinstance(layer, VocabParallelEmbedding) and not isinstance(layer, ParallelLMHead)
    }
    tied = [
        layer
        for layer in model.modules()
        if isinstance(layer, ParallelLMHead) and layer.weight.data_ptr() in embeddings
    ]
    for layer in tied:
        layer.quant_method.process_weights_after_loading(layer)
    return len(tied)
