"""The ``vllm_server`` backend: trainer ranks sample from rollout servers and push their weights to them.

Rank ``r`` samples from ``rollout.server.urls[r % n]``; the lowest rank of each server (ranks ``0..n-1``) pushes
the weights after every optimizer step (ZeRO-3 gathered on all ranks, the same names as the colocated engine's
sync) and checks the server's digest of what it loaded against its own. A LoRA run whose server holds the same
base checkpoint pushes only what training changes (:mod:`.lora_push`); any other run pushes its full weights in
the training dtype, LoRA merged. Every rank then
asks for the version it is on, so a rank never samples before its server holds the step's weights. The pushing
rank keeps its last push and repeats it when the server's boot id changes (a server restarted mid-run).
Every failure is one :class:`~vlm_grpoma.errors.RolloutServerError` line naming the URL, within
``rollout.server.timeout_s``.
"""

from __future__ import annotations

import http.client
import json
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from vlm_grpoma.errors import ConfigError, RolloutServerError
from vlm_grpoma.models.base import PromptInputs
from vlm_grpoma.rollout.base import full_module
from vlm_grpoma.rollout.server.auth import read_token, signed_headers
from vlm_grpoma.rollout.server.lora_push import BaseCheckpoint, lean_push, served_digest
from vlm_grpoma.rollout.server.wire import (
    WireError,
    decode_tree,
    dumps,
    encode_params,
    encode_prompts,
    encode_tree,
    encode_weights,
    loads,
    weights_digest,
)
from vlm_grpoma.rollout.tree import RolloutTree
from vlm_grpoma.rollout.vllm.weights import merged_weights
from vlm_grpoma.sampling import SamplingParams

if TYPE_CHECKING:
    from vlm_grpoma.config import Config
    from vlm_grpoma.distributed import DistInfo
    from vlm_grpoma.models.qwen import QwenVLAdapter
    from vlm_grpoma.rollout.base import Policy

#: Direct connections only: a machine-wide http_proxy must not route trainer-server traffic.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class ServedRollout:
    """A server's reply to one rollout request: the tree, the weight version it was sampled with, the engine's
    counters."""

    tree: RolloutTree
    version: int
    stats: dict[str, float]


@dataclass(frozen=True)
class PushRecord:
    """One weight push as sent: body bytes, seconds until the server confirmed it, LoRA-only or full."""

    nbytes: int
    seconds: float
    lean: bool


def shared_session(world_size: int) -> str:
    """One id for this training run, the same on every rank (rank 0's, broadcast)."""
    session = [uuid.uuid4().hex]
    if world_size > 1 and torch.distributed.is_initialized():
        torch.distributed.broadcast_object_list(session, src=0)
    return session[0]


@dataclass
class ServerRolloutEngine:
    """A rollout backend that sends prompts to one rollout server and pushes weights to it (see the module)."""

    url: str
    adapter: QwenVLAdapter = field(repr=False)
    timeout_s: float
    pusher: bool  # the lowest rank on this server: it pushes the weights
    session: str
    tempered_logprobs: bool = False
    version: int = 0  # weight pushes so far in this run: the version this rank samples with
    device: str = "cpu"  # the server's platform (from /health)
    sampled_version: int = 0  # the version the last reply was sampled with
    stats: dict[str, float] = field(
        default_factory=dict
    )  # the last rollout's, as the server's engine counted
    token: bytes | None = field(
        default=None, repr=False
    )  # rollout.server.token_file's secret: requests signed
    _pushed: tuple[bytes, str] | None = field(default=None, repr=False)  # the last push (body, digest)
    _pushed_to: str | None = None  # the boot id of the server that holds it
    base: BaseCheckpoint | None = field(default=None, repr=False)  # set: LoRA-only pushes onto this base
    last_push: PushRecord | None = None

    @classmethod
    def create(
        cls, config: Config, adapter: QwenVLAdapter, dist: DistInfo | None = None
    ) -> ServerRolloutEngine:
        """The engine of this rank (``dist``: its place in the job; None: a lone process), checked against
        its server's ``/health`` before anything is sent."""
        urls = config.rollout.server.urls
        rank, world = (dist.rank, dist.world_size) if dist is not None else (0, 1)
        tempered = config.algorithm.logprob_temperature == "sampling" and config.rollout.temperature not in (
            0.0,
            1.0,
        )
        engine = cls(
            url=urls[rank % len(urls)].rstrip("/"),
            adapter=adapter,
            timeout_s=config.rollout.server.timeout_s,
            pusher=rank < len(urls),
            session=shared_session(world),
            tempered_logprobs=tempered,
            token=read_token(config.rollout.server.token_file) if config.rollout.server.token_file else None,
        )
        engine.check_server()
        if config.model.lora.enabled and engine.pusher:
            engine.base = engine._shared_base(config.model.name_or_path)
        return engine

    def _shared_base(self, name_or_path: str) -> BaseCheckpoint | None:
        """The base checkpoint this rank and its server both hold (LoRA-only pushes), or None (full pushes):
        the trainer's model is not a checkpoint on disk, or the server's files differ (a notice says so)."""
        base = BaseCheckpoint.of_model(name_or_path)
        theirs = str(self.health().get("base") or "")
        if base is None or base.fingerprint == theirs:
            return base
        print(
            f"rollout server {self.url}: it was not started with model.lora.enabled (the run's config), or its "
            f"base model files differ from the trainer's {name_or_path}; pushing the full weights every step "
            "instead of the LoRA adapters",
            file=sys.stderr,
        )
        return None

    # -- transport ----------------------------------------------------------------------------------------

    def _send(self, method: str, path: str, body: bytes | None = None) -> bytes:
        headers = {} if self.token is None else signed_headers(self.token, method, path, body or b"")
        request = urllib.request.Request(self.url + path, data=body, method=method, headers=headers)
        where = f"rollout server {self.url}"
        try:
            with _OPENER.open(request, timeout=self.timeout_s) as response:
                return response.read()
        except urllib.error.HTTPError as err:
            try:
                message = json.loads(err.read())["error"]
            except (ValueError, KeyError, TypeError, OSError):
                message = err.reason
            raise RolloutServerError(f"{where}: {method} {path} refused ({err.code}): {message}") from None
        except TimeoutError:
            raise RolloutServerError(
                f"{where}: no reply to {method} {path} within rollout.server.timeout_s={self.timeout_s:g} s"
            ) from None
        except urllib.error.URLError as err:
            if isinstance(err.reason, TimeoutError):
                raise RolloutServerError(
                    f"{where}: no connection within rollout.server.timeout_s={self.timeout_s:g} s"
                ) from None
            raise RolloutServerError(
                f"{where}: unreachable ({err.reason}); is `vlm-grpoma rollout-server` running there? "
                "(rollout.server.urls)"
            ) from None
        except (ConnectionError, http.client.HTTPException) as err:
            raise RolloutServerError(
                f"{where}: the connection broke during {method} {path} ({type(err).__name__}); did the server stop?"
            ) from None

    def _call(self, path: str, payload: dict[str, Any] | bytes) -> dict[str, Any]:
        reply = self._send("POST", path, payload if isinstance(payload, bytes) else dumps(payload))
        try:
            return loads(reply, f"reply to POST {path}")
        except WireError as err:
            raise RolloutServerError(f"rollout server {self.url}: {err}") from None

    def health(self) -> dict[str, Any]:
        """The server's ``/health``: model, device, pixel bounds, log-prob mode, held weights, boot id."""
        try:
            return json.loads(self._send("GET", "/health"))
        except ValueError:
            raise RolloutServerError(
                f"rollout server {self.url}: /health is not JSON (is this a rollout server?)"
            ) from None

    def check_server(self) -> None:
        """Refuse a server whose images or log-probs would differ from the trainer's: one line, the key."""
        health = self.health()
        if health.get("auth") == "required":
            raise RolloutServerError(
                f"rollout server {self.url}: it serves only requests signed with its token"
                + (
                    ", and this one is not it (rollout.server.token_file: a different secret)"
                    if self.token
                    else "; set rollout.server.token_file to the file it was started with"
                )
            )
        self.device = str(health.get("device", "cpu"))
        ours = {
            "model.min_pixels": self.adapter.min_pixels,
            "model.max_pixels": self.adapter.max_pixels,
            "model.max_images": self.adapter.max_images,
            "model.max_video_frames": self.adapter.max_video_frames,
            "algorithm.logprob_temperature (tempered log-probs)": self.tempered_logprobs,
        }
        theirs = {
            "model.min_pixels": health.get("min_pixels"),
            "model.max_pixels": health.get("max_pixels"),
            "model.max_images": health.get("max_images"),
            "model.max_video_frames": health.get("max_video_frames"),
            "algorithm.logprob_temperature (tempered log-probs)": health.get("tempered_logprobs"),
        }
        for key, value in ours.items():
            if theirs[key] != value:
                raise ConfigError(
                    f"{key}: the trainer's {value} differs from rollout server {self.url}'s {theirs[key]}; "
                    "start the server with the run's config (vlm-grpoma rollout-server --config RUN.yaml)"
                )

    # -- weights ------------------------------------------------------------------------------------------

    def update_weights(self, model: Policy) -> int:
        """Push ``model``'s weights (on every rank: ZeRO-3 gathers collectively; the pusher sends) and move this
        rank to the next version. Returns how many tensors this rank pushed (0 on the others)."""
        lean = pairs = None
        with full_module(model) as module:
            if self.pusher:
                lean = lean_push(module) if self.base is not None else None
                pairs = encode_weights(merged_weights(module)) if lean is None else lean.pairs()
        self.version += 1
        if pairs is None:
            return 0
        started = time.perf_counter()
        needs = {"session": self.session, "version": self.version}
        if lean is not None and self.base is not None:
            digest = served_digest(self.base.fingerprint, lean)
            body = dumps(
                needs
                | {"weights": lean.weights, "deltas": lean.deltas, "base": self.base.fingerprint}
                | {"digest": weights_digest(pairs)}
            )
        else:
            digest = weights_digest(pairs)
            body = dumps(needs | {"weights": pairs, "digest": digest})
        self._push(body, digest)
        self.last_push = PushRecord(len(body), time.perf_counter() - started, lean is not None)
        return len(pairs)

    def _push(self, body: bytes, digest: str) -> None:
        reply = self._call("/weights", body)
        if reply.get("digest") != digest:
            raise RolloutServerError(
                f"rollout server {self.url}: it loaded weights with digest {reply.get('digest')}, the trainer "
                f"sent {digest}"
            )
        self._pushed, self._pushed_to = (body, digest), str(reply.get("boot_id"))

    def _ensure_pushed(self) -> None:
        """Repeat the last push to a server that does not hold it: restarted since (it holds the checkpoint's
        weights), or holding another session, version or digest (another run's push, or a failed reload)."""
        if not self.pusher or self._pushed is None:
            return
        health = self.health()
        holds = (health.get("boot_id"), health.get("session"), health.get("version"), health.get("digest"))
        if holds != (self._pushed_to, self.session, self.version, self._pushed[1]):
            self._push(*self._pushed)

    # -- sampling -----------------------------------------------------------------------------------------

    def _needs(self) -> dict[str, Any]:
        """The weights a request must be sampled with, and how long the server may wait for their push."""
        return {"session": self.session, "version": self.version, "wait_s": self.timeout_s / 2}

    def _served(
        self, reply: dict[str, Any], prompts: Sequence[PromptInputs], path: str, needed: int
    ) -> ServedRollout:
        """The reply's tree, refused unless sampled with version ``needed`` or a newer push of this run."""
        try:
            tree = decode_tree(reply.get("tree"), prompts, f"reply to POST {path}")
        except WireError as err:
            raise RolloutServerError(f"rollout server {self.url}: {err}") from None
        version = reply.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or not needed <= version <= self.version:
            raise RolloutServerError(
                f"rollout server {self.url}: POST {path} was sampled with weights version {version!r}, this rank "
                f"asked for version {needed} (it has pushed {self.version})"
            )
        stats = {str(k): float(v) for k, v in dict(reply.get("stats") or {}).items()}
        return ServedRollout(tree, version, stats)

    def _received(self, served: ServedRollout) -> RolloutTree:
        self.sampled_version, self.stats = served.version, served.stats
        return served.tree

    def request_sample(
        self, prompts: Sequence[PromptInputs], params: SamplingParams
    ) -> Callable[[], ServedRollout]:
        """Bring the server up to date and freeze a ``/sample`` request at this rank's version; the call returned
        only talks HTTP and changes nothing here, so another thread may make it (``train.async_rollout``)."""
        self._ensure_pushed()
        body = dumps({"prompts": encode_prompts(prompts), "params": encode_params(params), **self._needs()})
        needed = self.version
        return lambda: self._served(self._call("/sample", body), prompts, "/sample", needed)

    def sample(self, prompts: Sequence[PromptInputs], params: SamplingParams) -> RolloutTree:
        return self._received(self.request_sample(prompts, params)())

    def sample_answers(self, tree: RolloutTree, counts: torch.Tensor, params: SamplingParams) -> RolloutTree:
        self._ensure_pushed()
        payload = {
            "prompts": encode_prompts(tree.prompts),
            "tree": encode_tree(tree),
            "counts": counts.to(torch.long),
            "params": encode_params(params),
            **self._needs(),
        }
        reply = self._call("/sample_answers", payload)
        return self._received(self._served(reply, tree.prompts, "/sample_answers", self.version))
