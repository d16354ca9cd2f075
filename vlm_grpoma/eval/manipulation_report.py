"""Manipulation evaluation reports: success tables with 95 % Wilson score intervals, and contact image grids."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

Z_95 = 1.959963984540054  # the standard normal's 97.5 % quantile
INTERVAL = "95 % Wilson score interval"


def wilson_interval(successes: int, episodes: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (no continuity correction); (0, 1) without episodes.
    Unlike the normal approximation it stays inside [0, 1] and is not empty at 0 % or 100 %."""
    if episodes <= 0:
        return 0.0, 1.0
    p = successes / episodes
    centre = (p + z * z / (2 * episodes)) / (1 + z * z / episodes)
    half = z / (1 + z * z / episodes) * math.sqrt(p * (1 - p) / episodes + z * z / (4 * episodes * episodes))
    # at 0 % (100 %) the bound is exactly 0 (1); the formula leaves a rounding residue there
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == episodes else min(1.0, centre + half)
    return lo, hi


def rate_row(successes: int, episodes: int, on_part_successes: int, on_part_episodes: int) -> dict:
    """Counts, success rate and its interval, and the rate over answers whose contact hit a movable part."""
    lo, hi = wilson_interval(successes, episodes)
    return {
        "episodes": episodes,
        "successes": successes,
        "success_rate": successes / episodes if episodes else 0.0,
        "ci95": [lo, hi],
        "on_part_episodes": on_part_episodes,
        "on_part_success_rate": on_part_successes / on_part_episodes if on_part_episodes else 0.0,
    }


def _percent(row: dict) -> str:
    lo, hi = row["ci95"]
    return f"{100 * row['success_rate']:.1f} % ({100 * lo:.1f}–{100 * hi:.1f})"


def success_table(result: dict) -> str:
    """Markdown table of a manip-eval result: one row per category, then each split's sample-weighted
    aggregate (successes over all its episodes, as ManipLLM reports them)."""
    lines = [
        f"## manip-eval: policy {result['policy']}, protocol {result['protocol']}, seed {result['seed']}",
        "",
        f"Objects: {result['objects']}; split: {result['split_file']}. Success = over all episodes (a malformed "
        "or off-object answer fails), with its " + INTERVAL + "; on-part = over answers whose contact hit a "
        "movable part (ManipLLM's test script drops the others from its denominator).",
        "",
        "| split | category | episodes | successes | success (95 % CI) | on-part success |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, row in result["per_category"].items():
        lines.append(
            f"| {row['split']} | {name} | {row['episodes']} | {row['successes']} | {_percent(row)} | "
            f"{100 * row['on_part_success_rate']:.1f} % of {row['on_part_episodes']} |"
        )
    for split, agg in result["aggregates"].items():
        lines.append(
            f"| **{split}** | **sample-weighted, {agg['categories']} categories** | {agg['episodes']} | "
            f"{agg['successes']} | **{_percent(agg)}** | {100 * agg['on_part_success_rate']:.1f} % of "
            f"{agg['on_part_episodes']} |"
        )
    if result.get("failures"):
        lines += [
            "",
            "Failure reasons: " + ", ".join(f"{k} {v}" for k, v in sorted(result["failures"].items())),
        ]
    if any(result.get("dropped", {}).values()):
        dropped = ", ".join(f"{k} {v}" for k, v in result["dropped"].items() if v)
        lines += [
            "",
            f"Episodes dropped because no demonstration succeeded (as ManipLLM drops them): {dropped}",
        ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Tile:
    """One grid cell: an RGB image, the predicted pixel (or None), a caption and whether it succeeded."""

    image: np.ndarray
    point: tuple[float, float] | None
    caption: str
    success: bool


def contact_grid(tiles: Sequence[Tile], path: Path, columns: int = 4, size: int = 224) -> Path:
    """Save a PNG grid; each tile shows its predicted contact (green = success, red = failure)."""
    rows = max(1, -(-len(tiles) // columns))
    grid = Image.new("RGB", (columns * size, rows * (size + 16)), (255, 255, 255))
    for k, tile in enumerate(tiles):
        image = Image.fromarray(tile.image).convert("RGB")
        scale = size / max(image.size)
        image = image.resize((round(image.width * scale), round(image.height * scale)))
        draw = ImageDraw.Draw(image)
        colour = (0, 200, 0) if tile.success else (230, 0, 0)
        if tile.point is not None and all(np.isfinite(tile.point)):
            x, y = tile.point[0] * scale, tile.point[1] * scale
            draw.ellipse([x - 5, y - 5, x + 5, y + 5], outline=colour, width=3)
        x0, y0 = (k % columns) * size, (k // columns) * (size + 16)
        grid.paste(image, (x0, y0))
        ImageDraw.Draw(grid).text((x0 + 2, y0 + size + 2), tile.caption[:36], fill=colour)
    path.parent.mkdir(parents=True, exist_ok=True)
    grid.save(path)
    return path
