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
import time
from collections.abc import Sequence

import torch

from vlm_grpoma.algorithm import LossStats, grpo_ma_advantages, grpo_ma_token_weights, policy_loss
from vlm_grpoma.algorithm.allocation import TwoPhaseValues
from vlm_grpoma.algorithm.diagnostics import logprob_mismatch
from vlm_grpoma.config import Config
from vlm_grpoma.datasets.jsonl import first_record_task
from vlm_grpoma.datasets.schema import Record
from vlm_grpoma.errors import ConfigError
from vlm_grpoma.models.attention import FLEX_ATTENTION
from vlm_grpoma.rewards.base import Reward
from vlm_grpoma.rewards.noise import NoisyRewards
from vlm_grpoma.rewards.registry import build_rewards, check_rewards_fit_task
from vlm_grpoma.rollout.backends import build_rollout_engine
from vlm_grpoma.rollout.tree import RolloutTree
from vlm_grpoma.sampling import SamplingParams
from vlm_grpoma.trainer.adaptive_answers import allocation_metrics, two_phase_rollout
from vlm_grpoma.trainer.async_rollout import SYNCHRONOUS, RolloutPrefetch
from vlm_grpoma.trainer.base import Trainer
from vlm_grpoma.trainer.dynamic_sampling import ScoredBatch, refill
from vlm_grpoma.trainer.evaluation import evaluate_sets, load_eval_sets
from vlm_grpoma.trainer.logging import reduce_metrics
from vlm_grpoma.trainer.logprobs import PathLogProbs, ScoringOptions, path_log_probs
from vlm_grpoma.trainer.micro_batches import micro_batches, row_tokens
from vlm_grpoma.trainer.packed import shared_prefix_log_probs
from vlm_grpoma.trainer.samples import completion_samples
from vlm_grpoma.trainer.scoring import score_tree
from vlm_grpoma.trainer.segments import SegmentStats, SegmentTargets, micro_batch_segments
from vlm_grpoma.trainer.step_metrics import PhaseTimer, global_reward_metrics, reward_metrics, rollout_metrics


def sampling_seed(seed: int, step: int, rank: int, refill_round: int = 0) -> int:
    """The rollout seed of one step (and dynamic-sampling round) on one rank: a function of the step alone, so
    resumed runs resample alike."""
    return (seed * 1_000_003 + step * 7_919 + rank * 104_729 + refill_round * 15_485_863) % (2**63 - 1)


def refuse_flex_training_on_cpu(config: Config) -> None:
    """The shared-prefix pass trains through FlexAttention's backward, which torch has only on CUDA: refused at
    start-up in one line, not as a traceback from inside the first step (forward-only uses stay allowed)."""
    uses_flex = config.model.attn_implementation == FLEX_ATTENTION and config.train.logprob_pass == "shared"
    if uses_flex and not torch.cuda.is_available():
        raise ConfigError(
            f"model.attn_implementation: {FLEX_ATTENTION} cannot train on CPU (torch {torch.__version__} has no "
            "FlexAttention backward there); train with sdpa (eval and rollouts may keep flex_attention)"
        )


class GRPOMATrainer(Trainer):
    """GRPO-MA: K thoughts x M answers per prompt, rewards, advantages, the clipped objective."""

    command = "train"

    def __init__(self, config: Config, *, model: torch.nn.Module | None = None) -> None:
        refuse_flex_training_on_cpu(config)
        try:  # before any model is loaded: a misspelt reward fails in a second
            records_task = first_record_task(config.data.train_path) if config.data.train_path else None
            check_rewards_fit_task(config.rewards.weights, config.data.task, records_task)
            rewards = build_rewards(config.rewards.weights, config.rewards.options)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        super().__init__(config, model=model, held_out=load_eval_sets(config))
        self.rewards = rewards
        noise = config.rewards.noise  # an experimental control: rollouts only, held-out scores stay clean
        self.training_rewards: Reward = (
            NoisyRewards(rewards, noise.reward, noise.flip, f"{config.seed}/{self.dist.rank}")
            if noise.flip
            else rewards
        )
        self.rollout = build_rollout_engine(config, self.engine, self.adapter, dist=self.dist)
        overlap = config.train.async_rollout
        #: the next step's rollout in flight while this one trains (train.async_rollout), or None
        self.prefetch = RolloutPrefetch(overlap.max_staleness) if overlap.prefetches else None

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
            SamplingParams.from_config(self.config.rollout, self.config.seed, greedy=True),
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

    def _sampling_params(self, refill_round: int = 0, step: int | None = None) -> SamplingParams:
        """The rollout's parameters for step ``step`` (0-based; default: the one in progress)."""
        step = self.step if step is None else step
        return SamplingParams.from_config(
            self.config.rollout,
            sampling_seed(self.config.seed, step, self.dist.rank, refill_round),
            tempered_logprobs=self.config.algorithm.logprob_temperature == "sampling",
        )

    def _rollout(self, records: Sequence[Record], refill_round: int = 0) -> RolloutTree:
        return self.rollout.sample(self.adapter.build_inputs(records), self._sampling_params(refill_round))

    def _scored(self, records: list[Record], timer: PhaseTimer, refill_round: int = 0) -> ScoredBatch:
        """``records`` rolled out and scored: the K x M tree, or with adaptive answers the two-phase ragged one."""
        adaptive = self.config.rollout.adaptive_answers
        if adaptive.enabled:
            tree, scored = two_phase_rollout(
                self.rollout,
                self.adapter.build_inputs(records),
                self._sampling_params(refill_round),
                adaptive,
                lambda part: score_tree(part, records, self.adapter, self.training_rewards),
                timer,
            )
            return ScoredBatch(records, tree, scored)
        with timer("rollout"):
            tree = self._rollout(records, refill_round)
        with timer("reward"):
            scored = score_tree(tree, records, self.adapter, self.training_rewards)
        return ScoredBatch(records, tree, scored)

    def _first_batch(self, timer: PhaseTimer) -> tuple[ScoredBatch, dict[str, float], float]:
        """The step's first rollout, scored: the prefetched one when one is in flight and fresh enough, else
        sampled now; with its ``async/*`` metrics and the seconds the server sampled while the trainer was busy
        (``time/rollout_s`` counts only the trainer's wait)."""
        if self.prefetch is None:
            return self._scored(self.next_records(), timer), {}, 0.0
        with timer("rollout"):  # the wait for the rollout in flight
            taken = self.prefetch.take(self.rollout.version)
        if taken is None or taken.tree is None:  # none in flight (first step), or too stale
            batch = self._scored(self.next_records() if taken is None else taken.records, timer)
            return batch, SYNCHRONOUS if taken is None else taken.metrics(), 0.0
        with timer("reward"):
            scored = score_tree(taken.tree, taken.records, self.adapter, self.training_rewards)
        return ScoredBatch(taken.records, taken.tree, scored), taken.metrics(), taken.overlap_s

    def _prefetch_next(self) -> None:
        """Start the next step's rollout on the server (train.async_rollout), unless this step is the last."""
        if self.prefetch is None or self.step + 1 >= self.config.train.steps:
            return
        data_state = self.sampler.state_dict()
        records = self.next_records()
        request = self.rollout.request_sample(
            self.adapter.build_inputs(records), self._sampling_params(step=self.step + 1)
        )
        self.prefetch.submit(records, data_state, request)

    def data_state(self) -> dict:
        pending = None if self.prefetch is None else self.prefetch.data_state()
        return super().data_state() if pending is None else pending

    def _step_batch(self, timer: PhaseTimer) -> tuple[ScoredBatch, dict[str, float], float]:
        """This rank's share of the step, rolled out and scored (with dynamic sampling, refilled); its extra
        metrics and the server's sampling seconds the trainer did not wait for."""
        batch, metrics, overlapped_s = self._first_batch(timer)
        dynamic = self.config.algorithm.dynamic_sampling
        if not dynamic.enabled:
            return batch, metrics, overlapped_s
        refilled = refill(
            batch,
            lambda refill_round: self._scored(self.next_records(), timer, refill_round),
            dynamic.max_rounds,
            self.config.train.dist_timeout_s,
        )
        return refilled.batch, metrics | refilled.metrics(), overlapped_s

    def _scoring(self, *, entropy: bool) -> ScoringOptions:
        """How the training passes score tokens: at the temperature the rollout recorded its log-probs under."""
        params = self._sampling_params()
        return ScoringOptions(
            temperature=params.logprob_temperature(params.temperature),
            entropy=entropy,
            entropy_grad=entropy and self.config.algorithm.entropy_coef > 0,
        )

    def _log_probs(self, model, tree: RolloutTree, chunk: list[int], options: ScoringOptions) -> PathLogProbs:
        """Thought and answer log-probs of a micro-batch through the configured pass (shared prefix or naive)."""
        compute = shared_prefix_log_probs if self.config.train.logprob_pass == "shared" else path_log_probs
        return compute(model, tree, chunk, self.adapter.tokens, options)

    def _targets(self, tree: RolloutTree, rewards: torch.Tensor) -> SegmentTargets:
        """GRPO-MA advantages of the step's rewards and token weights of the whole optimizer batch."""
        config, algo = self.config, self.config.algorithm
        two_phase = self._two_phase_values()
        thought_adv, answer_adv = grpo_ma_advantages(
            rewards,
            scale=algo.advantage_scale,
            eps=algo.advantage_eps,
            answer_mask=tree.answer_present,
            values=None if two_phase is None else two_phase.values(rewards, tree.answer_present),
        )
        thought_mask = tree.thought_loss_mask(len(self.adapter.tokens.think_close))
        thought_weights, answer_weights = grpo_ma_token_weights(
            thought_mask.sum(-1),
            tree.answer_lengths,
            aggregation=algo.loss_aggregation,
            thought_loss_weight=algo.thought_loss_weight,
            max_completion_tokens=config.rollout.max_thought_tokens + config.rollout.max_answer_tokens,
            thought_weighting=algo.thought_weighting,
            answer_mask=tree.answer_present,
        )
        return SegmentTargets(thought_adv, answer_adv, thought_weights, answer_weights, thought_mask)

    def _two_phase_values(self) -> TwoPhaseValues | None:
        """How adaptive answers' thought values weigh first and extra answers (None: the plain mean)."""
        adaptive, thoughts = self.config.rollout.adaptive_answers, self.config.rollout.num_thoughts
        return (
            TwoPhaseValues.for_budget(adaptive.first, adaptive.budget, thoughts) if adaptive.enabled else None
        )

    def _loss_options(self) -> dict[str, float | str]:
        """The clipped objective's settings, as :func:`~vlm_grpoma.algorithm.loss.policy_loss` takes them."""
        algo = self.config.algorithm
        return {
            "clip_eps_low": algo.clip_eps_low,
            "clip_eps_high": algo.clip_eps_high,
            "kl_beta": algo.kl_beta,
            "kl_estimator": algo.kl_estimator,
            "importance_sampling_level": algo.importance_sampling_level,
            "entropy_coef": algo.entropy_coef,
        }

    def _update(self, tree: RolloutTree, targets: SegmentTargets) -> tuple[dict[str, float], float]:
        """μ policy epochs over the micro-batches, one optimizer step each; returns the update's metrics and the
        last epoch's gradient norm (GSS scores one norm per training step)."""
        algo, engine = self.config.algorithm, self.engine
        chunks = micro_batches(*row_tokens(tree, self.config.train.logprob_pass), self.config.train)
        scoring, fixed = self._scoring(entropy=True), self._scoring(entropy=False)
        # entropy enters the loss only through the bonus or the mask; otherwise it is logged from epoch 0 alone
        entropy_trains = algo.entropy_coef > 0 or algo.top_entropy_fraction < 1
        old = ref = None
        if algo.policy_epochs > 1:  # the sampling policy, fixed for every epoch
            with torch.no_grad():
                old = [self._log_probs(engine.deepspeed, tree, chunk, fixed) for chunk in chunks]
        if engine.has_reference:
            with engine.reference() as reference:
                ref = [self._log_probs(reference, tree, chunk, fixed) for chunk in chunks]
        losses, steps, pairs, segment_stats = LossStats(), [], [], SegmentStats()
        correction = algo.rollout_correction.resolved_mode(self.config.rollout.backend)
        for epoch in range(algo.policy_epochs):
            if self.config.train.micro_batch_tokens:
                engine.plan_step(len(chunks))
            for index, chunk in enumerate(chunks):
                logp = self._log_probs(
                    engine.deepspeed, tree, chunk, scoring if epoch == 0 or entropy_trains else fixed
                )
                # epoch 0 is the sampling policy: its log-probs of the sampled tokens should be the rollout's
                if epoch == 0:
                    pairs.append((logp.thought, tree.thought_logprobs[chunk], targets.thought_mask[chunk]))
                    pairs.append((logp.answer, tree.answer_logprobs[chunk], tree.answer_mask[chunk]))
                segments = micro_batch_segments(
                    tree,
                    chunk,
                    logp,
                    targets,
                    None if old is None else old[index],
                    None if ref is None else ref[index],
                    algo,
                    correction,
                    segment_stats if epoch == 0 else None,
                )
                outputs = [policy_loss(part, **self._loss_options()) for part in segments]
                engine.backward(outputs[0].loss + outputs[1].loss)
                for output in outputs:
                    losses.add(output)
            steps.append(engine.step())
            self.rollout.update_weights(engine)
        answer_adv = targets.answer_adv if tree.answer_present is None else targets.answer_adv[tree.present]
        metrics = losses.metrics(algo.policy_epochs) | {
            "train/skipped_steps": float(sum(result.skipped for result in steps)),
            "train/learning_rate": sum(result.learning_rate for result in steps) / len(steps),
            "adv/thought_abs_mean": float(targets.thought_adv.abs().mean()),
            "adv/answer_abs_mean": float(answer_adv.abs().mean()),
        }
        metrics |= logprob_mismatch(pairs).metrics() | segment_stats.metrics(correction)
        return metrics, steps[-1].grad_norm

    def train_step(self) -> dict[str, float]:
        """One step on this rank's share of the prompts: rollout, rewards, update; the metrics of all ranks."""
        timer = PhaseTimer()
        batch, batch_metrics, overlapped_s = self._step_batch(timer)
        self._prefetch_next()  # after any refill: the data order stays the synchronous run's
        tree, scored, result = batch.tree, batch.scored, batch.scored.result
        samples = completion_samples(tree, batch.records, result, scored.parsed, self.config.logging.samples)
        self.logger.log_samples(self.step + 1, samples)
        with timer("update"):
            update, grad_norm = self._update(tree, self._targets(tree, scored.rewards))
        local = (
            rollout_metrics(tree, timer.seconds["rollout"] + overlapped_s)
            | reward_metrics(
                scored.rewards, scored.parsed, result, tree.answer_present, self._two_phase_values()
            )
            | update
            | batch_metrics
            | timer.metrics()
        )
        two_phase = self._two_phase_values()
        if two_phase is not None:
            local |= allocation_metrics(tree, scored.rewards, two_phase)
        timeout = self.config.train.dist_timeout_s
        metrics = reduce_metrics(local, timeout_s=timeout)
        metrics |= global_reward_metrics(
            scored.rewards[tree.present],
            result.failures,
            timeout,
            step=self.step + 1,
            is_main=self.dist.is_main,
        )
        metrics |= self.gradient_metrics(grad_norm)
        metrics["time/step_s"] = timer.elapsed()
        return metrics


def main(args: argparse.Namespace) -> int:
    """``vlm-grpoma train`` handler (one process per rank under the deepspeed launcher)."""
    return GRPOMATrainer(args.config_obj).run_to_end("reward/total_mean")
