"""`vlm-grpoma rollout-server` for real: a server subprocess with the CPU vLLM build, the trainer-side backend
pushing weights to it and sampling from it. What the backend contract suite does not cover: the digest of every
push equals the trainer's weights, a rank waits (bounded) for the version it is on, a restarted server gets the
current weights back before it serves, and a dead server is one line naming it. Marker ``vllm``."""

from __future__ import annotations

import importlib.util
import threading
import time
from contextlib import contextmanager

import pytest
import torch
from PIL import Image

from tests.rollout.server_process import start_server
from vlm_grpoma.answers import Box, Boxes
from vlm_grpoma.config import Config, ModelConfig, RolloutConfig, RolloutServerConfig
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.errors import RolloutServerError
from vlm_grpoma.models.loading import load_model
from vlm_grpoma.rollout.backends import build_rollout_engine
from vlm_grpoma.rollout.server.client import ServerRolloutEngine
from vlm_grpoma.rollout.server.wire import encode_weights, weights_digest
from vlm_grpoma.rollout.vllm.weights import merged_weights
from vlm_grpoma.sampling import SamplingParams

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed in this environment (`make test-vllm` runs these tests in .venv-vllm)",
    ),
]
#: the module's server: the trainer's pixel bounds, and LoRA on so that it can take LoRA-only pushes
SERVER_OVERRIDES = ("model.max_pixels=12544", "model.lora.enabled=true")
PARAMS = SamplingParams(
    num_thoughts=2, answers_per_thought=2, max_thought_tokens=6, max_answer_tokens=4, seed=1, ignore_stop=True
)


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory):
    """(server, config, loaded model, prompts) on the small Qwen2.5-VL."""
    torch.set_num_threads(1)
    folder = tiny_model_dir("qwen2_5_vl", "small")
    images = tmp_path_factory.mktemp("server-images")
    records = []
    for i in range(2):
        path = images / f"{i}.png"
        Image.new("RGB", (96 + 8 * i, 80), (50 * i, 120, 200)).save(path)
        records.append(
            Record(f"s{i}", str(path), "detection", "the square", 96 + 8 * i, 80, Boxes((Box(1, 1, 9, 9),)))
        )
    model_cfg = ModelConfig(name_or_path=str(folder), dtype="float32", max_pixels=112 * 112)
    loaded = load_model(model_cfg)
    loaded.model.eval()
    log = tmp_path_factory.mktemp("server") / "server.log"
    server = start_server(folder, log, *SERVER_OVERRIDES)
    config = Config(
        model=model_cfg,
        rollout=RolloutConfig(backend="vllm_server", server=RolloutServerConfig([server.url], timeout_s=8)),
    )
    yield server, config, loaded, loaded.adapter.build_inputs(records)
    server.stop()


def trainer_digest(model) -> str:
    return weights_digest(encode_weights(merged_weights(model)))


@contextmanager
def restored(model):
    """The block may change ``model``'s weights: they are put back after it."""
    original = {n: p.detach().clone() for n, p in model.named_parameters()}
    try:
        yield
    finally:
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(original[name])


def perturbed(model, seed: int) -> None:
    noise = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.01 * torch.randn(param.shape, generator=noise))


def test_every_push_leaves_the_trainers_weights_in_the_server(setup):
    server, config, loaded, prompts = setup
    engine = build_rollout_engine(config, loaded.model, loaded.adapter)  # pushes version 1
    tensors = len(list(loaded.model.parameters()))
    with restored(loaded.model):
        digests = []
        for push in range(2):
            held = server.health()
            assert (held["session"], held["version"]) == (engine.session, engine.version)
            assert held["digest"] == trainer_digest(loaded.model) and held["tensors"] == tensors
            digests.append(held["digest"])
            engine.sample(prompts, PARAMS)
            assert engine.sampled_version == engine.version
            perturbed(loaded.model, push)
            engine.update_weights(loaded.model)
        assert server.health()["digest"] == trainer_digest(loaded.model) not in digests


def test_a_rank_waits_for_the_version_it_is_on_and_no_longer_than_its_bound(setup):
    """A second rank on the same server (not its pusher) asks for the next version before the pusher has sent
    it: its request waits and is sampled with that version once pushed; without a push it fails in one line
    after half of timeout_s."""
    server, config, loaded, prompts = setup
    pusher = build_rollout_engine(config, loaded.model, loaded.adapter)
    other = ServerRolloutEngine.create(config, loaded.adapter)
    other.pusher, other.session, other.version = False, pusher.session, pusher.version + 1
    push = threading.Timer(1.5, pusher.update_weights, args=(loaded.model,))
    start = time.monotonic()
    push.start()
    other.sample(prompts, PARAMS)
    push.join()
    assert time.monotonic() - start >= 1.5 and other.sampled_version == pusher.version == other.version
    other.version += 1  # a push that never comes
    start = time.monotonic()
    with pytest.raises(
        RolloutServerError,
        match=f"^rollout server {server.url}: POST /sample refused \\(409\\): "
        f"weights version {other.version} of session {pusher.session} were not pushed within 4 s",
    ):
        other.sample(prompts, PARAMS)
    assert 4 <= time.monotonic() - start < 8


def test_a_restarted_server_gets_the_current_weights_before_it_serves(setup, tmp_path):
    server, config, loaded, prompts = setup
    engine = build_rollout_engine(config, loaded.model, loaded.adapter)
    with restored(loaded.model):
        perturbed(loaded.model, 7)
        engine.update_weights(loaded.model)
        before = engine.sample(prompts, PARAMS)
        server.stop()
        with pytest.raises(RolloutServerError, match=f"^rollout server {server.url}: unreachable"):
            engine.sample(prompts, PARAMS)
        port = int(server.url.rsplit(":", 1)[1])
        restarted = start_server(
            config.model.name_or_path, tmp_path / "restarted.log", *SERVER_OVERRIDES, port=port
        )
        assert restarted.health()["session"] is None  # the checkpoint's weights
        after = engine.sample(prompts, PARAMS)
        held = restarted.health()
        assert (held["session"], held["version"], held["digest"]) == (
            engine.session,
            engine.version,
            trainer_digest(loaded.model),
        )
        assert torch.equal(after.thought_ids, before.thought_ids) and torch.equal(
            after.answer_ids, before.answer_ids
        )
        server.process, server.log = restarted.process, restarted.log  # the module's server from here on


def test_a_lora_push_serves_what_the_full_push_of_the_merged_weights_serves(setup):
    """The server merges the pushed adapters onto its base; sampling then gives the tokens and log-probs a full
    push of the trainer's merged weights gives (the same seeds, one version apart)."""
    from dataclasses import replace

    from tests.rollout.test_lora_push import lora_model
    from vlm_grpoma.config import LoraConfig

    server, config, loaded, prompts = setup
    module = lora_model(config.model.name_or_path)
    lora_config = replace(config, model=replace(config.model, lora=LoraConfig(enabled=True)))
    engine = ServerRolloutEngine.create(lora_config, loaded.adapter)
    assert engine.base is not None and engine.base.fingerprint == server.health()["base"]
    engine.update_weights(module)
    lean, lean_tree = engine.last_push, engine.sample(prompts, PARAMS)
    engine.base = None  # the same weights, pushed whole
    engine.update_weights(module)
    full, full_tree = engine.last_push, engine.sample(prompts, PARAMS)
    assert lean.lean and not full.lean and lean.nbytes < 0.2 * full.nbytes
    assert torch.equal(lean_tree.thought_ids, full_tree.thought_ids)
    assert torch.equal(lean_tree.answer_ids, full_tree.answer_ids)
    torch.testing.assert_close(lean_tree.thought_logprobs, full_tree.thought_logprobs, rtol=0, atol=1e-4)


def test_the_rollout_server_benchmark_prints_its_tables():
    """benchmarks/rollout_server.py --quick: the three arms train and the push table shows a LoRA push smaller
    than a full one on the same server."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "rollout_server.py"
    run = subprocess.run(
        [sys.executable, str(script), "--quick", "--json"], capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "server+async / server:" in run.stdout and "Qwen2.5-VL-7B-Instruct   full" in run.stdout
    import json

    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    pushes = {row["push"]: row for row in rows if "push" in row}
    assert not pushes["full"]["lean"] and pushes["LoRA r=16"]["lean"]
    assert pushes["LoRA r=16"]["bytes"] < 0.2 * pushes["full"]["bytes"]
