"""Loading DeepSpeed state without running code from the checkpoint.

DeepSpeed's checkpoint engine unpickles ``deepspeed/state/*.pt`` with ``torch.load(weights_only=False)``, so a
copied or tampered checkpoint could execute anything on ``checkpoint.resume``. :func:`use_safe_checkpoint_loading`
swaps in an engine that loads with ``weights_only=True`` and allows, beyond tensors and plain containers, only
the DeepSpeed classes its optimizers save (listed in :data:`DEEPSPEED_STATE_TYPES`). Anything else is refused
with a :class:`~vlm_grpoma.errors.CheckpointError` naming the file and the object. DeepSpeed's universal
checkpoint conversion and loading call ``torch.load`` directly; :func:`safe_torch_loads` covers them.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from vlm_grpoma.errors import CheckpointError

_torch_load = torch.load  # the real one, also while safe_torch_loads() stands in for it


def deepspeed_state_types() -> list[type]:
    """The non-builtin classes DeepSpeed 0.19 pickles into its optimizer state: the ZeRO stage enum, the (static
    or dynamic) loss scaler, and the fragment addresses of ZeRO-1/2 and bf16 parameter slices."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [ZeroStageEnum, LossScaler, DynamicLossScaler, fragment_address]


def safe_torch_load(path: str, map_location: Any = None) -> Any:
    """``torch.load`` of a checkpoint file with ``weights_only=True`` and DeepSpeed's state classes allowed."""
    with torch.serialization.safe_globals(deepspeed_state_types()):
        try:
            return _torch_load(path, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as err:
            found = re.search(r"GLOBAL ([\w.]+)|global ([\w.]+)|Unsupported operand \d+", str(err))
            what = next((g for g in found.groups() if g), found.group(0)) if found else "code"
            raise CheckpointError(
                f"{path}: refused to load: it holds {what}, which is not checkpoint data (damaged, or not "
                "written by vlm-grpoma); only resume from checkpoints you trust"
            ) from None
        except (RuntimeError, EOFError, ValueError) as err:
            raise CheckpointError(f"{path}: cannot be read ({str(err).splitlines()[0][:200]})") from None


def use_safe_checkpoint_loading(engine: Any) -> None:
    """Make ``engine`` (a DeepSpeedEngine) load every checkpoint file through :func:`safe_torch_load`."""
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    current = engine.checkpoint_engine
    if type(current) is not TorchCheckpointEngine:
        raise CheckpointError(
            f"DeepSpeed checkpoint engine {type(current).__name__} is not supported: vlm-grpoma loads "
            "checkpoints only through the default torch engine (remove the 'checkpoint' section of "
            "deepspeed.config_file)"
        )

    class SafeTorchCheckpointEngine(TorchCheckpointEngine):
        def load(self, path: str, map_location: Any = None) -> Any:
            return safe_torch_load(path, map_location)

    current.__class__ = SafeTorchCheckpointEngine


@contextmanager
def safe_torch_loads() -> Iterator[None]:
    """Inside, every ``torch.load`` is :func:`safe_torch_load`: DeepSpeed's universal-checkpoint conversion and
    loading call ``torch.load(weights_only=False)`` themselves, outside its checkpoint engine."""

    def load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        return safe_torch_load(str(f), map_location)

    torch.load = load
    try:
        yield
    finally:
        torch.load = _torch_load
