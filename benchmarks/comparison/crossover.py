"""The crossover plan's hypotheses (issue #52), written before any of its runs, and their rules.

The predictions come from ``benchmarks/variance.py --crossover`` (section 4: the answer copies its thought's
result, each answer's reward flipped with probability p; thoughts right with probability 0.55, the warm start's
held-out accuracy in the reasoning plan). Three readings of "the thought advantage gets better with M":

- *conditional variance* (the paper's, answer noise with the thoughts fixed): T4A4's is below T16A1's at every
  p > 0 (p = 0.2: 0.263 vs 0.605; p = 0.4: 0.638 vs 0.900); both are 0 at p = 0;
- *per-thought signal-to-noise* S²/N (S: how far the advantage separates right from wrong thoughts, N: its
  variance given rightness, over thoughts and answers both): T4A4's reaches T16A1's at p* = 0.09 (0.13 at
  accuracy 0.75);
- *per-prompt signal-to-noise* K·S²/N (K independent thoughts push one gradient): T16A1 ahead at every p <= 0.45,
  the gap closing (T4A4 / T16A1 = 0.05 at p = 0, 0.49 at 0.2, 0.72 at 0.4): no crossover.

Measured: the held-out accuracy (greedy, clean rewards) of every run when its 150 s of training end, and
Δ(p) = T4A4 − T16A1 paired by seed (same data order).
"""

from __future__ import annotations

#: written 2026-12-07, before any crossover run (git history: this file's first commit precedes the results)
HYPOTHESES = (
    (
        "H1",
        "Without noise (p = 0) M > 1 costs: Δ(0) < 0.",
        "The reasoning plan's T4A4 − T16A1 at equal time was −0.029 ± 0.016; every reading above ranks T16A1 "
        "first at p = 0.",
    ),
    (
        "H2",
        "Noise helps T4A4 relatively: the slope of Δ over p is > 0.",
        "All three readings move toward T4A4 as p grows.",
    ),
    (
        "H3",
        "A crossover within the grid: Δ(0.4) > 0.",
        "Predicted by the conditional variance and the per-thought S²/N (p* ≈ 0.09), not by the per-prompt S²/N "
        "(no crossover): the verdict says which reading predicts training.",
    ),
)
#: how each hypothesis is judged, fixed with them
RULES = (
    "Δ at one p: the mean over seeds of the paired per-seed differences, with a 95 % t-interval; 'greater "
    "than 0' when the interval lies above 0, 'less than 0' when below, otherwise inconclusive.",
    "The slope: least squares of the per-seed Δ on p over all finished pairs, with a 95 % t-interval "
    "(n − 2 degrees of freedom); 'positive' when the interval lies above 0.",
    "H1 holds when Δ(0) is less than 0, H2 when the slope is positive, H3 when Δ(0.4) is greater than 0; each "
    "is refuted when its interval lies on the other side, and inconclusive otherwise (or with fewer than 3 "
    "pairs).",
)
