"""Config checks: every field's own rule, then the rules between fields (``validate``)."""

from __future__ import annotations

import dataclasses
from typing import Any
from urllib.parse import urlsplit

from vlm_grpoma.config.rules import _RULE
from vlm_grpoma.config.sections import Config
from vlm_grpoma.errors import ConfigError
from vlm_grpoma.sampling import SamplingParams, SamplingParamsError

#: K x M answers per prompt at most: 64 x 64 is beyond any published GRPO(-MA) setting; K = M = 1000 asked
#: the rollout for a 23 GB allocation before anything said why
MAX_ANSWERS_PER_PROMPT = 4096


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


def check_fields(section: Any, prefix: str = "") -> None:
    """Apply each field's own rule (its ``Range`` or ``NonEmpty`` metadata), sections recursively."""
    for f in dataclasses.fields(section):
        value, key = getattr(section, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            check_fields(value, f"{key}.")
        elif (rule := f.metadata.get(_RULE)) is not None and not rule.allows(value):
            raise ConfigError(f"{key}: {rule.complaint(value)}")


def validate(config: Config, world_size: int | None = None) -> None:
    """Each field's own rule, then the rules between fields; ``world_size`` adds the per-rank batch split."""
    check_fields(config)
    r, t = config.rollout, config.train
    _require(
        r.num_thoughts >= 2,
        "rollout.num_thoughts",
        f"must be >= 2 (advantages compare the K thoughts of a prompt), got {r.num_thoughts}",
    )
    try:  # the sampling checks are the sampling parameters' own: build them
        SamplingParams.from_config(r, config.seed)
    except SamplingParamsError as err:
        raise ConfigError(f"rollout.{err.field}: {err.reason}") from None
    _require(
        r.num_thoughts * r.answers_per_thought <= MAX_ANSWERS_PER_PROMPT,
        "rollout.num_thoughts",
        f"x rollout.answers_per_thought = {r.num_thoughts} x {r.answers_per_thought} = "
        f"{r.num_thoughts * r.answers_per_thought} answers per prompt; at most {MAX_ANSWERS_PER_PROMPT}",
    )
    _check_adaptive_answers(r)
    _check_servers(r)
    _check_async_rollout(config)
    for name in config.rewards.options:
        _require(
            name in config.rewards.weights,
            f"rewards.options.{name}",
            f"options for a reward that is not in rewards.weights ({', '.join(config.rewards.weights)})",
        )
    noise = config.rewards.noise
    _require(
        not noise.flip or noise.reward in config.rewards.weights,
        "rewards.noise.reward",
        f"{noise.reward!r} is not in rewards.weights ({', '.join(config.rewards.weights)}): nothing to flip",
    )
    _require(
        t.logprob_pass == "naive" or config.model.attn_implementation in ("sdpa", "eager", "flex_attention"),
        "train.logprob_pass",
        f"'shared' needs model.attn_implementation sdpa, eager (a 4-D attention mask) or flex_attention "
        f"(a block mask), got {config.model.attn_implementation!r}; use train.logprob_pass=naive",
    )
    _require(
        t.eval_every == 0 or bool(config.data.eval_sets),
        "data.eval_sets",
        f"is empty but train.eval_every={t.eval_every}; name the held-out records, e.g. {{test: test.jsonl}}",
    )
    _require(
        config.model.min_pixels <= config.model.max_pixels,
        "model.min_pixels",
        f"({config.model.min_pixels}) must not exceed model.max_pixels ({config.model.max_pixels})",
    )
    world = world_size or 1
    _require(
        t.prompts_per_step % world == 0,
        "train.prompts_per_step",
        f"{t.prompts_per_step} prompts per step do not divide across {world} ranks",
    )
    per_rank = t.prompts_per_step // world
    _require(
        per_rank % t.micro_batch_prompts == 0,
        "train.micro_batch_prompts",
        f"{t.micro_batch_prompts} does not divide the {per_rank} prompts each of {world} rank(s) gets per step "
        f"(train.prompts_per_step={t.prompts_per_step})",
    )


def _check_adaptive_answers(r: Any) -> None:
    """``rollout.adaptive_answers``: a budget the K thoughts can split within the per-thought bounds."""
    a, k = r.adaptive_answers, r.num_thoughts
    key = "rollout.adaptive_answers"
    if not a.enabled:
        return
    low = max(a.first, a.min_per_thought)
    _require(
        a.max_per_thought >= low,
        f"{key}.max_per_thought",
        f"({a.max_per_thought}) must be >= first ({a.first}) and >= min_per_thought ({a.min_per_thought})",
    )
    _require(
        k * low <= a.budget <= k * a.max_per_thought,
        f"{key}.budget",
        f"{a.budget} answers cannot be split over rollout.num_thoughts = {k} thoughts with {low}.."
        f"{a.max_per_thought} each (first, min_per_thought, max_per_thought)",
    )
    # the rule of algorithm/allocation.extra_answer_bounds, in the config's words: unbiased values need an
    # extra answer for every thought, or for none
    _require(
        a.budget == k * a.first or (a.budget >= k * (a.first + 1) and a.max_per_thought > a.first),
        f"{key}.budget",
        f"{a.budget} leaves some of the {k} thoughts without an answer beyond their first {a.first}: use "
        f"{k * a.first} (no extra answers) or >= {k * (a.first + 1)} with max_per_thought > first (the "
        "thought values stay unbiased only when every thought gets extra answers, or none does)",
    )
    _require(
        k * a.max_per_thought <= MAX_ANSWERS_PER_PROMPT,
        f"{key}.max_per_thought",
        f"x rollout.num_thoughts = {k * a.max_per_thought} answer slots per prompt; at most "
        f"{MAX_ANSWERS_PER_PROMPT}",
    )
    _require(
        r.temperature > 0,
        f"{key}.enabled",
        "needs sampled answers (rollout.temperature > 0): greedy answers of a thought are all the same",
    )


def _check_async_rollout(config: Config) -> None:
    """``train.async_rollout``: a rollout server to overlap with, one rollout per step, stale tokens corrected."""
    if not config.train.async_rollout.enabled:
        return
    key, r = "train.async_rollout.enabled", config.rollout
    _require(
        r.backend == "vllm_server",
        key,
        f"needs rollout.backend=vllm_server (the rollout runs on a server while this process trains), got "
        f"{r.backend!r}",
    )
    _require(
        not r.adaptive_answers.enabled,
        key,
        "cannot prefetch with rollout.adaptive_answers.enabled: its second rollout depends on the first's "
        "rewards; turn one of them off",
    )
    _require(
        config.algorithm.rollout_correction.resolved_mode(r.backend) != "none",
        key,
        "needs algorithm.rollout_correction.mode tis, mis, mis_two_sided or auto: it is what corrects the stale rollout",
    )


def _check_servers(r: Any) -> None:
    """``rollout.server.urls``: with ``rollout.backend=vllm_server``, one or more ``http://host:port`` addresses."""
    if r.backend != "vllm_server":
        return
    _require(
        bool(r.server.urls),
        "rollout.server.urls",
        "is empty but rollout.backend=vllm_server; start `vlm-grpoma rollout-server` and name it, "
        "e.g. [http://127.0.0.1:8400]",
    )
    for i, url in enumerate(r.server.urls):
        parts = urlsplit(url) if isinstance(url, str) else None
        _require(
            parts is not None and parts.scheme == "http" and bool(parts.hostname) and _has_port(parts),
            f"rollout.server.urls[{i}]",
            f"{url!r} is not an http://host:port address",
        )


def _has_port(parts: Any) -> bool:
    try:
        return parts.port is not None
    except ValueError:  # a port that is not a number, or out of range
        return False


def gradient_accumulation_steps(config: Config, world_size: int) -> int:
    """Micro-batches per optimizer step on each rank (validated to divide exactly)."""
    validate(config, world_size)
    return config.train.prompts_per_step // world_size // config.train.micro_batch_prompts
