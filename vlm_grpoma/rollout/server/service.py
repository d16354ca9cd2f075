"""The rollout server: one vLLM engine behind a small HTTP API (``vlm-grpoma rollout-server``).

Endpoints: ``GET /health`` (JSON: the model, pixel bounds, log-prob mode, and the weights it holds: session,
version, digest), ``POST /sample`` and ``POST /sample_answers`` (the colocated engine's two calls, same two-phase
K x M requests, prefix caching on) and ``POST /weights`` (an in-place reload, caches dropped, version set:
the full weights, or a LoRA run's adapters merged onto the server's base checkpoint, :mod:`.lora_push`).
Bodies are :mod:`.wire`. Requests are answered on threads, but every engine call runs on the main thread, one at
a time (vLLM's in-process CPU engine hangs when ``generate`` runs on another thread than the one that built it);
``/health`` answers meanwhile.

Weights are versioned per training run (a *session*): a sample request names the session and the version it
needs and waits (bounded) until a push brings it, so a trainer rank never samples with weights older than the
step it is on, and a restarted server, holding the checkpoint's weights, serves no one until the run pushes
its current weights again. Each reply says the version it was sampled with.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import queue
import signal
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import torch

from vlm_grpoma.config import Config, load_config, validate
from vlm_grpoma.errors import ConfigError, UserError
from vlm_grpoma.rollout.server.auth import RequestVerifier, is_loopback, read_token
from vlm_grpoma.rollout.server.limits import ServerLimits
from vlm_grpoma.rollout.server.lora_push import BaseCheckpoint, LeanPush, decode_deltas, served_digest
from vlm_grpoma.rollout.server.readiness import process_ended
from vlm_grpoma.rollout.server.wire import (
    WireError,
    decode_params,
    decode_prompts,
    decode_tree,
    decode_weights,
    dumps,
    encode_tree,
    loads,
    required,
    weights_digest,
)

if TYPE_CHECKING:
    from vlm_grpoma.rollout.vllm import VLLMRolloutEngine

#: Seconds a connection may stay silent mid-request before the server drops it.
CONNECTION_TIMEOUT_S = 60.0
#: Connections served at once; the next is answered 503 (a trainer rank holds one at a time).
MAX_CONNECTIONS = 64
#: Launcher variables a server must not inherit: it is a lone process, not a rank of the training job.
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class NotReady(Exception):
    """The weights a request needs were not pushed within its wait."""


@dataclass
class HeldWeights:
    """The weights the engine holds: pushed by ``session`` at ``version`` (session None: the checkpoint's);
    ``failed``: the last push did not load, so what the engine holds is unknown and nothing is served."""

    session: str | None = None
    version: int = 0
    digest: str = ""
    tensors: int = 0
    failed: str = ""


class RolloutService:
    """The server's state: the engine (one call at a time) and the weights it holds."""

    def __init__(
        self,
        engine: VLLMRolloutEngine,
        description: dict[str, Any],
        limits: ServerLimits | None = None,
        verifier: RequestVerifier | None = None,
        base: BaseCheckpoint | None = None,
    ) -> None:
        self.engine = engine
        self.base = base  # the checkpoint the engine was started from: LoRA pushes merge onto it
        self.description = {**description, "base": base.fingerprint if base else ""}
        self.limits = limits or ServerLimits()
        self.verifier = verifier  # None: no token, any caller (a loopback-only server)
        self.boot_id = uuid.uuid4().hex  # tells a client that this server restarted since its last push
        self.held = HeldWeights()
        self._changed = threading.Condition()
        self._jobs: queue.Queue[tuple[Callable[[], Any], Future]] = queue.Queue()

    def _on_engine(self, job: Callable[[], Any]) -> Any:
        """``job()``'s result, run by :meth:`run_engine` (the main thread), after the jobs queued before it."""
        done: Future = Future()
        self._jobs.put((job, done))
        return done.result()

    def run_engine(self, stop: threading.Event) -> None:
        """Run the queued engine calls in order until ``stop`` is set (the main thread's loop)."""
        while not stop.is_set():
            try:
                job, done = self._jobs.get(timeout=0.2)
            except queue.Empty:
                continue
            if done.set_running_or_notify_cancel():
                try:
                    done.set_result(job())
                except BaseException as err:  # handed to the request's thread, which answers with it
                    done.set_exception(err)

    def health(self, _: Any = None) -> dict[str, Any]:
        with self._changed:
            held = dataclasses.asdict(self.held)
        return {**self.description, "boot_id": self.boot_id, **held}

    def public_health(self) -> dict[str, Any]:
        """What a caller without the token learns: the server is up and wants signed requests."""
        return {"status": "ok", "auth": "required"}

    def _holds(self, session: str, version: int) -> bool:
        return not self.held.failed and self.held.session == session and self.held.version >= version

    def _serving(self, session: str, version: int, what: str) -> int:
        """The held version, checked again on the engine thread: a push of another run (or one that failed)
        may have landed between the wait and this job."""
        if not self._holds(session, version):
            raise NotReady(f"{what}: the weights changed while the request waited; ask again")
        return self.held.version

    def _await(self, body: dict[str, Any], what: str) -> tuple[str, int]:
        """The (session, version) a request needs, once the server holds them (bounded wait)."""
        session = required(body, "session", str, what)
        version = required(body, "version", int, what)
        wait_s = float(required(body, "wait_s", (int, float), what))
        if not 0 <= wait_s <= self.limits.max_wait_s:  # NaN fails too
            raise WireError(
                f"{what}: wait_s must be in [0, {self.limits.max_wait_s:g}] seconds, got {wait_s!r}"
            )
        deadline = time.monotonic() + wait_s
        with self._changed:
            while not self._holds(session, version):
                left = deadline - time.monotonic()
                if left <= 0:
                    holds = (
                        f"no usable weights: {self.held.failed}"
                        if self.held.failed
                        else f"version {self.held.version} of session {self.held.session}"
                        if self.held.session
                        else "the checkpoint's weights (nothing pushed since it started)"
                    )
                    raise NotReady(
                        f"weights version {version} of session {session} were not pushed within {wait_s:g} s; "
                        f"the server holds {holds}"
                    )
                self._changed.wait(left)
        return session, version

    def sample(self, body: dict[str, Any]) -> dict[str, Any]:
        what = "POST /sample"
        prompts = decode_prompts(body.get("prompts"), what)
        params = decode_params(body.get("params"), what)
        self.limits.check_sampling(prompts, params, what)
        session, needed = self._await(body, what)

        def job() -> dict[str, Any]:  # pushes are engine jobs too: the version checked here is sampled with
            version = self._serving(session, needed, what)
            tree = self.engine.sample(prompts, params)
            return {"tree": encode_tree(tree), "version": version, "stats": dict(self.engine.stats)}

        return self._on_engine(job)

    def sample_answers(self, body: dict[str, Any]) -> dict[str, Any]:
        what = "POST /sample_answers"
        prompts = decode_prompts(body.get("prompts"), what)
        params = decode_params(body.get("params"), what)
        tree = decode_tree(body.get("tree"), prompts, what)
        counts = required(body, "counts", torch.Tensor, what)
        if tuple(counts.shape) != tree.shape[:2]:
            raise WireError(
                f"{what}: counts has shape {tuple(counts.shape)}, the tree [B, K] = {tree.shape[:2]}"
            )
        self.limits.check_sampling(prompts, params, what, answers=self.limits.check_counts(counts, what))
        session, needed = self._await(body, what)

        def job() -> dict[str, Any]:
            version = self._serving(session, needed, what)
            extra = self.engine.sample_answers(tree, counts, params)
            return {"tree": encode_tree(extra), "version": version, "stats": dict(self.engine.stats)}

        return self._on_engine(job)

    def load_weights(self, body: dict[str, Any]) -> dict[str, Any]:
        what = "POST /weights"
        session = required(body, "session", str, what)
        version = required(body, "version", int, what)
        pairs = decode_weights(body.get("weights"), what)
        if body.get("deltas") is None:
            digest = sent = weights_digest(pairs)
            weights: Iterable[tuple[str, torch.Tensor]] = pairs
        else:
            push = LeanPush(pairs, decode_deltas(body["deltas"], what))
            base = self._lean_base(required(body, "base", str, what), what)
            sent, digest = weights_digest(push.pairs()), served_digest(base.fingerprint, push)
            base.check(push, what)
            weights = base.merged(push)  # a generator: read from the base files as the engine loads
        if sent != required(body, "digest", str, what):
            raise WireError(f"{what}: the weights' digest differs from the sender's (damaged in transit)")

        def job() -> dict[str, Any]:
            if self.held.session == session and version < self.held.version:
                raise WireError(
                    f"{what}: version {version} is older than the held version {self.held.version}"
                )
            try:
                tensors = self.engine.load_weights(weights)
            except BaseException as err:  # the engine may hold some old and some new tensors: serve nothing
                with self._changed:
                    reason = " ".join(f"{type(err).__name__}: {err}".split())[:300]
                    self.held = HeldWeights(failed=f"the push of version {version} failed to load ({reason})")
                raise
            with self._changed:
                self.held = HeldWeights(session, version, digest, tensors)
                self._changed.notify_all()
            return {"version": version, "digest": digest, "tensors": tensors, "boot_id": self.boot_id}

        return self._on_engine(job)

    def _lean_base(self, fingerprint: str, what: str) -> BaseCheckpoint:
        """The base a LoRA push merges onto: this server's, if it is the trainer's."""
        if self.base is None:
            raise WireError(
                f"{what}: a LoRA-only push, but this server's model is not a safetensors checkpoint on disk"
            )
        if fingerprint != self.base.fingerprint:
            raise WireError(
                f"{what}: a LoRA-only push onto another base model (the files' fingerprints differ); start "
                "the server with the run's model.name_or_path"
            )
        return self.base


def _status(err: Exception) -> int:
    if isinstance(err, NotReady):
        return 409
    if isinstance(err, (WireError, UserError, ValueError)):
        return 400
    return 500


def handler_for(service: RolloutService) -> type[BaseHTTPRequestHandler]:
    """The HTTP handler of ``service``: a JSON error ``{"error": line}`` for every failed request."""
    routes: dict[tuple[str, str], Callable[[Any], dict[str, Any]]] = {
        ("GET", "/health"): service.health,
        ("POST", "/sample"): service.sample,
        ("POST", "/sample_answers"): service.sample_answers,
        ("POST", "/weights"): service.load_weights,
    }

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = CONNECTION_TIMEOUT_S  # a caller silent this long mid-request is dropped (no pinned thread)

        def _reply(self, code: int, body: bytes, kind: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _error(self, code: int, message: str) -> None:
            self._reply(code, json.dumps({"error": message}).encode(), "application/json")

        def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
            """The standard library's own refusals (a malformed request line, an unsupported method) as JSON
            lines too, not HTML pages; an unsupported method is 405."""
            self.close_connection = True
            if code == 501:
                code, message = 405, f"no endpoint {self.command} {getattr(self, 'path', '')}"
            self._error(code, message or f"bad request ({code})")

        def _body(self) -> bytes | None:
            """The request's body, read only within its endpoint's limit (None: refused, answered)."""
            length = self.headers.get("Content-Length")
            if self.command == "GET" and length is None:
                return b""
            if length is None or not length.isdigit() or not length.isascii():
                self._error(411, "a request needs a Content-Length header of digits")
                return None
            limit = service.limits.body_bytes(self.path)
            if int(length) > limit:
                self._error(
                    413, f"a {self.command} {self.path} body may hold {limit} bytes, this one {length}"
                )
                return None
            return self.rfile.read(int(length))

        def _route(self) -> None:
            self.close_connection = True  # one request per connection: no idle connection holds a thread
            route = routes.get((self.command, self.path))
            if route is None:
                self._error(404, f"no endpoint {self.command} {self.path}")
                return
            body = self._body()
            if body is None:
                return
            verifier = service.verifier
            refusal = verifier and verifier.refusal(self.command, self.path, self.headers, body)
            if refusal and route == service.health:
                self._reply(200, json.dumps(service.public_health()).encode(), "application/json")
                return
            if refusal:
                self._error(401, refusal)
                return
            try:
                if self.command == "GET":
                    self._reply(200, json.dumps(route(None)).encode(), "application/json")
                    return
                payload = loads(body, f"{self.command} {self.path}")
                del body  # the decoded tensors are what the engine needs: no second copy while it loads them
                reply = route(payload)
            except Exception as err:
                code = _status(err)
                if code == 500:  # a server-side bug or engine failure: the traceback stays in the server log
                    traceback.print_exc()
                    message = f"internal error ({type(err).__name__}) in {self.command} {self.path}; see the server log"
                else:
                    message = " ".join(str(err).split())
                self._error(code, message)
                return
            self._reply(200, dumps(reply), "application/octet-stream")

        do_GET = do_POST = _route

        def log_message(self, format: str, *args: Any) -> None:
            line = f"{self.client_address[0]} {format % args}"  # the request line is among the args
            sys.stderr.write(f"rollout server: {line.encode('unicode_escape').decode('ascii')}\n")

    return Handler


class BoundedHTTPServer(ThreadingHTTPServer):
    """A thread per connection, at most ``max_connections`` at once: the next is answered 503 and closed."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type, max_connections: int = MAX_CONNECTIONS):
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(max_connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            body = b'{"error": "too many connections; try again"}'
            try:
                request.sendall(
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def serve(service: RolloutService, host: str, port: int) -> None:
    """Answer requests until interrupted (Ctrl-C; SIGTERM's default ends the process): HTTP on a thread, the
    engine on this one."""
    server = BoundedHTTPServer((host, port), handler_for(service))
    threading.Thread(target=server.serve_forever, name="rollout-server-http", daemon=True).start()
    print(
        f"rollout server: {service.description['model']} on {service.description['device']}, "
        f"listening on http://{host}:{server.server_port}",
        flush=True,
    )
    stop = threading.Event()
    try:
        service.run_engine(stop)
    except KeyboardInterrupt:
        stop.set()
    finally:
        server.shutdown()
        server.server_close()


def stop_with(pid: int, interval_s: float = 1.0) -> None:
    """End this server (SIGTERM, the launcher's own way to stop it) once process ``pid`` has ended: a launcher
    killed with SIGKILL runs no clean-up, and its servers would otherwise serve nobody until killed by hand."""

    def watch() -> None:
        while not process_ended(pid):
            time.sleep(interval_s)
        print(f"rollout server: process {pid} (--stop-with) ended; stopping", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="rollout-server-stop-with", daemon=True).start()


def pushed_parameters(config: Config) -> int:
    """How many parameters a weight push carries: the model's (LoRA merged), counted on the meta device."""
    from vlm_grpoma.models.architecture import meta_model, model_config
    from vlm_grpoma.models.sources import adapter_chain

    hf_config, _ = model_config(adapter_chain(config.model.name_or_path).base)
    return sum(p.numel() for p in meta_model(hf_config).parameters())


def build_service(config: Config, verifier: RequestVerifier | None = None) -> RolloutService:
    """The vLLM engine of ``config`` (model, pixel bounds, ``rollout.vllm``) in this process, alone; its body
    limits from the model's parameter count."""
    from vlm_grpoma.models.registry import load_adapter
    from vlm_grpoma.rollout.backends import vllm_options
    from vlm_grpoma.rollout.vllm import VLLMRolloutEngine
    from vlm_grpoma.rollout.vllm.options import context_length

    options = vllm_options(config, config.model.dtype)
    if options.tensor_parallel_size != 1:
        raise ConfigError(
            "rollout.vllm.tensor_parallel_size: a rollout server runs one engine on one device; start one server "
            "per device and list them all in rollout.server.urls"
        )
    for name in LAUNCHER_VARIABLES:
        os.environ.pop(name, None)
    adapter = load_adapter(config.model)
    engine = VLLMRolloutEngine.create(
        config.model.name_or_path,
        adapter,
        options,
        seed=config.seed,
        trust_remote_code=config.model.trust_remote_code,
    )
    description = {
        "model": config.model.name_or_path,
        "device": engine.device,
        "dtype": options.dtype,
        "min_pixels": adapter.min_pixels,
        "max_pixels": adapter.max_pixels,
        "max_images": adapter.max_images,
        "max_video_frames": adapter.max_video_frames,
        "tempered_logprobs": options.tempered_logprobs,
    }
    context = options.max_model_len or context_length(
        config.model.name_or_path, config.model.trust_remote_code
    )
    limits = ServerLimits.for_model(
        pushed_parameters(config), context, adapter.max_pixels, adapter.max_images, adapter.max_video_frames
    )
    # LoRA runs push adapters onto the base files; hashing them (about a second per GB) only for those
    base = BaseCheckpoint.of_model(config.model.name_or_path) if config.model.lora.enabled else None
    return RolloutService(engine, description, limits, verifier, base)


def server_verifier(config: Config, host: str, token_file: str | None) -> RequestVerifier | None:
    """The verifier of the server's token (``--token-file``, else ``rollout.server.token_file``); without one,
    a ``host`` other machines can reach is refused in one line."""
    path = token_file or config.rollout.server.token_file
    if path:
        return RequestVerifier(
            read_token(path, "--token-file" if token_file else "rollout.server.token_file")
        )
    if not is_loopback(host):
        raise ConfigError(
            f"--host {host}: other machines can reach this address, and without a token anyone who does can "
            "replace the model or stall the run; give --token-file (and the trainer the same "
            "rollout.server.token_file), or listen on 127.0.0.1"
        )
    return None


def main(args: argparse.Namespace) -> int:
    """``vlm-grpoma rollout-server``: build the engine from the run's config, then serve."""
    config = getattr(args, "config_obj", None) or load_config(None, args.overrides)
    if args.model:
        config = replace(config, model=replace(config.model, name_or_path=args.model))
    validate(config)
    verifier = server_verifier(config, args.host, getattr(args, "token_file", None))
    if getattr(args, "stop_with", None):
        stop_with(args.stop_with)
    serve(build_service(config, verifier), args.host, args.port)
    return 0
