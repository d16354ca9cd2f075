"""The rollout server against strangers (issue #49): the real HTTP handler and service on a loopback port, with
the transformers sampler standing in for the vLLM engine, driven by the real client and by raw requests.

A caller without the token cannot push weights, sample, replay a captured request or learn the session from
``/health``; bodies beyond their endpoint's limit are refused before they are read; a wait is bounded; a push
that fails to load leaves the server serving nothing; the client refuses a reply sampled with older weights
and re-pushes to a server that holds another run's. The vLLM server itself: ``test_rollout_server.py``."""

from __future__ import annotations

import http.client
import json
import math
import os
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import pytest
import torch
from PIL import Image

from vlm_grpoma.answers import Box, Boxes
from vlm_grpoma.config import Config, ModelConfig, RolloutConfig, RolloutServerConfig
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.errors import ConfigError, RolloutServerError
from vlm_grpoma.models.loading import load_model
from vlm_grpoma.rollout.hf import HFRolloutEngine
from vlm_grpoma.rollout.server.auth import (
    NONCE_HEADER,
    TIME_HEADER,
    RequestVerifier,
    is_loopback,
    read_token,
    signed_headers,
)
from vlm_grpoma.rollout.server.client import ServerRolloutEngine
from vlm_grpoma.rollout.server.service import (
    BoundedHTTPServer,
    RolloutService,
    ServerLimits,
    handler_for,
    server_verifier,
)
from vlm_grpoma.rollout.server.wire import dumps, encode_params, encode_prompts
from vlm_grpoma.sampling import SamplingParams

TOKEN = b"0123456789abcdef0123456789abcdef"
PARAMS = SamplingParams(
    num_thoughts=2, answers_per_thought=2, max_thought_tokens=4, max_answer_tokens=3, seed=1
)


@pytest.fixture(scope="module")
def loaded(tiny_model_dir, tmp_path_factory):
    torch.set_num_threads(1)
    model = load_model(ModelConfig(name_or_path=str(tiny_model_dir("qwen2_5_vl")), dtype="float32"))
    model.model.eval()
    path = tmp_path_factory.mktemp("security-images") / "0.png"
    Image.effect_noise((64, 48), 40).convert("RGB").save(path)
    record = Record("r0", str(path), "detection", "the square", 64, 48, Boxes((Box(1, 1, 9, 9),)))
    return model, model.adapter.build_inputs([record])


@dataclass
class StandInEngine:
    """The engine's three calls, sampling with the transformers backend from the test's own prompts (a served
    prompt carries vLLM's inputs, not pixel values); ``fail_next_load`` breaks one reload."""

    sampler: HFRolloutEngine
    prompts: dict[str, object]  # record id -> the PromptInputs the trainer built
    device: str = "cpu"
    stats: dict[str, float] = field(default_factory=dict)
    loads: list[int] = field(default_factory=list)
    fail_next_load: bool = False

    def sample(self, prompts, params):
        return self.sampler.sample([self.prompts[p.record.id] for p in prompts], params)

    def sample_answers(self, tree, counts, params):
        own = replace(tree, prompts=[self.prompts[p.record.id] for p in tree.prompts])
        return self.sampler.sample_answers(own, counts, params)

    def load_weights(self, pairs):
        if self.fail_next_load:
            self.fail_next_load = False
            raise RuntimeError("size mismatch for lm_head.weight")
        self.loads.append(len(pairs))
        return len(pairs)


@dataclass
class RunningServer:
    url: str
    port: int
    service: RolloutService
    engine: StandInEngine

    def request(self, method: str, path: str, body: bytes = b"", headers: dict | None = None):
        """One raw request: (status, JSON reply or the body's first bytes)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request(method, path, body=body or None, headers=headers or {})
            response = connection.getresponse()
            data = response.read()
        finally:
            connection.close()
        try:
            return response.status, json.loads(data)
        except ValueError:
            return response.status, data[:40]


@contextmanager
def running(
    loaded, token: bytes | None = TOKEN, limits: ServerLimits | None = None, max_connections: int = 64
):
    """The real handler, service and server class on a loopback port; the engine loop on a thread."""
    model, prompts = loaded
    sampler = HFRolloutEngine.for_adapter(model.model, model.adapter)
    engine = StandInEngine(sampler, {p.record.id: p for p in prompts})
    description = {"model": "tiny", "device": "cpu", "dtype": "float32", "tempered_logprobs": False}
    description |= {
        "min_pixels": model.adapter.min_pixels,
        "max_pixels": model.adapter.max_pixels,
        "max_images": model.adapter.max_images,
        "max_video_frames": model.adapter.max_video_frames,
    }
    verifier = RequestVerifier(token) if token else None
    service = RolloutService(engine, description, limits or ServerLimits(), verifier)
    server = BoundedHTTPServer(("127.0.0.1", 0), handler_for(service), max_connections)
    stop = threading.Event()
    threads = [
        threading.Thread(target=server.serve_forever, daemon=True),
        threading.Thread(target=service.run_engine, args=(stop,), daemon=True),
    ]
    for thread in threads:
        thread.start()
    try:
        yield RunningServer(f"http://127.0.0.1:{server.server_port}", server.server_port, service, engine)
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


def client(
    loaded, server: RunningServer, token_file: str = "", timeout_s: float = 60.0
) -> ServerRolloutEngine:
    config = Config(
        rollout=RolloutConfig(
            backend="vllm_server", server=RolloutServerConfig([server.url], timeout_s, token_file=token_file)
        )
    )
    return ServerRolloutEngine.create(config, loaded[0].adapter)


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_bytes(TOKEN + b"\n")
    path.chmod(0o600)
    return str(path)


def _weights_body(version: int, session: str = "s") -> bytes:
    from vlm_grpoma.rollout.server.wire import weights_digest

    pairs = [("w", torch.zeros(2))]
    return dumps({"session": session, "version": version, "weights": pairs, "digest": weights_digest(pairs)})


# -- the signature ---------------------------------------------------------------------------------------------


def test_a_request_is_accepted_once_signed_with_the_token_fresh_and_unaltered():
    clock = [1000.0]
    verifier = RequestVerifier(TOKEN, clock=lambda: clock[0])
    body = b"payload"
    headers = signed_headers(TOKEN, "POST", "/weights", body, clock=lambda: clock[0])
    assert verifier.refusal("POST", "/weights", headers, body) is None
    assert "replayed" in verifier.refusal("POST", "/weights", headers, body)
    fresh = lambda: signed_headers(TOKEN, "POST", "/weights", body, clock=lambda: clock[0])  # noqa: E731
    assert "wrong signature" in verifier.refusal("POST", "/weights", fresh(), body + b"!")  # altered body
    assert "wrong signature" in verifier.refusal("POST", "/sample", fresh(), body)  # another endpoint
    stranger = signed_headers(b"x" * 32, "POST", "/weights", body, clock=lambda: clock[0])
    assert "wrong signature" in verifier.refusal("POST", "/weights", stranger, body)
    assert "needs requests signed" in verifier.refusal("POST", "/weights", {}, body)
    old = signed_headers(TOKEN, "POST", "/weights", body, clock=lambda: clock[0] - 301)
    assert "+301 s off this server's clock" in verifier.refusal("POST", "/weights", old, body)
    for bad_time in ("nan", "inf", "soon"):
        forged = {**fresh(), TIME_HEADER: bad_time}
        assert "malformed" in verifier.refusal("POST", "/weights", forged, body)
    assert "malformed" in verifier.refusal("POST", "/weights", {**fresh(), NONCE_HEADER: "n" * 65}, body)


def test_the_token_file_is_checked_in_one_line(tmp_path):
    path = tmp_path / "token"
    with pytest.raises(ConfigError, match=r"^rollout.server.token_file: .*token: no such file \(write one"):
        read_token(path)
    path.write_text("short\n")
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="holds 5 characters, fewer than 32"):
        read_token(path)
    path.write_bytes(TOKEN)
    path.chmod(0o644)
    with pytest.raises(ConfigError, match=r"can be read by other users \(mode 644\); chmod 600"):
        read_token(path)
    path.chmod(0o600)
    assert read_token(path) == TOKEN


def test_a_server_other_machines_can_reach_needs_a_token(token_file):
    config = Config()
    for host in ("127.0.0.1", "::1", "localhost"):
        assert is_loopback(host) and server_verifier(config, host, None) is None
    with pytest.raises(ConfigError, match=r"^--host 0\.0\.0\.0: other machines can reach this address"):
        server_verifier(config, "0.0.0.0", None)
    assert server_verifier(config, "0.0.0.0", token_file) is not None
    in_config = replace(
        config, rollout=replace(config.rollout, server=RolloutServerConfig(token_file=token_file))
    )
    assert server_verifier(in_config, "0.0.0.0", None) is not None


# -- the server with a token -----------------------------------------------------------------------------------


def test_a_stranger_can_neither_push_nor_sample_nor_learn_the_session(loaded, token_file):
    """Before: any caller could replace the weights, and /health handed out the session to sample with."""
    with running(loaded) as server:
        trainer = client(loaded, server, token_file)
        trainer.update_weights(loaded[0].model)
        assert server.engine.loads and server.service.held.session == trainer.session
        for path, body in (("/weights", _weights_body(2**62, trainer.session)), ("/sample", b"{}")):
            status, reply = server.request("POST", path, body)
            assert status == 401 and reply["error"].startswith("unauthenticated"), reply
        assert server.engine.loads == [server.engine.loads[0]] and server.service.held.version == 1
        status, public = server.request("GET", "/health")
        assert status == 200 and public == {"status": "ok", "auth": "required"}
        assert trainer.health()["session"] == trainer.session  # the signed caller sees everything
        assert trainer.sample(loaded[1], PARAMS).shape == (1, 2, 2) and trainer.sampled_version == 1


def test_a_captured_signed_request_cannot_be_replayed(loaded):
    with running(loaded) as server:
        body = _weights_body(1)
        headers = signed_headers(TOKEN, "POST", "/weights", body)
        assert server.request("POST", "/weights", body, headers)[0] == 200
        status, reply = server.request("POST", "/weights", body, headers)  # same version: would load again
        assert status == 401 and "replayed" in reply["error"] and len(server.engine.loads) == 1


def test_a_client_without_the_servers_token_is_one_line(loaded, token_file, tmp_path):
    with running(loaded) as server:
        with pytest.raises(RolloutServerError, match="set rollout.server.token_file to the file it was"):
            client(loaded, server)
        other = tmp_path / "other"
        other.write_bytes(b"y" * 40)
        other.chmod(0o600)
        with pytest.raises(RolloutServerError, match="this one is not it"):
            client(loaded, server, str(other))


# -- bounds on what one request may ask ------------------------------------------------------------------------


def test_bodies_beyond_their_limit_or_without_a_length_are_refused_before_reading(loaded):
    """Before: a Content-Length of 2^62 made the server try to read (and allocate) it."""
    limits = ServerLimits(weights_bytes=4096, request_bytes=1024)
    with running(loaded, token=None, limits=limits) as server:
        status, reply = server.request("POST", "/weights", b"", {"Content-Length": str(2**62)})
        assert status == 413 and "may hold 4096 bytes" in reply["error"]
        status, reply = server.request("POST", "/sample", b"x" * 2048)
        assert status == 413 and "may hold 1024 bytes" in reply["error"]
        for length in ("-5", "1e3", "0x10"):
            status, reply = server.request("POST", "/sample", b"", {"Content-Length": length})
            assert status == 411, (length, reply)
        assert server.request("POST", "/weights", _weights_body(1))[0] == 200  # within the limit


def test_a_wait_is_finite_and_bounded(loaded, token_file):
    with running(loaded, limits=ServerLimits(max_wait_s=60)) as server:
        trainer = client(loaded, server, token_file)
        trainer.update_weights(loaded[0].model)
        for wait in (math.nan, math.inf, -1.0, 61.0):
            body = dumps(
                {
                    "prompts": encode_prompts(loaded[1]),
                    "params": encode_params(PARAMS),
                    "session": trainer.session,
                    "version": 1,
                    "wait_s": wait,
                }
            )
            status, reply = server.request(
                "POST", "/sample", body, signed_headers(TOKEN, "POST", "/sample", body)
            )
            assert status == 400 and "wait_s must be in [0, 60] seconds" in reply["error"], (wait, reply)


def test_a_push_that_fails_to_load_leaves_nothing_served_until_a_good_one(loaded, token_file):
    """Before: the server kept serving the half-loaded weights under the last good version. A rank that does
    not push (``observer``) waits for version 2 and is told why none comes."""
    with running(loaded) as server:
        trainer = client(loaded, server, token_file, timeout_s=2.0)
        observer = replace(trainer, pusher=False)
        trainer.update_weights(loaded[0].model)
        server.engine.fail_next_load = True
        with pytest.raises(RolloutServerError, match=r"POST /weights refused \(500\)"):
            trainer.update_weights(loaded[0].model)
        observer.version = 2
        assert "the push of version 2 failed to load" in server.service.held.failed
        with pytest.raises(
            RolloutServerError, match="no usable weights: the push of version 2 failed to load"
        ):
            observer.sample(loaded[1], PARAMS)
        trainer.version -= 1  # push version 2 again: now it loads
        trainer.update_weights(loaded[0].model)
        assert not server.service.held.failed and observer.sample(loaded[1], PARAMS).shape == (1, 2, 2)


def test_the_client_refuses_samples_from_older_weights_and_repushes_another_runs(loaded, token_file):
    with running(loaded) as server:
        trainer = client(loaded, server, token_file)
        trainer.update_weights(loaded[0].model)
        trainer.update_weights(loaded[0].model)
        # another run (another session) pushes to the same server: ours is pushed again before we sample
        intruder = client(loaded, server, token_file)
        intruder.update_weights(loaded[0].model)
        assert server.service.held.session == intruder.session
        loads = len(server.engine.loads)
        assert trainer.sample(loaded[1], PARAMS).shape == (1, 2, 2)
        assert len(server.engine.loads) == loads + 1 and server.service.held.session == trainer.session
        stale = {"tree": None, "version": 1}
        with pytest.raises(
            RolloutServerError, match="sampled with weights version 1, this rank asked for version 2"
        ):
            trainer._served({**stale, "tree": _encoded_tree(trainer, loaded)}, loaded[1], "/sample", 2)


def _encoded_tree(trainer, loaded):
    from vlm_grpoma.rollout.server.wire import encode_tree

    return encode_tree(
        HFRolloutEngine.for_adapter(loaded[0].model, loaded[0].adapter).sample(loaded[1], PARAMS)
    )


def test_the_request_log_escapes_what_the_caller_wrote(loaded, capfd):
    """Before: a request line with terminal escapes reached the server's log as they were."""
    with running(loaded, token=None) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
            raw.sendall(b"GET /h\x1b[31mred HTTP/1.1\r\nHost: x\r\n\r\n")
            raw.recv(4096)
    err = capfd.readouterr().err
    assert "\x1b[31m" not in err and all(
        line.startswith("rollout server: ") for line in err.splitlines() if line.strip()
    )


# -- what one request may ask for -------------------------------------------------------------------------------


def _sample_body(loaded, params: dict | None = None, **fields) -> bytes:
    payload = {
        "prompts": encode_prompts(loaded[1]),
        "params": {**encode_params(PARAMS), **(params or {})},
        "session": "s",
        "version": 0,
        "wait_s": 0.0,
    }
    return dumps(payload | fields)


def test_sampling_requests_are_bounded_by_the_servers_own_limits(loaded):
    """Before: any K, M, token budget, prompt count or image size went to the engine as asked."""
    limits = ServerLimits(
        max_prompts=1, max_answers_per_prompt=8, context_tokens=4096, max_pixels=64 * 64, max_images=2
    )
    with running(loaded, token=None, limits=limits) as server:
        two = encode_prompts(loaded[1]) * 2
        cases = {
            "2 prompts; send 1 to 1": _sample_body(loaded, prompts=two),
            "0 prompts": _sample_body(loaded, prompts=[]),
            "16 answers per prompt; this server samples at most 8": _sample_body(loaded, {"num_thoughts": 8}),
            "exceed the engine's context of 4096": _sample_body(loaded, {"max_thought_tokens": 4090}),
            "params.num_thoughts must be int, got 2.0": _sample_body(loaded, {"num_thoughts": 2.0}),
            "params.ignore_stop must be bool, got 1": _sample_body(loaded, {"ignore_stop": 1}),
            "params.temperature must be float, got nan": _sample_body(loaded, {"temperature": math.nan}),
            "'version' is bool": _sample_body(loaded, version=True),
        }
        small = torch.zeros(8, 8, 3, dtype=torch.uint8)
        big = dict(encode_prompts(loaded[1])[0], images=[small, torch.zeros(100, 100, 3, dtype=torch.uint8)])
        cases["a 100x100 image; this server's model.max_pixels is 4096"] = _sample_body(loaded, prompts=[big])
        many = dict(encode_prompts(loaded[1])[0], images=[small] * 3)
        cases["prompts[0]: 3 images; this server's model.max_images is 2"] = _sample_body(
            loaded, prompts=[many]
        )
        for expected, body in cases.items():
            status, reply = server.request("POST", "/sample", body)
            assert status == 400 and expected in reply["error"], (expected, reply)
        assert server.engine.loads == []


def test_bodies_that_would_grow_when_read_are_refused(loaded):
    """A stride-0 view (one element claiming a billion) and a compressed archive entry (a zip bomb's way to
    grow) are refused before anything is allocated from them."""
    import io
    import zipfile

    from vlm_grpoma.rollout.server.wire import WireError, loads

    huge_view = torch.zeros(1).expand(10**9)
    with pytest.raises(WireError, match=r"a tensor of shape \(1000000000,\) that its data does not fill"):
        loads(dumps({"counts": huge_view}), "POST /sample_answers")
    honest = dumps({"x": torch.zeros(4)})
    with zipfile.ZipFile(io.BytesIO(honest)) as archive:
        entries = [(info, archive.read(info)) for info in archive.infolist()]
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for info, data in entries:
            archive.writestr(info.filename, data, compress_type=zipfile.ZIP_DEFLATED)
    with pytest.raises(WireError, match=r"not a rollout-server body \(a compressed entry\)"):
        loads(packed.getvalue(), "POST /weights")
    assert torch.equal(loads(honest, "t")["x"], torch.zeros(4))


def test_answer_counts_are_integers_within_the_cap(loaded):
    limits = ServerLimits(max_answers_per_prompt=8)
    for counts, message in (
        (torch.tensor([[1.0, 2.0]]), "counts must be an integer tensor"),
        (torch.tensor([[-1, 2]]), r"counts must lie in \[0, 8\]"),
        (torch.tensor([[9, 0]]), r"counts must lie in \[0, 8\]"),
    ):
        with pytest.raises(Exception, match=message):
            limits.check_counts(counts, "POST /sample_answers")
    assert limits.check_counts(torch.tensor([[3, 4], [8, 0]]), "t") == 8


def test_a_push_landing_between_the_wait_and_the_engine_job_is_caught(loaded):
    """The engine thread checks the held weights again: another run's push may land after a request's wait."""
    from vlm_grpoma.rollout.server.service import HeldWeights, NotReady

    with running(loaded, token=None) as server:
        service = server.service
        service.held = HeldWeights(session="mine", version=3)
        assert service._serving("mine", 2, "POST /sample") == 3
        service.held = HeldWeights(session="another run", version=9)
        with pytest.raises(NotReady, match="the weights changed while the request waited"):
            service._serving("mine", 2, "POST /sample")


def test_a_server_error_reply_is_generic_and_the_traceback_stays_in_its_log(loaded, token_file, capfd):
    with running(loaded) as server:
        trainer = client(loaded, server, token_file)
        server.engine.fail_next_load = True
        with pytest.raises(RolloutServerError) as raised:
            trainer.update_weights(loaded[0].model)
    message = str(raised.value)
    assert "internal error (RuntimeError) in POST /weights; see the server log" in message
    assert "size mismatch" not in message and "size mismatch" in capfd.readouterr().err


def test_a_thousand_hostile_requests_get_one_line_4xx_replies_and_leave_nothing_running(loaded):
    """Random methods, paths, headers and bodies (bounded, loopback): every reply is a 4xx with one line, no
    request thread outlives its reply, and the server's memory stays bounded."""
    import random

    rng = random.Random(0)
    valid = _sample_body(loaded)
    bodies = [
        b"",
        b"{}",
        valid[: len(valid) // 2],
        valid[::-1],
        bytes(rng.randrange(256) for _ in range(512)),
        dumps({"prompts": "x"}),
        dumps({"prompts": [{"input_ids": torch.zeros(3)}]}),
        dumps({"weights": [("w", "not a tensor")], "session": "s", "version": 1, "digest": "d"}),
    ]
    paths = ["/sample", "/sample_answers", "/weights", "/health", "/../etc", "/%00", "/" + "a" * 2000]

    def rss_mib() -> float:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    with running(loaded) as server:
        threads, memory = threading.active_count(), rss_mib()
        for _ in range(1000):
            method = rng.choice(["POST", "POST", "POST", "GET", "PUT", "DELETE"])
            body = rng.choice(bodies)
            headers = rng.choice([{}, {"Content-Length": str(rng.choice([0, len(body), 2**40]))}])
            if rng.random() < 0.3:  # signed, but for another endpoint or body
                headers |= signed_headers(TOKEN, method, rng.choice(paths), b"x")
            status, reply = server.request(method, rng.choice(paths), body, headers)
            if method == "GET" and status == 200:
                assert reply == {"status": "ok", "auth": "required"}
                continue
            assert 400 <= status < 500, (method, status, reply)
            assert isinstance(reply, dict) and "\n" not in reply["error"], reply
        for _ in range(50):  # request threads end with their connection
            if threading.active_count() <= threads:
                break
            threading.Event().wait(0.1)
        assert threading.active_count() <= threads
        assert rss_mib() - memory < 200
        assert server.engine.loads == [] and server.service.held.session is None


def _raw(port: int, data: bytes, timeout: float = 30) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw:
        raw.sendall(data)
        return raw.recv(4096)


def test_malformed_request_lines_get_json_lines_and_silent_callers_are_dropped(loaded, monkeypatch):
    """Before: a malformed request line crashed the handler's own logging (a traceback per request), and a
    caller that sent half a request held its thread forever."""
    from vlm_grpoma.rollout.server import service as server_module

    monkeypatch.setattr(server_module, "CONNECTION_TIMEOUT_S", 1.0)
    with running(loaded, token=None) as server:
        for line, message in (
            (b"GARBAGE", b"Bad request syntax"),
            (b"GET / HTTP/9.9", b"Invalid HTTP version"),
        ):
            assert message in _raw(server.port, line + b"\r\n\r\n")
        started = time.monotonic()
        assert _raw(server.port, b"\x16\x03\x01\x02\x00") == b""  # half a TLS hello, then silence
        assert time.monotonic() - started < 5


def test_connections_beyond_the_bound_are_refused_at_once(loaded):
    with running(loaded, token=None, max_connections=2) as server:
        held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(2)]
        try:
            time.sleep(0.2)
            reply = _raw(server.port, b"GET /health HTTP/1.1\r\n\r\n")
            assert reply.startswith(b"HTTP/1.1 503") and b"too many connections" in reply
        finally:
            for connection in held:
                connection.close()
        time.sleep(0.2)
        assert server.request("GET", "/health")[0] == 200
