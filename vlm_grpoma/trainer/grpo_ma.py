"""The GRPO-MA trainer: one training step, as in the data flow of ``docs/architecture.md``.

records → rollout tree (policy in eval mode, no grad) → rewards → advantages → μ policy epochs over
micro-batches of prompts (thought and answer segments) → optimizer step → metrics. Prompts are sharded across
ranks; rewards and advantages are computed per prompt group on the rank that owns it. An answer with a
non-finite reward gets advantage 0 and is left out of its group's statistics; such answers are counted
(``reward/non_finite``, summed over ranks) and warned about once per step. A non-finite loss or gradient
makes the engine skip the optimizer step on every rank (weights untouched), which is logged and reported.
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from vlm_grpoma.algorithm import (
    Segments,
    grpo_ma_advantages,
    grpo_ma_token_weights,
    policy_loss,
    thought_advantage_variance,
)
from vlm_grpoma.algorithm.advantages import thought_values
from vlm_grpoma.config import Config
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.errors import ConfigError
from vlm_grpoma.models.record_checks import screen_records
from vlm_grpoma.rewards.registry import build_rewards
from vlm_grpoma.rollout.backends import build_rollout_engine, logprob_mismatch
from vlm_grpoma.rollout.engine import SamplingParams
from vlm_grpoma.rollout.tree import RolloutTree
from vlm_grpoma.trainer.base import Trainer
from vlm_grpoma.trainer.evaluation import EvalSet, evaluate_sets, greedy_params, load_eval_sets
from vlm_grpoma.trainer.logging import reduce_metrics, sum_over_ranks
from vlm_grpoma.trainer.logprobs import PathLogProbs, path_log_probs
from vlm_grpoma.trainer.packed import shared_prefix_log_probs
from vlm_grpoma.trainer.samples import completion_samples
from vlm_grpoma.trainer.scoring import score_tree

log = logging.getLogger(__name__)


def sampling_seed(seed: int, step: int, rank: int) -> int:
    """The rollout seed of one step on one rank: a function of the step alone, so resumed runs resample alike."""
    return (seed * 1_000_003 + step * 7_919 + rank * 104_729) % (2**63 - 1)


@dataclass
class _UpdateStats:
    """Sums over the micro-batches of one step, turned into metrics at the end."""

    sums: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def add(self, **values: float) -> None:
        for key, value in values.items():
            self.sums[key] += float(value)


class GRPOMATrainer(Trainer):
    """GRPO-MA: K thoughts x M answers per prompt, rewards, advantages, the clipped objective."""

    def __init__(self, config: Config, *, model: torch.nn.Module | None = None) -> None:
        try:  # before any model is loaded: a misspelt reward fails in a second
            self.rewards = build_rewards(config.rewards.weights, config.rewards.options)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        self.eval_sets: list[EvalSet] = load_eval_sets(config)
        super().__init__(config, model=model)
        self.rollout = build_rollout_engine(config, self.engine, self.adapter, dist=self.dist)

    def check_more_data(self) -> None:
        """The held-out sets, like the training records, hold only records this model can take."""
        data = self.config.data
        self.eval_sets = [
            EvalSet(
                s.name,
                screen_records(
                    s.records,
                    self.adapter,
                    data.max_prompt_tokens,
                    source=f"data.eval_sets.{s.name}: {data.eval_sets[s.name]}",
                    skip_bad=data.skip_bad_records,
                ),
            )
            for s in self.eval_sets
        ]

    def evaluation(self, final: bool = False) -> dict[str, float]:
        """Held-out metrics when ``train.eval_every`` says so (before step 1, every N steps, after the last)."""
        every = self.config.train.eval_every
        if not every or (self.step % every and not final):
            return {}
        start = time.perf_counter()
        metrics = evaluate_sets(
            self.eval_sets,
            self.rollout,
            self.adapter,
            self.rewards,
            greedy_params(self.config),
            rank=self.dist.rank,
            world_size=self.dist.world_size,
            batch_size=self.config.train.eval_batch_prompts,
        )
        return metrics | {"time/eval_s": time.perf_counter() - start}

    def train(self) -> list[dict[str, float]]:
        try:
            return super().train()
        finally:
            self.rewards.close()

    # -- one step ---------------------------------------------------------------------------------------------

    def _rollout(self, records: Sequence[Record]) -> RolloutTree:
        prompts = self.adapter.build_inputs(records)
        params = SamplingParams.from_config(
            self.config.rollout, sampling_seed(self.config.seed, self.step, self.dist.rank)
        )
        return self.rollout.sample(prompts, params)

    def _log_probs(self, model, tree: RolloutTree, chunk: list[int]) -> PathLogProbs:
        """Thought and answer log-probs of a micro-batch through the configured pass (shared prefix or naive)."""
        compute = shared_prefix_log_probs if self.config.train.logprob_pass == "shared" else path_log_probs
        return compute(model, tree, chunk, self.adapter.tokens)

    def _update(self, tree: RolloutTree, rewards: torch.Tensor) -> tuple[dict[str, float], list[float]]:
        """μ policy epochs over the micro-batches (one optimizer step each); returns loss statistics and the
        epochs' gradient norms (GSS tracks the last epoch's, one score per training step)."""
        config, algo = self.config, self.config.algorithm
        thought_adv, answer_adv = grpo_ma_advantages(
            rewards, scale=algo.advantage_scale, eps=algo.advantage_eps
        )
        thought_w, answer_w = grpo_ma_token_weights(
            tree.thought_lengths,
            tree.answer_lengths,
            aggregation=algo.loss_aggregation,
            thought_loss_weight=algo.thought_loss_weight,
            max_completion_tokens=config.rollout.max_thought_tokens + config.rollout.max_answer_tokens,
        )
        b_count = rewards.shape[0]
        size = config.train.micro_batch_prompts
        chunks = [list(range(i, min(i + size, b_count))) for i in range(0, b_count, size)]
        old = ref = None
        if algo.policy_epochs > 1:
            with torch.no_grad():
                old = [self._log_probs(self.engine.deepspeed, tree, chunk) for chunk in chunks]
        if self.engine.has_reference:
            with self.engine.reference() as reference:
                ref = [self._log_probs(reference, tree, chunk) for chunk in chunks]
        stats, grad_norms, mismatch = _UpdateStats(), [], []
        for epoch in range(algo.policy_epochs):
            for index, chunk in enumerate(chunks):
                logp = self._log_probs(self.engine.deepspeed, tree, chunk)
                if epoch == 0:  # the policy that sampled the tree: its log-probs should match the rollout's
                    mismatch += [
                        (logp.thought, tree.thought_logprobs[chunk], tree.thought_mask[chunk]),
                        (logp.answer, tree.answer_logprobs[chunk], tree.answer_mask[chunk]),
                    ]
                device = logp.thought.device
                parts = []
                for kind, values, mask, adv, weights in (
                    ("thought", logp.thought, tree.thought_mask, thought_adv, thought_w),
                    ("answer", logp.answer, tree.answer_mask, answer_adv, answer_w),
                ):
                    dims = values.dim() - 1  # flatten [b, K(, M)] into segments
                    segments = Segments(
                        logp=values.flatten(0, dims - 1),
                        mask=mask[chunk].flatten(0, dims - 1).to(device),
                        advantages=adv[chunk].flatten().to(device),
                        token_weights=weights[chunk].flatten().to(device),
                        old_logp=None if old is None else getattr(old[index], kind).flatten(0, dims - 1),
                        ref_logp=None if ref is None else getattr(ref[index], kind).flatten(0, dims - 1),
                    )
                    parts.append(
                        policy_loss(
                            segments,
                            clip_eps_low=algo.clip_eps_low,
                            clip_eps_high=algo.clip_eps_high,
                            kl_beta=algo.kl_beta,
                            kl_estimator=algo.kl_estimator,
                        )
                    )
                self.engine.backward(parts[0].loss + parts[1].loss)
                tokens = parts[0].tokens + parts[1].tokens
                stats.add(
                    loss=sum(float(p.loss.detach()) for p in parts),
                    policy_loss=sum(float(p.policy_loss) for p in parts),
                    kl_tokens=sum(float(p.kl) * p.tokens for p in parts),
                    clipped_tokens=sum(float(p.clip_fraction) * p.tokens for p in parts),
                    clipped_low_tokens=sum(float(p.clip_low_fraction) * p.tokens for p in parts),
                    clipped_high_tokens=sum(float(p.clip_high_fraction) * p.tokens for p in parts),
                    tokens=tokens,
                )
            result = self.engine.step()
            self.rollout.update_weights(self.engine)
            grad_norms.append(result.grad_norm)
            stats.add(skipped=float(result.skipped), learning_rate=result.learning_rate)
        epochs = algo.policy_epochs
        s = stats.sums
        return (
            {
                "loss/total": s["loss"] / epochs,
                "loss/policy": s["policy_loss"] / epochs,
                "loss/kl": s["kl_tokens"] / max(s["tokens"], 1),
                "loss/clip_fraction": s["clipped_tokens"] / max(s["tokens"], 1),
                "loss/clip_low_fraction": s["clipped_low_tokens"] / max(s["tokens"], 1),
                "loss/clip_high_fraction": s["clipped_high_tokens"] / max(s["tokens"], 1),
                "train/skipped_steps": s["skipped"],
                "train/learning_rate": s["learning_rate"] / epochs,
                "adv/thought_abs_mean": float(thought_adv.abs().mean()),
                "adv/answer_abs_mean": float(answer_adv.abs().mean()),
                **logprob_mismatch(mismatch).metrics(),
            },
            grad_norms,
        )

    def train_step(self) -> dict[str, float]:
        """Run one training step on this rank's share of the prompts; returns the metrics (all ranks)."""
        start = time.perf_counter()
        records = self.next_records()
        tree = self._rollout(records)
        rolled = time.perf_counter()
        result, rewards, parsed = score_tree(tree, records, self.adapter, self.rewards)
        scored = time.perf_counter()
        samples = completion_samples(tree, records, result, parsed, self.config.logging.samples)
        self.logger.log_samples(self.step + 1, samples)
        update, grad_norms = self._update(tree, rewards)
        updated = time.perf_counter()

        finite = torch.isfinite(rewards)
        values = rewards[finite]
        per_thought = thought_values(rewards)
        has_value = torch.isfinite(per_thought)
        local = {
            "answers/parse_rate": float(parsed.float().mean()),
            "groups/zero_thought_variance": float(  # fewer than two distinct finite thought values
                (
                    per_thought.where(has_value, -math.inf).amax(-1)
                    <= per_thought.where(has_value, math.inf).amin(-1)
                )
                .float()
                .mean()
            ),
            "variance/thought_adv_estimate": float(thought_advantage_variance(rewards).nanmean()),
            "lengths/thought_mean": float(tree.thought_lengths.float().mean()),
            "lengths/answer_mean": float(tree.answer_lengths.float().mean()),
            "truncation/thought_rate": float(tree.thought_truncated.float().mean()),
            "truncation/answer_rate": float(tree.answer_truncated.float().mean()),
            "time/rollout_s": rolled - start,
            "time/reward_s": scored - rolled,
            "time/update_s": updated - scored,
            "tokens_per_s": float(tree.thought_mask.sum() + tree.answer_mask.sum())
            / max(rolled - start, 1e-9),
            **update,
        }
        for name, component in result.components.items():
            local[f"reward/{name}_mean"] = float(torch.tensor(component, dtype=torch.float64).nanmean())
        timeout = self.config.train.dist_timeout_s
        metrics = reduce_metrics(local, timeout_s=timeout)
        # Mean and std over every finite reward of every rank (ranks may hold different numbers of them).
        sums = reduce_metrics(
            {
                "n": float(values.numel()),
                "sum": float(values.sum()),
                "sq": float((values.double() ** 2).sum()),
                "non_finite": float((~finite).sum()),
            },
            "sum",
            timeout,
        )
        mean = sums["sum"] / sums["n"] if sums["n"] else math.nan
        metrics["reward/total_mean"] = mean
        metrics["reward/total_std"] = (
            math.sqrt(max(sums["sq"] / sums["n"] - mean**2, 0.0)) if sums["n"] else math.nan
        )
        metrics["reward/non_finite"] = sums["non_finite"]
        metrics.update(
            {f"failures/{k}": float(v) for k, v in sum_over_ranks(result.failures, timeout).items()}
        )
        metrics.update(self.gradient_metrics(grad_norms[-1]))
        if sums["non_finite"] and self.dist.is_main:
            log.warning(
                "step %d: %d answer(s) got a non-finite reward; they were left out of their groups' statistics "
                "with advantage 0 (reward/non_finite)",
                self.step,
                int(sums["non_finite"]),
            )
        metrics["time/step_s"] = time.perf_counter() - start
        return metrics


def main(args: argparse.Namespace) -> int:
    """``vlm-grpoma train`` handler (one process per rank under the deepspeed launcher)."""
    return GRPOMATrainer(args.config_obj).run_to_end("reward/total_mean")
