"""Gradient spike score and thought-advantage variance estimators."""

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vlm_grpoma.algorithm.advantages import grpo_ma_advantages
from vlm_grpoma.algorithm.diagnostics import GradientSpikeTracker, thought_advantage_variance

REPO = Path(__file__).resolve().parents[2]


def test_gss_matches_definition_and_counts_spikes():
    norms = [1.0, 2.0, 0.5] * 7 + [300.0, 1.0, 40.0]
    tracker = GradientSpikeTracker()
    for t, norm in enumerate(norms):
        expected = norm / (sum(norms[: t + 1]) / (t + 1))
        assert tracker.update(norm) == pytest.approx(expected)
    # 300 / mean(first 22) = 300 / (24.5 + 300) * 22 > 10: one spike; 40 afterwards is not.
    assert tracker.spikes == 1


def test_gss_exactly_ten_times_the_mean_is_not_a_spike():
    """GSS@10 counts scores that EXCEED 10: ten steps of norm 1 then 100 give a mean of 110 / 11 = 10 and a
    score of exactly 10 (no spike); 101 gives 101 / (111 / 11) > 10 (a spike)."""
    at, above = GradientSpikeTracker(), GradientSpikeTracker()
    for _ in range(10):
        at.update(1.0)
        above.update(1.0)
    assert at.update(100.0) == 10.0 and at.spikes == 0
    assert above.update(101.0) > 10.0 and above.spikes == 1
    custom = GradientSpikeTracker(threshold=2.0)
    assert [custom.update(n) for n in (1.0, 3.0)] == [1.0, 1.5] and custom.spikes == 0


def test_gss_of_zero_norms_is_zero():
    tracker = GradientSpikeTracker()
    assert tracker.update(0.0) == 0.0 and tracker.update(0.0) == 0.0
    assert tracker.update(5.0) == pytest.approx(3.0) and tracker.spikes == 0


def test_gss_first_step_is_one_and_non_finite_norms_are_skipped():
    tracker = GradientSpikeTracker()
    assert tracker.update(3.0) == 1.0
    assert math.isnan(tracker.update(float("nan")))
    assert math.isnan(tracker.update(float("inf")))
    assert tracker.steps == 1 and tracker.update(3.0) == 1.0


def test_gss_state_round_trip_continues_identically():
    a = GradientSpikeTracker()
    for norm in (1.0, 5.0, 2.0):
        a.update(norm)
    b = GradientSpikeTracker()
    b.load_state_dict(a.state_dict())
    assert a.update(50.0) == b.update(50.0) and a.spikes == b.spikes


def spam_gss(norms: list[float]) -> list[float]:
    """SPAM's gradient spike score (Huang et al., 2025): each step's norm over the mean norm of the
    whole run of T steps, ``|g_i| / ((1 / T) Σ_j |g_j|)``."""
    mean = sum(norms) / len(norms)
    return [n / mean for n in norms]


def test_planted_spike_scores_against_the_run_mean_and_counts_at_the_end():
    """A norm of 50 at step 6 of a 100-step run of norms 1: SPAM's GSS is 50 / (149 / 100) = 33.56 and counts
    for GSS@10; the running score only divides by the first six steps' mean (50 / (55 / 6) = 5.45)."""
    norms = [1.0] * 100
    norms[5] = 50.0
    tracker = GradientSpikeTracker()
    running = [tracker.update(n) for n in norms]
    assert running[5] == pytest.approx(50 / (55 / 6)) and round(running[5], 2) == 5.45
    assert tracker.spikes == 0  # the running score never crossed 10
    scores = tracker.run_scores()
    assert scores == pytest.approx(spam_gss(norms)) and round(scores[5], 1) == 33.6
    assert tracker.run_metrics() == {
        "train/gss_max": pytest.approx(50 / 1.49),
        "train/gss10_count": 1.0,
        "train/gss10_fraction": pytest.approx(0.01),
    }


def test_run_gss_of_an_early_spike_the_running_score_cannot_see():
    """At step 1 the running score is always 1; against the run's mean an opening spike still counts."""
    tracker = GradientSpikeTracker()
    norms = [40.0] + [1.0] * 29
    for n in norms:
        tracker.update(n)
    assert tracker.spikes == 0 and tracker.run_metrics()["train/gss10_count"] == 1.0
    assert tracker.run_scores() == pytest.approx(spam_gss(norms))


def test_run_gss_skips_non_finite_norms_and_resumes_from_its_state():
    a = GradientSpikeTracker()
    for n in (1.0, math.inf, 2.0, math.nan, 30.0):
        a.update(n)
    b = GradientSpikeTracker()
    b.load_state_dict(a.state_dict())
    for tracker in (a, b):
        tracker.update(1.0)
    assert a.run_scores() == b.run_scores() == pytest.approx(spam_gss([1.0, 2.0, 30.0, 1.0]))
    old = GradientSpikeTracker()  # a state saved before the norms were kept resumes the running score
    old.load_state_dict({"threshold": 10.0, "steps": 3, "norm_sum": 6.0, "spikes": 0})
    assert old.update(4.0) == pytest.approx(4.0 / (10.0 / 4)) and old.run_scores() == [1.0]
    assert GradientSpikeTracker().run_metrics()["train/gss10_count"] == 0.0


def test_variance_is_nan_without_several_answers_and_zero_without_answer_noise():
    assert torch.isnan(thought_advantage_variance(torch.rand(3, 4, 1))).all()
    deterministic = torch.tensor([[[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]]])
    assert thought_advantage_variance(deterministic).item() == 0.0


def beta_bernoulli(prompts, thoughts, answers, seed):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    p = torch.distributions.Beta(2.0, 2.0).sample((prompts, thoughts)).double()
    return (
        torch.rand(prompts, thoughts, answers, generator=gen, dtype=torch.float64) < p.unsqueeze(-1)
    ).double()


@pytest.mark.parametrize("answers", [2, 4, 8])
def test_estimator_recovers_the_large_k_limit(answers):
    # Beta(2, 2): tau^2 = 0.05, mean sigma^2 = 0.2 -> limit 0.2 / (0.05 M + 0.2)
    limit = 0.2 / (0.05 * answers + 0.2)
    rewards = beta_bernoulli(prompts=64, thoughts=256, answers=answers, seed=answers)
    assert thought_advantage_variance(rewards).mean().item() == pytest.approx(limit, rel=0.08)


def test_estimator_matches_direct_resampling_of_answers():
    """From one draw, the estimate must match the variance of thought advantages over fresh answer draws."""
    gen = torch.Generator().manual_seed(4)
    p = torch.rand(1, 256, 1, generator=gen, dtype=torch.float64)
    fresh = (torch.rand(1000, 256, 4, generator=gen, dtype=torch.float64) < p).double()
    direct = grpo_ma_advantages(fresh)[0].var(dim=0).mean().item()
    estimate = thought_advantage_variance(fresh[:100]).mean().item()
    assert estimate == pytest.approx(direct, rel=0.08)


def test_variance_benchmark_prints_the_tables():
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "variance.py"), "--sets", "12", "--replicates", "24"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    conditional, resampled = (out.split(heading)[1].split("\n\n")[0] for heading in ("(1a)", "(1b)"))
    for table in (conditional, resampled):
        rows = [line for line in table.splitlines() if line.split("|")[0].strip().isdigit()]
        assert [int(r.split("|")[0]) for r in rows] == [1, 2, 4, 8, 16]
        assert all(len(r.split("|")) == 7 for r in rows)  # M, K = 2, 4, 8, 16, 64, the limit


def test_ragged_thought_advantage_variance_uses_each_thoughts_own_count():
    """Against a loop: mean_k(s_k²/M_k) / (max(Var_k V̂_k − mean_k(s_k²/M_k), 0) + mean_k(s_k²/M_k)); an
    all-True mask gives the uniform estimate."""
    import torch

    from vlm_grpoma.algorithm.diagnostics import thought_advantage_variance

    generator = torch.Generator().manual_seed(0)
    rewards = torch.rand(3, 4, 6, generator=generator, dtype=torch.float64)
    counts = torch.tensor([[2, 6, 3, 4], [5, 5, 2, 2], [6, 2, 2, 2]])
    mask = torch.arange(6) < counts.unsqueeze(-1)
    got = thought_advantage_variance(rewards.where(mask, torch.nan), mask)
    for b in range(3):
        parts = [rewards[b, k, : counts[b, k]] for k in range(4)]
        noise = sum(float(p.var() / len(p)) for p in parts) / 4
        between = max(float(torch.stack([p.mean() for p in parts]).var()) - noise, 0.0)
        assert float(got[b]) == pytest.approx(noise / (between + noise), rel=1e-12)
    full = torch.ones(3, 4, 6, dtype=torch.bool)
    assert torch.equal(thought_advantage_variance(rewards, full), thought_advantage_variance(rewards))


def test_two_phase_thought_advantage_variance_uses_the_estimators_own_variance():
    """A two-phase tree: each thought's noise is s_k²·(w²/f + (1 − w)²/e_k) and the spread is that of the
    two-phase values, against a loop."""
    import torch

    from vlm_grpoma.algorithm.allocation import TwoPhaseValues
    from vlm_grpoma.algorithm.diagnostics import thought_advantage_variance

    generator = torch.Generator().manual_seed(1)
    rewards = torch.rand(3, 4, 8, generator=generator, dtype=torch.float64)
    counts = torch.tensor([[3, 5, 4, 4], [6, 3, 3, 4], [3, 3, 3, 7]])  # 2 first answers, 16 in all
    mask = torch.arange(8) < counts.unsqueeze(-1)
    two_phase = TwoPhaseValues.for_budget(2, 16, 4)
    got = thought_advantage_variance(rewards.where(mask, torch.nan), mask, two_phase)
    w = 0.5
    for b in range(3):
        parts = [rewards[b, k, : counts[b, k]] for k in range(4)]
        noise = sum(float(p.var()) * (w**2 / 2 + (1 - w) ** 2 / (len(p) - 2)) for p in parts) / 4
        values = torch.stack([w * p[:2].mean() + (1 - w) * p[2:].mean() for p in parts])
        between = max(float(values.var()) - noise, 0.0)
        assert float(got[b]) == pytest.approx(noise / (between + noise), rel=1e-12)
