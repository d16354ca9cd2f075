"""LoRA-only weight pushes (issue #51): the server's merge of the pushed adapters onto its own base checkpoint is
the trainer's own merged weights, for every family; the push is a few percent of a full one; a push that does
not fit the server's base is refused in one line before anything loads; and through the real client, handler
and service (a recording engine in place of vLLM's), the digests agree. The vLLM server: test_rollout_server.py."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
import torch

from vlm_grpoma.config import LoraConfig, ModelConfig
from vlm_grpoma.errors import RolloutServerError
from vlm_grpoma.models.loading import load_model, prepare_trainable
from vlm_grpoma.rollout.server.client import ServerRolloutEngine
from vlm_grpoma.rollout.server.lora_push import BaseCheckpoint, LeanPush, canonical_name, lean_push
from vlm_grpoma.rollout.server.service import BoundedHTTPServer, RolloutService, handler_for
from vlm_grpoma.rollout.server.wire import WireError, encode_weights
from vlm_grpoma.rollout.vllm.weights import merged_weights


def lora_model(model_dir, r: int = 4, freeze_vision: bool = True):
    """The model of ``model_dir`` with LoRA adapters whose B factors are random (PEFT starts them at zero,
    where any merge rule would pass)."""
    torch.manual_seed(0)
    config = ModelConfig(
        name_or_path=str(model_dir),
        dtype="float32",
        freeze_vision=freeze_vision,
        lora=LoraConfig(enabled=True, r=r, alpha=2 * r),
    )
    model = prepare_trainable(load_model(config).model, config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.normal_(0, 0.05)
            elif ".modules_to_save." in name:
                param.add_(0.01)  # a trained vision tower differs from the base's
    return model


def by_canonical_name(pairs) -> dict[str, torch.Tensor]:
    return {canonical_name(name): tensor for name, tensor in pairs}


@pytest.mark.parametrize("freeze_vision", [True, False])
def test_the_servers_merge_onto_its_base_is_the_trainers_merged_model(tiny_model_dir, arch, freeze_vision):
    folder = tiny_model_dir(arch)
    module = lora_model(folder, freeze_vision=freeze_vision)
    push = lean_push(module)
    assert push is not None and push.deltas
    assert bool(push.weights) is not freeze_vision  # the trained vision tower travels whole
    base = BaseCheckpoint(folder)
    base.check(push, "test")
    served = by_canonical_name(base.merged(push))
    expected = by_canonical_name(merged_weights(module))
    assert served.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(served[name], tensor, rtol=0, atol=1e-6, msg=name)
    plain = by_canonical_name(base.merged(LeanPush([], [])))
    assert sum(not torch.equal(served[name], plain[name]) for name in served) >= len(push.deltas)


def test_a_lora_push_is_a_few_percent_of_a_full_one_on_the_small_preset(tiny_model_dir):
    module = lora_model(tiny_model_dir("qwen2_5_vl", "small"), r=4)
    push = lean_push(module)
    full = sum(t.numel() * t.element_size() for _, t in encode_weights(merged_weights(module)))
    assert push is not None and push.nbytes <= 0.05 * full, (push.nbytes, full)


def test_a_push_that_does_not_fit_the_base_is_refused_naming_the_tensor(tiny_model_dir):
    folder = tiny_model_dir("qwen2_5_vl")
    push = lean_push(lora_model(folder))
    base = BaseCheckpoint(folder)
    name, a, b = push.deltas[0]
    with pytest.raises(WireError, match="is not a tensor of the server's base model"):
        base.check(LeanPush([], [("model.layers.99.mlp.up_proj.weight", a, b)]), "POST /weights")
    with pytest.raises(WireError, match=f"{name} has shape"):
        base.check(LeanPush([], [(name, a[:, :-1], b)]), "POST /weights")
    with pytest.raises(WireError, match="adapter factors of shapes"):
        base.check(LeanPush([], [(name, a, b[:, :-1])]), "POST /weights")


def test_an_adapter_that_is_not_plain_lora_pushes_the_full_weights(tiny_model_dir):
    module = lora_model(tiny_model_dir("qwen2_5_vl"))
    layer = next(m for m in module.modules() if hasattr(m, "use_dora") and m.lora_A)
    layer.use_dora["default"] = True
    assert lean_push(module) is None


@dataclass
class RecordingEngine:
    """What the server's engine was handed, by name (the vLLM engine streams the same iterator)."""

    device: str = "cpu"
    stats: dict[str, float] = field(default_factory=dict)
    loaded: dict[str, torch.Tensor] = field(default_factory=dict)

    def load_weights(self, pairs):
        self.loaded = by_canonical_name(pairs)
        return len(self.loaded)


@contextmanager
def serving(folder):
    service = RolloutService(
        RecordingEngine(), {"model": "tiny", "device": "cpu"}, base=BaseCheckpoint(folder)
    )
    server = BoundedHTTPServer(("127.0.0.1", 0), handler_for(service))
    stop = threading.Event()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    threading.Thread(target=service.run_engine, args=(stop,), daemon=True).start()
    try:
        yield service, f"http://127.0.0.1:{server.server_port}"
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


def test_through_the_real_client_and_handler_the_server_serves_the_trainers_weights(tiny_model_dir):
    folder = tiny_model_dir("qwen2_vl")
    module = lora_model(folder)
    with serving(folder) as (service, url):
        trainer = ServerRolloutEngine(url, None, 30.0, True, "s", base=BaseCheckpoint(folder))
        trainer.update_weights(module)
        assert trainer.last_push.lean and service.held.digest == trainer._pushed[1]
        expected = by_canonical_name(merged_weights(module))
        for name, tensor in expected.items():
            torch.testing.assert_close(service.engine.loaded[name], tensor, rtol=0, atol=1e-6, msg=name)
        full = ServerRolloutEngine(url, None, 30.0, True, "s")  # no shared base: the full weights
        full.version = 1
        full.update_weights(module)
        assert not full.last_push.lean and full.last_push.nbytes > 2 * trainer.last_push.nbytes

        other = tiny_model_dir("qwen2_vl", seed=1)
        stranger = ServerRolloutEngine(url, None, 30.0, True, "s", base=BaseCheckpoint(other))
        stranger.version = 2
        with pytest.raises(RolloutServerError, match="onto another base model"):
            stranger.update_weights(module)
