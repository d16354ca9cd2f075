"""Evaluation reports: Markdown tables and image grids with predicted points and outcomes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw


def success_table(result: dict) -> str:
    """Markdown table of a manipulation result: one row per category, then the split's aggregate."""
    lines = [
        f"## manip-eval: policy {result['policy']}, split {result['split']}, seed {result['seed']}",
        "",
        "| category | episodes | successes | success rate |",
        "|---|---:|---:|---:|",
    ]
    for name, row in result["per_category"].items():
        lines.append(
            f"| {name} | {row['episodes']} | {row['successes']} | {100 * row['success_rate']:.1f} % |"
        )
    agg = result["aggregate"]
    lines.append(
        f"| **{result['split']} (sample-weighted)** | {agg['episodes']} | {agg['successes']} | "
        f"**{100 * agg['success_rate']:.1f} %** |"
    )
    if result.get("failures"):
        lines += [
            "",
            "Failure reasons: " + ", ".join(f"{k} {v}" for k, v in sorted(result["failures"].items())),
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
