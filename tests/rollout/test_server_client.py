"""The rollout server's wire format and the client's failures, without vLLM: real trees from the transformers
backend through the real encoding, and real sockets for a server that is absent, silent or not a rollout server.
The server itself (the vLLM engine behind HTTP) is tested in ``test_rollout_server.py`` (``make test-vllm``)."""

from __future__ import annotations

import http.server
import io
import pickle
import socket
import threading
import time

import pytest
import torch
from PIL import Image

from vlm_grpoma.answers import Box, Boxes
from vlm_grpoma.config import Config, ModelConfig, RolloutConfig, RolloutServerConfig, validate
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.distributed import free_port
from vlm_grpoma.errors import ConfigError, RolloutServerError
from vlm_grpoma.models.loading import load_model
from vlm_grpoma.rollout.hf import HFRolloutEngine
from vlm_grpoma.rollout.server.client import ServerRolloutEngine
from vlm_grpoma.rollout.server.wire import (
    WireError,
    decode_params,
    decode_prompts,
    decode_tree,
    dumps,
    encode_params,
    encode_prompts,
    encode_tree,
    loads,
    weights_digest,
)
from vlm_grpoma.sampling import SamplingParams


@pytest.fixture(scope="module")
def loaded(tiny_model_dir, tmp_path_factory):
    torch.set_num_threads(1)
    model = load_model(ModelConfig(name_or_path=str(tiny_model_dir("qwen2_5_vl")), dtype="float32"))
    model.model.eval()
    folder = tmp_path_factory.mktemp("wire-images")
    records = []
    for i, (w, h) in enumerate([(100, 80), (40, 150)]):
        path = folder / f"{i}.png"
        Image.effect_noise((w, h), 40 + 10 * i).convert("RGB").save(path)
        records.append(Record(f"r{i}", str(path), "detection", "the square", w, h, Boxes((Box(1, 1, 9, 9),))))
    return model, model.adapter.build_inputs(records)


def test_prompts_params_and_trees_survive_the_wire(loaded):
    model, prompts = loaded
    params = SamplingParams(
        num_thoughts=2, answers_per_thought=3, max_thought_tokens=5, max_answer_tokens=4, seed=3
    )
    tree = HFRolloutEngine.for_adapter(model.model, model.adapter).sample(prompts, params)
    body = loads(
        dumps(
            {"prompts": encode_prompts(prompts), "params": encode_params(params), "tree": encode_tree(tree)}
        ),
        "t",
    )
    served = decode_prompts(body["prompts"], "t")
    for ours, theirs in zip(prompts, served, strict=True):
        assert theirs.record.id == ours.record.id and torch.equal(theirs.input_ids, ours.input_ids)
        assert len(theirs.images) == len(ours.images)
        for mine, served_image in zip(ours.images, theirs.images):
            assert served_image.size == mine.size
            assert served_image.tobytes() == mine.convert("RGB").tobytes()
    assert decode_params(body["params"], "t") == params
    back = decode_tree(body["tree"], prompts, "t")
    for name, value in vars(tree).items():
        other = getattr(back, name)
        assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other, name


def test_a_foreign_or_damaged_body_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "ran"

    class Payload:  # unpickling this would run touch(marker)
        def __reduce__(self):
            return (marker.touch, ())

    buffer = io.BytesIO()
    torch.save({"x": 1}, buffer)
    for body in (pickle.dumps(Payload()), buffer.getvalue()[:-9], b"", b"GET / HTTP/1.1"):
        with pytest.raises(WireError, match="^POST /sample: not a rollout-server body"):
            loads(body, "POST /sample")
    assert not marker.exists()
    with pytest.raises(WireError, match="unknown sampling parameters \\['temprature'\\]"):
        decode_params({"temprature": 1.0}, "POST /sample")
    with pytest.raises(WireError, match="num_thoughts"):
        decode_params({"num_thoughts": 0}, "POST /sample")
    with pytest.raises(WireError, match="prompts\\[0\\]: input_ids must be a 1-d long tensor"):
        decode_prompts([{"record_id": "a", "input_ids": torch.zeros(2, 2), "images": []}], "POST /sample")
    ids = torch.zeros(3, dtype=torch.long)
    with pytest.raises(WireError, match="prompts\\[0\\]: images\\[1\\] must be a uint8 \\[H, W, 3\\] tensor"):
        good = torch.zeros(4, 4, 3, dtype=torch.uint8)
        decode_prompts([{"record_id": "a", "input_ids": ids, "images": [good, good[..., 0]]}], "POST /sample")
    with pytest.raises(WireError, match="prompts\\[0\\]: 'images' is NoneType"):
        decode_prompts([{"record_id": "a", "input_ids": ids, "images": None}], "POST /sample")


def test_the_weights_digest_sees_any_change():
    a = [("w", torch.arange(6.0).reshape(2, 3)), ("b", torch.zeros(3, dtype=torch.bfloat16))]
    assert weights_digest(a) == weights_digest([(n, t.clone()) for n, t in a])
    changed = [("w", a[0][1].clone()), a[1]]
    changed[0][1][1, 2] = torch.nextafter(changed[0][1][1, 2], torch.tensor(9.0))  # one ulp
    renamed, reshaped = [("v", a[0][1]), a[1]], [("w", a[0][1].reshape(3, 2)), a[1]]
    recast = [a[0], ("b", a[1][1].to(torch.float16))]
    digests = {weights_digest(x) for x in (a, changed, renamed, reshaped, recast)}
    assert len(digests) == 5


def server_config(url: str, timeout_s: float = 600.0) -> Config:
    return Config(rollout=RolloutConfig(backend="vllm_server", server=RolloutServerConfig([url], timeout_s)))


def test_server_addresses_are_checked_up_front():
    with pytest.raises(ConfigError, match="^rollout.server.urls: is empty but rollout.backend=vllm_server"):
        validate(Config(rollout=RolloutConfig(backend="vllm_server")))
    for url in ("localhost:8400", "http://host", "https://h:1", "http://h:port", "http://h:99999"):
        with pytest.raises(ConfigError, match="^rollout.server.urls\\[1\\]: .* is not an http://host:port"):
            validate(
                Config(
                    rollout=RolloutConfig(
                        backend="vllm_server", server=RolloutServerConfig(["http://a:1", url])
                    )
                )
            )
    validate(server_config("http://10.0.0.5:8400"))


def test_an_absent_server_is_one_line_naming_it(loaded):
    url = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(RolloutServerError, match=f"^rollout server {url}: unreachable .*rollout-server"):
        ServerRolloutEngine.create(server_config(url), loaded[0].adapter)
    assert time.monotonic() - start < 5


def test_a_silent_server_is_one_line_within_the_timeout(loaded):
    listener = socket.create_server(("127.0.0.1", 0))  # accepts connections (backlog), never answers
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        start = time.monotonic()
        with pytest.raises(
            RolloutServerError,
            match=f"^rollout server {url}: no reply to GET /health within rollout.server.timeout_s=1 s",
        ):
            ServerRolloutEngine.create(server_config(url, timeout_s=1), loaded[0].adapter)
        assert 1 <= time.monotonic() - start < 4
    finally:
        listener.close()


def test_something_else_on_the_port_is_named(loaded):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        with pytest.raises(RolloutServerError, match=f"^rollout server {url}: GET /health refused \\(404\\)"):
            ServerRolloutEngine.create(server_config(url), loaded[0].adapter)
    finally:
        server.shutdown()
        server.server_close()
