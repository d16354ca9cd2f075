"""PNG overlays of one prediction against its ground truth: boxes, points, tinted masks and polylines.

The image is scaled up by an integer factor so that its longer side reaches :data:`MIN_SIDE` pixels (small
synthetic images stay legible), and a caption strip of :data:`CAPTION_HEIGHT` pixels is added below it.
Ground truth is drawn in green, the prediction in red; a failed answer shows its parse reason in the caption.
A record with several images is drawn on its target image; the others follow in a column on the right, each
scaled into :data:`THUMB_SIDE` pixels under its ``Picture n`` label.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont
from scipy.ndimage import binary_erosion

from vlm_grpoma.answers import Answer, Boxes, Points, Trajectory
from vlm_grpoma.datasets.schema import GroundTruth

MIN_SIDE = 384
CAPTION_HEIGHT = 34
GT_COLOUR = (0, 190, 0)
PRED_COLOUR = (235, 20, 20)
MASK_ALPHA = 0.45
_FONT_SIZE = 12
THUMB_SIDE = 128
THUMB_GAP = 6


def overlay_scale(width: int, height: int) -> int:
    """Integer upscaling factor of an overlay (1 for images whose longer side is already >= MIN_SIDE)."""
    return max(1, math.ceil(MIN_SIDE / max(width, height)))


def overlay_size(width: int, height: int) -> tuple[int, int]:
    """(width, height) of the overlay PNG for an image of the given size."""
    s = overlay_scale(width, height)
    return width * s, height * s + CAPTION_HEIGHT


def _tint(image: Image.Image, mask: np.ndarray, scale: int, colour: tuple[int, int, int]) -> Image.Image:
    """Upscale ``image`` by ``scale``, blend ``colour`` into the region ``mask`` [H, W] and outline it."""
    big_image = image.resize((image.width * scale, image.height * scale), Image.NEAREST)
    rgb = np.asarray(big_image, dtype=np.float32).copy()
    big = np.repeat(np.repeat(mask, scale, axis=0), scale, axis=1)
    rgb[big] = (1 - MASK_ALPHA) * rgb[big] + MASK_ALPHA * np.asarray(colour, dtype=np.float32)
    rgb[big & ~binary_erosion(big, iterations=2, border_value=0)] = colour
    return Image.fromarray(rgb.round().astype(np.uint8), "RGB")


def _draw_answer(
    draw: ImageDraw.ImageDraw,
    answer: Answer | GroundTruth,
    scale: int,
    colour: tuple[int, int, int],
    font: ImageFont.ImageFont,
    ground_truth: bool,
) -> None:
    """Boxes as rectangles (with labels), points as crosses (ground truth) or discs, polylines as lines."""
    r = max(3, 2 * scale)
    if isinstance(answer, Boxes):
        for b in answer.boxes:
            xy = [b.x1 * scale, b.y1 * scale, b.x2 * scale, b.y2 * scale]
            draw.rectangle(xy, outline=colour, width=2 if ground_truth else 3)
            if b.label:
                draw.text((xy[0] + 2, xy[1] + 1), b.label[:24], fill=colour, font=font)
    elif isinstance(answer, Points):
        for x, y in answer.points:
            x, y = x * scale, y * scale
            if ground_truth:
                draw.line([x - r, y - r, x + r, y + r], fill=colour, width=2)
                draw.line([x - r, y + r, x + r, y - r], fill=colour, width=2)
            else:
                draw.ellipse([x - r, y - r, x + r, y + r], outline=(255, 255, 255), fill=colour, width=1)
    elif isinstance(answer, Trajectory):
        pts = [(x * scale, y * scale) for x, y in answer.points]
        draw.line(pts, fill=colour, width=3 if ground_truth else 2, joint="curve")
        (x0, y0), (x1, y1) = pts[0], pts[-1]
        draw.ellipse([x0 - r, y0 - r, x0 + r, y0 + r], outline=colour, width=2)  # start: ring
        draw.ellipse([x1 - r, y1 - r, x1 + r, y1 + r], fill=colour)  # end: disc


def draw_overlay(
    image: Image.Image,
    ground_truth: GroundTruth,
    answer: Answer | None,
    caption: str,
    mask: np.ndarray | None = None,
    failed: bool = False,
    others: Sequence[tuple[str, Image.Image]] = (),
) -> Image.Image:
    """The overlay of one prediction: ``mask`` (the ground-truth region, [H, W] bool) is tinted and outlined,
    ``answer`` None (a failed parse) draws only the ground truth. ``caption`` may hold two lines. ``others``:
    the record's other images with their labels, shown as thumbnails beside the target."""
    scale = overlay_scale(*image.size)
    base = image.convert("RGB")
    if mask is not None:
        base = _tint(base, mask, scale, GT_COLOUR)
    else:
        base = base.resize((base.width * scale, base.height * scale), Image.NEAREST)
    canvas = Image.new("RGB", overlay_size(*image.size), (255, 255, 255))
    canvas.paste(base, (0, 0))
    draw = ImageDraw.Draw(canvas)
    font = ImageFont.load_default(size=_FONT_SIZE)
    _draw_answer(draw, ground_truth, scale, GT_COLOUR, font, ground_truth=True)
    if answer is not None:
        _draw_answer(draw, answer, scale, PRED_COLOUR, font, ground_truth=False)
    for i, line in enumerate(caption.splitlines()[:2]):
        while line and draw.textlength(line, font=font) > canvas.width - 8:
            line = line[:-2] + "…"
        colour = PRED_COLOUR if failed else (0, 0, 0)
        draw.text((4, base.height + 3 + i * (_FONT_SIZE + 3)), line, fill=colour, font=font)
    return _with_thumbnails(canvas, others, font) if others else canvas


def _with_thumbnails(
    canvas: Image.Image, others: Sequence[tuple[str, Image.Image]], font: ImageFont.ImageFont
) -> Image.Image:
    """``canvas`` with a column of labelled thumbnails on its right."""
    slot = _FONT_SIZE + 4 + THUMB_SIDE + THUMB_GAP
    out = Image.new(
        "RGB",
        (canvas.width + THUMB_SIDE + 2 * THUMB_GAP, max(canvas.height, THUMB_GAP + slot * len(others))),
        (255, 255, 255),
    )
    out.paste(canvas, (0, 0))
    draw = ImageDraw.Draw(out)
    left = canvas.width + THUMB_GAP
    for i, (label, image) in enumerate(others):
        top = THUMB_GAP + i * slot
        draw.text((left, top), label, fill=(0, 0, 0), font=font)
        thumb = image.convert("RGB")
        thumb.thumbnail((THUMB_SIDE, THUMB_SIDE))
        out.paste(thumb, (left, top + _FONT_SIZE + 4))
    return out


def save_overlay(overlay: Image.Image, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    overlay.save(path, format="PNG")
    return path
