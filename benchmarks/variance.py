"""Monte-Carlo of the GRPO-MA thought-advantage variance, its logged estimate, and adaptive answer allocation.

1. Beta–Bernoulli model: each thought has a true value p ~ Beta(a, b), each of its M answers is rewarded
   Bernoulli(p), and the thought advantage is computed exactly as training does (``grpo_ma_advantages``).
   *Conditional* (the paper's quantity, answer-sampling noise only): the K thoughts are fixed and only their
   answers are redrawn; ``Var(A_k | p_1..p_K)`` averaged over k and over draws of the K thoughts.
   *Thought-resampled*: only the tagged thought's p is fixed, the other K−1 thoughts are redrawn with the
   answers, ``Var(A_k | p_k)``; it adds the noise of which peers a thought meets (what this table showed before).
   Both reach the large-K limit ``σ²/(M·τ² + σ̄²)`` (σ² = p(1−p), τ² = Var(p), σ̄² = E[p(1−p)]) as K grows.
2. The plug-in estimate training logs (``variance/thought_adv_estimate``, ``thought_advantage_variance``)
   targets that large-K limit; its expectation at the training K, by simulation, next to the exact small-K
   conditional variance and the limit.
3. Adaptive vs uniform answers at equal budget: ``first`` answers per thought, the rest of the budget by
   Neyman allocation (``algorithm/allocation.py``) valued by the unbiased two-phase values, on heteroscedastic
   and homoscedastic reward models; ratios adaptive / uniform of the conditional variances (summed over the K
   thoughts) with 95 % normal intervals (delta method over the draws of the K thoughts; both arms use the same
   answer draws).

4. The crossover (``--crossover``, issue #52): a task whose answer copies its thought's result (thought correct
   with probability ``accuracy``, the answer's reward then 1, else 0), with each answer's reward flipped with
   probability p (``rewards.noise.flip``): given its thought an answer scores Bernoulli(v_k), v_k = p or 1 − p.
   Per arm at 16 answers a prompt (T16A1, T8A2, T4A4) and p: the paper's conditional variance (answers redrawn,
   thoughts fixed); the *signal* S = E[A_k | correct] − E[A_k | wrong] and the *noise* N = Var(A_k | correctness)
   of the thought advantage over thoughts and answers both; the per-thought S²/N and the per-prompt K·S²/N (K
   independent thoughts push one gradient). p* is where T4A4's per-prompt S²/N first reaches T16A1's.

    python benchmarks/variance.py [--quick] [--a 2 --b 2 --sets 256 --replicates 128 --prior-dof 2 --seed 0]
    python benchmarks/variance.py --crossover [--accuracy 0.55]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from vlm_grpoma.algorithm.advantages import grpo_ma_advantages, thought_values
from vlm_grpoma.algorithm.allocation import TwoPhaseValues, allocate_answers, neyman_allocation
from vlm_grpoma.algorithm.diagnostics import thought_advantage_variance

THOUGHTS = (2, 4, 8, 16, 64)
ANSWERS = (1, 2, 4, 8, 16)
#: (K, answer budget per prompt, first answers per thought, max answers per thought) of section 3: T4A4's budget
#: with 2 first answers, 1.5 times it, and twice it with 4
AllocationSetting = tuple[int, int, int, int]
ALLOCATION_SETTINGS: tuple[AllocationSetting, ...] = ((4, 16, 2, 10), (4, 24, 2, 12), (4, 32, 4, 20))
#: elements per simulated chunk (bounds memory)
CHUNK_ELEMENTS = 2_000_000


@dataclass(frozen=True)
class Estimate:
    """A Monte-Carlo mean and its standard error."""

    mean: float
    stderr: float

    def text(self) -> str:
        return f"{self.mean:7.4f} ± {self.stderr:6.4f}"


def estimate(values: torch.Tensor) -> Estimate:
    return Estimate(values.mean().item(), values.std().item() / math.sqrt(len(values)))


def beta_moments(a: float, b: float) -> tuple[float, float]:
    """τ² = Var(p) and σ̄² = E[p(1−p)] for p ~ Beta(a, b)."""
    n = a + b
    return a * b / (n * n * (n + 1)), a * b / (n * (n + 1))


def sample_beta(shape: Sequence[int], a: float, b: float, gen: torch.Generator) -> torch.Tensor:
    """float64 Beta(a, b) draws, reproducible from ``gen`` (torch's Beta samples with the global RNG)."""
    torch.manual_seed(int(torch.randint(2**31, (1,), generator=gen)))
    beta = torch.distributions.Beta(
        torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    )
    return beta.sample(tuple(shape))


def bernoulli_answers(p: torch.Tensor, answers: int, gen: torch.Generator) -> torch.Tensor:
    """``[..., K, answers]`` 0/1 rewards for thought values ``p [..., K]``."""
    draws = torch.rand(*p.shape, answers, generator=gen, dtype=torch.float64)
    return (draws < p.unsqueeze(-1)).double()


def replicate_variance(values: torch.Tensor) -> torch.Tensor:
    """Unbiased variance over the replicate dimension 1 of ``[S, R, ...]``."""
    return values.var(dim=1)


@dataclass(frozen=True)
class ConditionalResult:
    """Per draw of the K thoughts ``[S]``: mean_k Var(A_k | thoughts), its large-K limit, the mean plug-in."""

    variance: torch.Tensor
    limit: torch.Tensor
    plugin: torch.Tensor | None


def conditional_variance(
    thoughts: int, answers: int, sets: int, replicates: int, a: float, b: float, gen: torch.Generator
) -> ConditionalResult:
    """Fix K thoughts, redraw only their answers ``replicates`` times; ``sets`` draws of the K thoughts."""
    tau2, sigma_bar2 = beta_moments(a, b)
    p = sample_beta((sets, thoughts), a, b, gen)
    variances, plugins = [], []
    for chunk in p.split(max(1, CHUNK_ELEMENTS // (replicates * thoughts * answers))):
        rewards = bernoulli_answers(chunk.unsqueeze(1).expand(-1, replicates, -1), answers, gen)
        flat = rewards.reshape(-1, thoughts, answers)
        thought_adv = grpo_ma_advantages(flat)[0].reshape(len(chunk), replicates, thoughts)
        variances.append(replicate_variance(thought_adv).mean(dim=-1))
        if answers > 1:
            plugins.append(thought_advantage_variance(flat).reshape(len(chunk), replicates).mean(dim=1))
    limit = (p * (1 - p)).mean(dim=-1) / (answers * tau2 + sigma_bar2)
    return ConditionalResult(torch.cat(variances), limit, torch.cat(plugins) if plugins else None)


def thought_resampled_variance(
    thoughts: int, answers: int, sets: int, replicates: int, a: float, b: float, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per tagged thought ``[S]``: Var(A_tagged | p_tagged) with the other thoughts redrawn, and its limit."""
    tau2, sigma_bar2 = beta_moments(a, b)
    tagged = sample_beta((sets,), a, b, gen)
    variances = []
    for chunk in tagged.split(max(1, CHUNK_ELEMENTS // (replicates * thoughts * answers))):
        p = sample_beta((len(chunk), replicates, thoughts), a, b, gen)
        p[..., 0] = chunk.unsqueeze(-1)
        flat = bernoulli_answers(p, answers, gen).reshape(-1, thoughts, answers)
        thought_adv = grpo_ma_advantages(flat)[0][:, 0].reshape(len(chunk), replicates)
        variances.append(replicate_variance(thought_adv))
    return torch.cat(variances), tagged * (1 - tagged) / (answers * tau2 + sigma_bar2)


@dataclass(frozen=True)
class RewardModel:
    """Thoughts ``(mean, sd) [S, K]`` drawn by ``draw_thoughts``; answers Bernoulli(mean) or Normal(mean, sd)."""

    name: str
    draw_thoughts: Callable[[int, int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    bernoulli: bool

    def answers(
        self, mean: torch.Tensor, sd: torch.Tensor, answers: int, gen: torch.Generator
    ) -> torch.Tensor:
        """``[..., K, answers]`` rewards for thoughts ``mean, sd [..., K]``."""
        if self.bernoulli:
            return bernoulli_answers(mean, answers, gen)
        noise = torch.randn(*mean.shape, answers, generator=gen, dtype=torch.float64)
        return mean.unsqueeze(-1) + sd.unsqueeze(-1) * noise


def beta_bernoulli(a: float, b: float) -> RewardModel:
    def draw(sets: int, thoughts: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        p = sample_beta((sets, thoughts), a, b, gen)
        return p, (p * (1 - p)).sqrt()

    return RewardModel(f"Bernoulli(p), p ~ Beta({a:g}, {b:g})", draw, bernoulli=True)


def gaussian(low_sd: float, high_sd: float) -> RewardModel:
    """Normal(μ_k, σ_k²) answers, μ_k ~ N(0, 0.5²), σ_k log-uniform on [low_sd, high_sd]."""

    def draw(sets: int, thoughts: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        mean = 0.5 * torch.randn(sets, thoughts, generator=gen, dtype=torch.float64)
        log_sd = torch.rand(sets, thoughts, generator=gen, dtype=torch.float64)
        return mean, low_sd * (high_sd / low_sd) ** log_sd

    spread = (
        f"σ_k log-uniform [{low_sd:g}, {high_sd:g}]" if high_sd > low_sd else f"σ_k = {low_sd:g} (all equal)"
    )
    return RewardModel(f"Normal(μ_k, σ_k²), {spread}", draw, bernoulli=False)


REWARD_MODELS = (
    beta_bernoulli(2, 2),
    beta_bernoulli(0.5, 0.5),
    beta_bernoulli(0.25, 1.0),  # sparse success: most thoughts rarely succeed
    gaussian(0.1, 1.0),
    gaussian(0.5, 0.5),
)


@dataclass(frozen=True)
class Ratio:
    """adaptive / uniform of two paired means, with a 95 % delta-method interval."""

    value: float
    low: float
    high: float

    def text(self) -> str:
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}]"


def paired_ratio(adaptive: torch.Tensor, uniform: torch.Tensor) -> Ratio:
    """Ratio of means over paired draws ``[S]``; standard error from ``adaptive − r·uniform``."""
    ratio = (adaptive.mean() / uniform.mean()).item()
    stderr = ((adaptive - ratio * uniform).std() / (math.sqrt(len(uniform)) * uniform.mean())).item()
    return Ratio(ratio, ratio - 1.96 * stderr, ratio + 1.96 * stderr)


@dataclass(frozen=True)
class AllocationComparison:
    """Ratios to the uniform arm, given the thoughts, of Σ_k Var(A_k), Σ_k Var(V̂_k) and Σ_k MSE(V̂_k) for the
    adaptive arm (spreads estimated) and the oracle arm (true σ_k), and the adaptive arm's mean min / max M_k."""

    advantage_variance: Ratio
    oracle_advantage_variance: Ratio
    value_variance: Ratio
    oracle_value_variance: Ratio
    value_mse: Ratio
    fewest: float
    most: float


def compare_allocation(
    model: RewardModel,
    *,
    thoughts: int,
    budget: int,
    first: int,
    max_per_thought: int,
    sets: int,
    replicates: int,
    gen: torch.Generator,
    prior_dof: float = 2.0,
) -> AllocationComparison:
    """Uniform ``budget / K`` answers per thought vs ``first`` then Neyman on estimated spreads vs Neyman on the
    true spreads (same bounds), on the same answer draws."""
    if budget % thoughts:
        raise ValueError(f"budget {budget} is not a multiple of K = {thoughts} (the uniform arm)")
    mean, sd = model.draw_thoughts(sets, thoughts, gen)

    def replicated(values: torch.Tensor) -> torch.Tensor:
        return values.unsqueeze(1).expand(-1, replicates, -1).reshape(-1, thoughts)

    # [S·R, K, max]: answers are iid, so an arm with M_k answers uses the first M_k of them
    flat = model.answers(replicated(mean), replicated(sd), max_per_thought, gen)
    bounds = dict(budget=budget, min_per_thought=first, max_per_thought=max_per_thought)
    counts = {
        "uniform": torch.full((sets * replicates, thoughts), budget // thoughts),
        "adaptive": neyman_allocation(flat[..., :first], prior_dof=prior_dof, **bounds),
        "oracle": allocate_answers(replicated(sd) ** 2, **bounds),
    }
    two_phase = TwoPhaseValues.for_budget(first, budget, thoughts)
    value_var, adv_var, mse = {}, {}, {}
    for arm, arm_counts in counts.items():
        mask = torch.arange(max_per_thought) < arm_counts.unsqueeze(-1)
        # the adaptive arm's counts depend on its first answers: its values are the unbiased two-phase ones
        if arm == "adaptive":
            flat_values = two_phase.values(flat, mask)
        else:
            flat_values = thought_values(flat.where(mask, torch.nan))
        advantages = grpo_ma_advantages(flat, answer_mask=mask, values=flat_values)[0]
        advantages = advantages.reshape(sets, replicates, thoughts)
        values = flat_values.reshape(sets, replicates, thoughts)
        value_var[arm] = replicate_variance(values).sum(dim=-1)
        adv_var[arm] = replicate_variance(advantages).sum(dim=-1)
        mse[arm] = ((values - mean.unsqueeze(1)) ** 2).mean(dim=1).sum(dim=-1)
    adaptive = counts["adaptive"].double()
    return AllocationComparison(
        paired_ratio(adv_var["adaptive"], adv_var["uniform"]),
        paired_ratio(adv_var["oracle"], adv_var["uniform"]),
        paired_ratio(value_var["adaptive"], value_var["uniform"]),
        paired_ratio(value_var["oracle"], value_var["uniform"]),
        paired_ratio(mse["adaptive"], mse["uniform"]),
        adaptive.amin(dim=-1).mean().item(),
        adaptive.amax(dim=-1).mean().item(),
    )


def print_variance_tables(
    thoughts_grid: Sequence[int],
    answers_grid: Sequence[int],
    sets: int,
    replicates: int,
    a: float,
    b: float,
    gen,
) -> None:
    """Sections 1 and 2 of the module docstring."""
    columns = " | ".join(f"{'K=' + str(k):>16}" for k in thoughts_grid)
    conditional: dict[tuple[int, int], ConditionalResult] = {}
    print("(1a) CONDITIONAL on the K thoughts (the paper's answer-sampling variance): Var(A_k | p_1..p_K)")
    print(f"{'M':>3} | {columns} | limit K->inf")
    for answers in answers_grid:
        cells = []
        for thoughts in thoughts_grid:
            result = conditional_variance(thoughts, answers, sets, replicates, a, b, gen)
            conditional[thoughts, answers] = result
            cells.append(estimate(result.variance).text())
        limit = conditional[thoughts_grid[-1], answers].limit.mean().item()
        print(f"{answers:>3} | " + " | ".join(f"{c:>16}" for c in cells) + f" | {limit:12.4f}")

    print("\n(1b) THOUGHT-RESAMPLED (other K-1 thoughts redrawn with the answers): Var(A_k | p_k)")
    print(f"{'M':>3} | {columns} | limit K->inf")
    for answers in answers_grid:
        cells, limit = [], math.nan
        for thoughts in thoughts_grid:
            variance, limits = thought_resampled_variance(thoughts, answers, sets, replicates, a, b, gen)
            cells.append(estimate(variance).text())
            limit = limits.mean().item()
        print(f"{answers:>3} | " + " | ".join(f"{c:>16}" for c in cells) + f" | {limit:12.4f}")

    print(
        "\n(2) Logged plug-in variance/thought_adv_estimate: its expectation E[plug-in] at K, the exact"
        "\n    conditional variance at K (1a), the large-K limit, and the plug-in's bias against each"
    )
    print(
        f"{'K':>3} {'M':>3} | {'E[plug-in]':>16} | {'exact at K':>16} | {'limit':>7} | bias vs exact | vs limit"
    )
    for thoughts in thoughts_grid:
        for answers in answers_grid:
            result = conditional[thoughts, answers]
            if result.plugin is None:
                continue
            plugin, exact, limit = (
                estimate(result.plugin),
                estimate(result.variance),
                result.limit.mean().item(),
            )
            print(
                f"{thoughts:>3} {answers:>3} | {plugin.text():>16} | {exact.text():>16} | {limit:7.4f} | "
                f"{plugin.mean / exact.mean - 1:+12.1%} | {plugin.mean / limit - 1:+7.1%}"
            )


def print_allocation_table(
    setting: AllocationSetting, sets: int, replicates: int, prior_dof: float, gen: torch.Generator
) -> None:
    """Section 3 of the module docstring."""
    thoughts, budget, first, max_per_thought = setting
    print(
        f"\n(3) Adaptive ({first} first answers, then Neyman on the extra ones, {first + 1}..{max_per_thought} "
        "per thought, two-phase values) vs uniform "
        f"({budget // thoughts} each): K = {thoughts}, {budget} answers per prompt; ratio adaptive/uniform "
        "[95 % interval], conditional on the thoughts"
    )
    names = ("Var(A) adaptive", "Var(A) oracle", "Var(V) adaptive", "Var(V) oracle", "MSE(V) adaptive")
    print(f"{'reward model':<46} | " + " | ".join(f"{n:>21}" for n in names) + " | M_k min..max")
    for model in REWARD_MODELS:
        result = compare_allocation(
            model,
            thoughts=thoughts,
            budget=budget,
            first=first,
            max_per_thought=max_per_thought,
            sets=sets,
            replicates=replicates,
            gen=gen,
            prior_dof=prior_dof,
        )
        ratios = (
            result.advantage_variance,
            result.oracle_advantage_variance,
            result.value_variance,
            result.oracle_value_variance,
            result.value_mse,
        )
        print(
            f"{model.name:<46} | "
            + " | ".join(f"{r.text():>21}" for r in ratios)
            + f" | {result.fewest:.1f}..{result.most:.1f}"
        )
    print(
        "Sums over the K thoughts; A: thought advantage, V: thought value (the mean of its answers; adaptive: the"
        "\nunbiased w·first mean + (1 − w)·extra mean); oracle: Neyman on the true σ_k with the plain mean (the gain"
        "\navailable), adaptive: on σ_k shrunk from the first answers (the gain realised)."
    )


#: (K, M) of the crossover arms: 16 answers per prompt each
CROSSOVER_ARMS = ((16, 1), (8, 2), (4, 4))
CROSSOVER_FLIPS = tuple(round(0.05 * i, 2) for i in range(10))


@dataclass(frozen=True)
class CrossoverPoint:
    """One arm at one flip probability: the conditional variance, the signal, the noise, and S²/N per thought
    and per prompt."""

    thoughts: int
    answers: int
    flip: float
    conditional: float
    signal: float
    noise: float

    @property
    def per_thought(self) -> float:
        return self.signal**2 / self.noise if self.noise > 0 else math.inf

    @property
    def per_prompt(self) -> float:
        return self.thoughts * self.per_thought


def crossover_point(
    thoughts: int,
    answers: int,
    flip: float,
    accuracy: float,
    sets: int,
    replicates: int,
    gen: torch.Generator,
) -> CrossoverPoint:
    """The flipped copy-the-thought model of section 4 for one arm and flip probability."""
    correct = (torch.rand(sets, thoughts, generator=gen, dtype=torch.float64) < accuracy).double()
    value = correct * (1 - flip) + (1 - correct) * flip
    repeated = value.unsqueeze(1).expand(-1, replicates, -1)
    thought_adv = grpo_ma_advantages(
        bernoulli_answers(repeated, answers, gen).reshape(-1, thoughts, answers)
    )[0]
    thought_adv = thought_adv.reshape(sets, replicates, thoughts)
    conditional = replicate_variance(thought_adv).mean().item()
    right = correct.unsqueeze(1).expand_as(thought_adv).bool()
    signal = (thought_adv[right].mean() - thought_adv[~right].mean()).item()
    share = right.double().mean().item()
    noise = share * thought_adv[right].var().item() + (1 - share) * thought_adv[~right].var().item()
    return CrossoverPoint(thoughts, answers, flip, conditional, signal, noise)


def crossover_curve(
    accuracy: float,
    sets: int,
    replicates: int,
    gen: torch.Generator,
    flips: Sequence[float] = CROSSOVER_FLIPS,
) -> list[CrossoverPoint]:
    return [
        crossover_point(k, m, flip, accuracy, sets, replicates, gen)
        for flip in flips
        for k, m in CROSSOVER_ARMS
    ]


def predicted_crossover(points: Sequence[CrossoverPoint], per: str = "prompt") -> float | None:
    """The smallest flip probability at which T4A4's S²/N (``per`` prompt or thought) reaches T16A1's (linear
    interpolation between grid points), or None where it never does on the grid."""

    def snr(point: CrossoverPoint) -> float:
        return point.per_prompt if per == "prompt" else point.per_thought

    ratio = {
        p.flip: snr(p)
        / next(snr(q) for q in points if q.flip == p.flip and (q.thoughts, q.answers) == (16, 1))
        for p in points
        if (p.thoughts, p.answers) == (4, 4)
    }
    flips = sorted(ratio)
    for low, high in zip(flips, flips[1:]):
        if ratio[low] < 1 <= ratio[high]:
            return low + (1 - ratio[low]) / (ratio[high] - ratio[low]) * (high - low)
    return flips[0] if flips and ratio[flips[0]] >= 1 else None


def print_crossover(accuracy: float, sets: int, replicates: int, gen: torch.Generator) -> float | None:
    points = crossover_curve(accuracy, sets, replicates, gen)
    print(
        f"(4) CROSSOVER: thoughts right with probability {accuracy:g}, the answer copies the thought's result, "
        "each answer's reward flipped with probability p\n"
        "    cond: Var(A_k | thoughts) (the paper's); S = E[A|right] - E[A|wrong]; N = Var(A | right or wrong);"
        " S2/N per thought, K*S2/N per prompt"
    )
    print(f"{'p':>5} | " + " | ".join(f"{f'T{k}A{m}: cond  S2/N  K*S2/N':>30}" for k, m in CROSSOVER_ARMS))
    for flip in CROSSOVER_FLIPS:
        row = [p for p in points if p.flip == flip]
        cells = [f"{p.conditional:7.3f} {p.per_thought:6.2f} {p.per_prompt:8.2f}" for p in row]
        print(f"{flip:>5.2f} | " + " | ".join(f"{c:>30}" for c in cells))
    for per in ("thought", "prompt"):
        star = predicted_crossover(points, per)
        print(
            f"p* (T4A4's per-{per} S2/N reaches T16A1's): "
            + (f"{star:.2f}" if star is not None else f"none for p <= {CROSSOVER_FLIPS[-1]:g}")
        )
    return predicted_crossover(points)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="K in (4, 16), M in (4, 16), fewer draws (tests)"
    )
    parser.add_argument("--a", type=float, default=2.0)
    parser.add_argument("--b", type=float, default=2.0)
    parser.add_argument("--sets", type=int, default=256, help="draws of the thoughts (or tagged thoughts)")
    parser.add_argument("--replicates", type=int, default=128, help="answer replicates per draw")
    parser.add_argument("--prior-dof", type=float, default=2.0, help="shrinkage ν of the adaptive arm")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--crossover", action="store_true", help="only section 4, the crossover prediction")
    parser.add_argument(
        "--accuracy", type=float, default=0.55, help="section 4: share of thoughts that are right"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(args.seed)
    if args.crossover:
        print_crossover(args.accuracy, 4 * args.sets, args.replicates // 4 or 1, gen)
        return
    thoughts_grid, answers_grid, sets = (
        ((4, 16), (4, 16), args.sets // 2) if args.quick else (THOUGHTS, ANSWERS, args.sets)
    )
    tau2, sigma_bar2 = beta_moments(args.a, args.b)
    start = time.perf_counter()
    print(
        f"Beta({args.a:g}, {args.b:g}) thought values: tau^2 = {tau2:.4f}, mean sigma^2 = {sigma_bar2:.4f}; "
        f"{sets} draws x {args.replicates} answer replicates; Monte-Carlo mean ± standard error\n"
    )
    print_variance_tables(thoughts_grid, answers_grid, sets, args.replicates, args.a, args.b, gen)
    for setting in ALLOCATION_SETTINGS:
        print_allocation_table(setting, 2 * sets, args.replicates, args.prior_dof, gen)
    print(f"({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
