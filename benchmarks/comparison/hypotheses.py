"""The paper-regime hypotheses H1–H4, stated (with the rule that decides each) before the runs, and judged from
them: each comes back supported, not supported or inconclusive, whatever the data say.

The rules use the report's statistics: arms are independent (Welch's t-test / Welch–Satterthwaite degrees of
freedom), seeds are the replicates, 95 % two-sided.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats

from comparison.summary import ArmSummary, Difference, Stat, difference

SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE = "supported", "not supported", "inconclusive"
STEP_TIME_TARGET = 0.6  # H1: T4A4 seconds per step / T16A1 seconds per step


@dataclass(frozen=True)
class Hypothesis:
    name: str
    claim: str
    rule: str


def hypotheses(metric: str = "IoU") -> tuple[Hypothesis, ...]:
    """H1–H5 with the task's held-out ``metric`` named (IoU in the paper's regime, accuracy on reasoning)."""
    return (
        Hypothesis(
            "H1",
            f"At this thought:answer length ratio a T4A4 step takes at most {STEP_TIME_TARGET}× the time of a "
            "T16A1 step (both score 16 answers per prompt; T4A4 samples 4 thoughts instead of 16).",
            "Ratio of the arms' mean seconds per step with a 95 % interval (delta method, Welch degrees of "
            f"freedom): supported if the whole interval is ≤ {STEP_TIME_TARGET}, not supported if it is wholly "
            "above, inconclusive otherwise.",
        ),
        Hypothesis(
            "H2",
            f"At equal training time, T4A4 reaches at least the held-out {metric} of T16A1.",
            f"Held-out {metric} of each run's final evaluation (after the time budget), T4A4 − T16A1, Welch's "
            "t-test: supported if higher at the 5 % level, not supported if lower, inconclusive otherwise; the "
            "evidence states the smallest difference the seeds could detect (80 % power).",
        ),
        Hypothesis(
            "H3",
            "The logged thought-advantage variance estimate falls with M as `benchmarks/variance.py` predicts: "
            "in its large-K limit σ²/(M·τ² + σ²), so going from M = 2 (T8A2) to M = 4 (T4A4) turns an estimate v "
            "into v / (2 − v).",
            "Run means of `variance/thought_adv_estimate`: supported if T4A4's is lower than T8A2's at the 5 % "
            "level and the prediction from T8A2's mean lies in T4A4's 95 % interval; not supported if it is "
            "higher at that level, or lower but the prediction lies outside the interval; inconclusive otherwise.",
        ),
        Hypothesis(
            "H4",
            "GRPO-MA has lower gradient spikes: the largest gradient spike score (GSS) of a T4A4 run is lower than "
            "that of a T16A1 run.",
            "Per run, the largest GSS over the steps every run of the task reached (equal steps, so a faster arm is "
            "not judged on more steps), T4A4 − T16A1, Welch's t-test: supported if lower at the 5 % level, not "
            "supported if higher, inconclusive otherwise.",
        ),
        Hypothesis(
            "H5",
            "At the same 16 answers per prompt, allocating them per thought by Neyman (T4A4-adaptive: 2 first, "
            "the rest where the first rewards spread most, 2..8 per thought) lowers T4A4's thought-advantage "
            "variance estimate without lowering its held-out score.",
            "Run means of `variance/thought_adv_estimate` and the final held-out score, T4A4-adaptive − T4A4, "
            "Welch's t-tests: supported if the variance is lower at the 5 % level and the held-out score is not "
            "lower at that level; not supported if the variance is higher or the held-out score lower at that "
            "level; inconclusive otherwise (or when T4A4-adaptive was not run).",
        ),
    )


#: the paper-regime statement (the toy report lists it before that plan runs)
HYPOTHESES = hypotheses()


@dataclass(frozen=True)
class Judgement:
    hypothesis: Hypothesis
    evidence: str
    verdict: str


def _interval(stat: Stat) -> tuple[float, float]:
    if stat.n < 2:
        return math.nan, math.nan
    half = stats.t.ppf(0.975, stat.n - 1) * stat.std / math.sqrt(stat.n)
    return stat.mean - half, stat.mean + half


def _signed(diff: Difference, good: int) -> str:
    """Verdict of a two-arm difference where ``good`` is the sign the hypothesis predicts."""
    if not diff.clear:
        return INCONCLUSIVE
    return SUPPORTED if math.copysign(1, diff.diff) == good else NOT_SUPPORTED


def step_time_ratio(ma: ArmSummary, grpo: ArmSummary) -> tuple[float, float, float]:
    """T4A4 / T16A1 mean seconds per step and its 95 % interval (delta method on the two independent means)."""
    a, b = ma.step_seconds, grpo.step_seconds
    ratio = a.mean / b.mean
    if a.n < 2 or b.n < 2:
        return ratio, math.nan, math.nan
    va, vb = (a.std / a.mean) ** 2 / a.n, (b.std / b.mean) ** 2 / b.n
    relative = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (a.n - 1) + vb**2 / (b.n - 1)) if relative > 0 else math.inf
    half = stats.t.ppf(0.975, df) * relative * ratio
    return ratio, ratio - half, ratio + half


def predicted_variance(estimate: float, answers_from: int, answers_to: int) -> float:
    """The large-K estimate at ``answers_to`` answers per thought from its value at ``answers_from``:
    1/v = M·ρ + 1 with ρ = τ²/σ² a property of the task and policy, not of M. The estimate lies in [0, 1]; its
    ends stay put (0: answers never disagree, σ² = 0; 1: thoughts never differ, τ² = 0)."""
    if not 0 < estimate < 1:
        return estimate
    rho = (1 / estimate - 1) / answers_from
    return 1 / (answers_to * rho + 1)


def judge(
    arms: dict[str, ArmSummary], gss_equal_steps: dict[str, Stat], steps: int, metric: str = "IoU"
) -> list[Judgement]:
    """H1–H5 from the arm summaries of an equal-time task (``gss_equal_steps``: each arm's per-run largest GSS
    over the first ``steps`` steps; ``metric``: the held-out score's name)."""
    ma, grpo, m2 = arms["T4A4"], arms["T16A1"], arms.get("T8A2")
    stated = hypotheses(metric)
    out = []

    ratio, low, high = step_time_ratio(ma, grpo)
    verdict = (
        SUPPORTED if high <= STEP_TIME_TARGET else NOT_SUPPORTED if low > STEP_TIME_TARGET else INCONCLUSIVE
    )
    interval = f" (95 % interval {low:.2f}–{high:.2f})" if math.isfinite(low) else " (one seed: no interval)"
    out.append(
        Judgement(
            stated[0],
            f"T4A4 {ma.step_seconds.text(2)} s/step, T16A1 {grpo.step_seconds.text(2)} s/step: ratio "
            f"{ratio:.2f}{interval}.",
            verdict if math.isfinite(low) else INCONCLUSIVE,
        )
    )

    sets = sorted(set(ma.held_out_end) & set(grpo.held_out_end))
    diff = difference(ma.held_out_end[sets[0]], grpo.held_out_end[sets[0]])
    detectable = diff.detectable()
    power = (
        f" The seeds could detect a difference of {detectable:.3f} (80 % power, 5 % level)."
        if math.isfinite(detectable)
        else " Without a spread over seeds no difference can be judged."
    )
    out.append(
        Judgement(
            stated[1],
            f"final held-out {metric} T4A4 {ma.held_out_end[sets[0]].text()}, T16A1 "
            f"{grpo.held_out_end[sets[0]].text()}; T4A4 − T16A1 {diff.text()}.{power}",
            _signed(diff, +1),
        )
    )

    if m2 is None or m2.thought_variance.n == 0 or ma.thought_variance.n == 0:
        out.append(Judgement(stated[2], "T8A2 or T4A4 was not run.", INCONCLUSIVE))
    else:
        predicted = predicted_variance(m2.thought_variance.mean, 2, 4)
        diff = difference(ma.thought_variance, m2.thought_variance)
        low, high = _interval(ma.thought_variance)
        inside = low <= predicted <= high
        verdict = _signed(diff, -1)
        if verdict == SUPPORTED and not inside:
            verdict = NOT_SUPPORTED
        out.append(
            Judgement(
                stated[2],
                f"T8A2 (M = 2) {m2.thought_variance.text()}, T4A4 (M = 4) {ma.thought_variance.text()} "
                f"(95 % interval {low:.3f}–{high:.3f}); predicted for M = 4 from T8A2: {predicted:.3f} "
                f"({'inside' if inside else 'outside'} the interval); T4A4 − T8A2 {diff.text()}.",
                verdict,
            )
        )

    diff = difference(gss_equal_steps["T4A4"], gss_equal_steps["T16A1"])
    out.append(
        Judgement(
            stated[3],
            f"largest GSS over the first {steps} steps: T4A4 {gss_equal_steps['T4A4'].text(2)}, T16A1 "
            f"{gss_equal_steps['T16A1'].text(2)}; T4A4 − T16A1 {diff.text()}.",
            _signed(diff, -1),
        )
    )
    out.append(adaptive_judgement(ma, arms.get("T4A4-adaptive")))
    return out


def adaptive_judgement(ma: ArmSummary, adaptive: ArmSummary | None) -> Judgement:
    """H5: T4A4-adaptive against T4A4 (the rule in :data:`HYPOTHESES`)."""
    if adaptive is None or adaptive.thought_variance.n == 0 or ma.thought_variance.n == 0:
        return Judgement(HYPOTHESES[4], "T4A4-adaptive was not run.", INCONCLUSIVE)
    variance = difference(adaptive.thought_variance, ma.thought_variance)
    sets = sorted(set(adaptive.held_out_end) & set(ma.held_out_end))
    held = difference(adaptive.held_out_end[sets[0]], ma.held_out_end[sets[0]]) if sets else None
    lower_variance = _signed(variance, -1)
    held_verdict = INCONCLUSIVE if held is None else _signed(held, +1)
    if lower_variance == NOT_SUPPORTED or held_verdict == NOT_SUPPORTED:
        verdict = NOT_SUPPORTED
    elif lower_variance == SUPPORTED and held is not None:
        verdict = SUPPORTED
    else:
        verdict = INCONCLUSIVE
    held_text = "no common held-out set" if held is None else f"held-out {sets[0]} − T4A4 {held.text()}"
    return Judgement(
        HYPOTHESES[4],
        f"variance estimate T4A4-adaptive {adaptive.thought_variance.text()}, T4A4 {ma.thought_variance.text()}; "
        f"T4A4-adaptive − T4A4 {variance.text()}; {held_text}.",
        verdict,
    )
