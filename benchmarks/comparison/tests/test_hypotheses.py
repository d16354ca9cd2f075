"""The paper-regime hypotheses' decision rules: each verdict branch, the M-scaling prediction against the
closed form it comes from, and the step-time ratio interval against a direct computation."""

from __future__ import annotations

import math

import pytest
from comparison.hypotheses import (
    INCONCLUSIVE,
    NOT_SUPPORTED,
    SUPPORTED,
    judge,
    predicted_variance,
    step_time_ratio,
)
from comparison.summary import Stat, summarise
from scipy import stats


@pytest.mark.parametrize(("sigma2", "tau2"), [(0.25, 0.05), (0.1, 0.2), (0.2, 0.0)])
def test_m_scaling_prediction_is_the_large_k_limit(sigma2, tau2):
    limit = lambda m: sigma2 / (m * tau2 + sigma2)  # noqa: E731 - benchmarks/variance.py's σ²/(M·τ² + σ̄²)
    assert predicted_variance(limit(2), 2, 4) == pytest.approx(limit(4))
    assert predicted_variance(limit(2), 2, 8) == pytest.approx(limit(8))
    assert predicted_variance(limit(4), 4, 2) == pytest.approx(limit(2))


def test_m_scaling_prediction_keeps_the_ends_of_the_range():
    # all answers of every thought agree (σ² = 0: e.g. a warm start that always scores 0) or thoughts never differ
    assert predicted_variance(0.0, 2, 4) == 0.0 and predicted_variance(1.0, 2, 4) == 1.0


def test_step_time_ratio_interval_is_the_delta_method_with_welch_degrees_of_freedom():
    fast, slow = _arm("T4A4", step_seconds=[1.0, 1.1, 0.9]), _arm("T16A1", step_seconds=[2.0, 2.4, 1.6])
    ratio, low, high = step_time_ratio(fast, slow)
    assert ratio == pytest.approx(0.5)
    va, vb = (0.1 / 1.0) ** 2 / 3, (0.4 / 2.0) ** 2 / 3
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)
    half = stats.t.ppf(0.975, df) * math.sqrt(va + vb) * 0.5
    assert (low, high) == pytest.approx((0.5 - half, 0.5 + half))


def _arm(name, *, step_seconds=(1.0, 1.0, 1.0), held=(0.5, 0.5, 0.5), variance=(math.nan,) * 3):
    """An ArmSummary whose per-seed numbers are the given ones (built through ``summarise``'s fields)."""
    base = summarise(name, 16, [])
    return type(base)(
        **{
            **base.__dict__,
            "step_seconds": Stat.of(step_seconds),
            "held_out_end": {"test": Stat.of(held)},
            "thought_variance": Stat.of(variance),
        }
    )


def _verdicts(**arms) -> dict[str, str]:
    gss = arms.pop("gss", {"T4A4": Stat.of([1.0, 1.1, 0.9]), "T16A1": Stat.of([1.0, 1.2, 0.8])})
    summaries = {
        "T4A4": _arm("T4A4", **arms.get("T4A4", {})),
        "T16A1": _arm("T16A1", **arms.get("T16A1", {})),
        "T8A2": _arm("T8A2", **arms.get("T8A2", {})),
    }
    return {j.hypothesis.name: j.verdict for j in judge(summaries, gss, 10)}


def test_each_hypothesis_can_come_out_every_way():
    slow_ma = {"step_seconds": [1.5, 1.6, 1.4]}
    fast_ma = {"step_seconds": [0.5, 0.52, 0.48]}
    borderline = {"step_seconds": [0.6, 0.9, 0.3]}
    grpo = {"step_seconds": [1.0, 1.02, 0.98]}
    assert _verdicts(T4A4=fast_ma, T16A1=grpo)["H1"] == SUPPORTED
    assert _verdicts(T4A4=slow_ma, T16A1=grpo)["H1"] == NOT_SUPPORTED
    assert _verdicts(T4A4=borderline, T16A1=grpo)["H1"] == INCONCLUSIVE

    assert _verdicts(T4A4={"held": [0.6, 0.61, 0.59]})["H2"] == SUPPORTED
    assert _verdicts(T4A4={"held": [0.4, 0.41, 0.39]})["H2"] == NOT_SUPPORTED
    assert _verdicts(T4A4={"held": [0.6, 0.3, 0.7]})["H2"] == INCONCLUSIVE

    m2 = {"variance": [0.5, 0.51, 0.49]}  # predicts 0.333 at M = 4
    assert _verdicts(T8A2=m2, T4A4={"variance": [0.33, 0.335, 0.334]})["H3"] == SUPPORTED
    assert _verdicts(T8A2=m2, T4A4={"variance": [0.2, 0.21, 0.19]})["H3"] == NOT_SUPPORTED  # falls too far
    assert _verdicts(T8A2=m2, T4A4={"variance": [0.6, 0.61, 0.59]})["H3"] == NOT_SUPPORTED  # rises
    assert _verdicts(T8A2=m2, T4A4={"variance": [0.2, 0.8, 0.5]})["H3"] == INCONCLUSIVE
    assert _verdicts()["H3"] == INCONCLUSIVE  # nothing logged (M = 1 arms only)

    lower = {"T4A4": Stat.of([1.0, 1.1, 0.9]), "T16A1": Stat.of([3.0, 3.1, 2.9])}
    higher = {"T4A4": Stat.of([3.0, 3.1, 2.9]), "T16A1": Stat.of([1.0, 1.1, 0.9])}
    assert _verdicts(gss=lower)["H4"] == SUPPORTED
    assert _verdicts(gss=higher)["H4"] == NOT_SUPPORTED
    assert _verdicts()["H4"] == INCONCLUSIVE


def test_one_seed_decides_nothing():
    one = {"step_seconds": [0.3], "held": [0.9]}
    verdicts = _verdicts(T4A4=one, T16A1={"step_seconds": [1.0], "held": [0.1]})
    assert verdicts["H1"] == INCONCLUSIVE and verdicts["H2"] == INCONCLUSIVE


def test_h2_names_the_tasks_metric_and_the_smallest_difference_the_seeds_detect():
    """The power statement is (t_0.975 + t_0.8) · se at Welch's df: a true difference that large is found 80 % of
    the time (checked by simulation with the noncentral t); the metric is the task's, not always IoU."""
    from comparison.summary import difference

    ma, grpo = Stat.of([0.6, 0.3, 0.7]), Stat.of([0.5, 0.45, 0.55])
    diff = difference(ma, grpo)
    detectable = diff.detectable()
    assert detectable == pytest.approx((stats.t.ppf(0.975, diff.df) + stats.t.ppf(0.8, diff.df)) * diff.se)
    power = 1 - stats.nct.cdf(stats.t.ppf(0.975, diff.df), diff.df, detectable / diff.se)
    assert 0.75 < power < 0.82  # the (t + t) rule is the usual approximation of the noncentral t's 80 %
    summaries = {name: _arm(name) for name in ("T4A4", "T16A1", "T8A2")}
    summaries["T4A4"] = _arm("T4A4", held=ma.values)
    summaries["T16A1"] = _arm("T16A1", held=grpo.values)
    gss = {"T4A4": Stat.of([1.0, 1.1, 0.9]), "T16A1": Stat.of([1.0, 1.2, 0.8])}
    [h2] = [j for j in judge(summaries, gss, 10, "accuracy") if j.hypothesis.name == "H2"]
    assert "held-out accuracy" in h2.hypothesis.claim and "IoU" not in h2.hypothesis.claim + h2.evidence
    assert f"could detect a difference of {detectable:.3f}" in h2.evidence
    one = {name: _arm(name, held=(0.5,)) for name in ("T4A4", "T16A1", "T8A2")}
    [h2] = [j for j in judge(one, gss, 10) if j.hypothesis.name == "H2"]
    assert "no difference can be judged" in h2.evidence and "held-out IoU" in h2.hypothesis.claim
