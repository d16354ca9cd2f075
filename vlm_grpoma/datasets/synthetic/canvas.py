"""Drawing the synthetic shapes scenes: objects drawn through their own binary masks (no anti-aliasing, so a
box is the exact extent of the drawn pixels), placed without overlap, on pale backgrounds.

Shape colours are saturated (one channel <= 50) and backgrounds pale (every channel >= 90), so no background
pixel has a shape's colour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageDraw

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 160, 50),
    "blue": (30, 70, 220),
    "yellow": (235, 200, 20),
    "orange": (245, 120, 20),
    "purple": (130, 40, 180),
    "cyan": (20, 180, 200),
    "pink": (230, 50, 160),
}
GAP = 3  # minimum empty pixels between two objects' boxes
ATTEMPTS = 200  # random placements tried per object (and scenes tried per record)


@dataclass(eq=False)  # identity: two objects can look the same
class DrawnObject:
    kind: str
    colour: str
    size: str  # "small" | "large" ("" in easy scenes, where size is never named)
    mask: np.ndarray  # bool [H, W], exactly the drawn pixels
    parts: dict[str, np.ndarray] = field(default_factory=dict)
    box: tuple[int, int, int, int] = field(init=False)

    def __post_init__(self) -> None:
        self.box = mask_box(self.mask)

    @property
    def name(self) -> str:
        return f"{self.colour} {self.kind}"

    def to_json(self) -> dict:
        return {"kind": self.kind, "colour": self.colour, "size": self.size, "box": list(self.box)}


def mask_box(mask: np.ndarray) -> tuple[int, int, int, int]:
    ys, xs = np.nonzero(mask)
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


def canvas_mask(shape: tuple[int, int], draw) -> np.ndarray:
    """Pixels set by ``draw(ImageDraw)`` on an empty (width, height) canvas, as a bool [H, W] array."""
    img = Image.new("L", shape, 0)
    draw(ImageDraw.Draw(img))
    return np.asarray(img) > 0


def _footprint(kind: str, s: int, variant: int) -> tuple[int, int]:
    """(w, h) of the rectangle an object of this kind/size/variant is drawn inside."""
    if kind == "rectangle":
        short = max(6, round(0.55 * s))
        return (s, short) if variant == 0 else (short, s)
    if kind == "mug":
        return round(0.6 * s) + round(0.28 * s), s
    if kind == "pan":
        return round(0.7 * s) + round(0.55 * s), round(0.7 * s)
    return s, s


def _draw_shape(canvas: tuple[int, int], kind: str, x0: int, y0: int, w: int, h: int) -> np.ndarray:
    x1, y1 = x0 + w - 1, y0 + h - 1  # inclusive corners, as PIL draws them
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    if kind in ("square", "rectangle"):
        return canvas_mask(canvas, lambda d: d.rectangle([x0, y0, x1, y1], fill=255))
    if kind == "circle":
        return canvas_mask(canvas, lambda d: d.ellipse([x0, y0, x1, y1], fill=255))
    if kind == "triangle":
        return canvas_mask(canvas, lambda d: d.polygon([(x0, y1), (x1, y1), (cx, y0)], fill=255))
    if kind == "diamond":
        return canvas_mask(canvas, lambda d: d.polygon([(cx, y0), (x1, cy), (cx, y1), (x0, cy)], fill=255))
    if kind == "hexagon":
        r = (w - 1) / 2
        pts = [(cx + r * math.cos(math.pi / 3 * i), cy + r * math.sin(math.pi / 3 * i)) for i in range(6)]
        return canvas_mask(canvas, lambda d: d.polygon(pts, fill=255))
    raise ValueError(f"unknown shape {kind!r}")


def _draw_tool(
    canvas: tuple[int, int], kind: str, x0: int, y0: int, s: int, flip: bool
) -> dict[str, np.ndarray]:
    """Part masks of a tool; the handle is on the right, or on the left when ``flip``."""
    w, h = _footprint(kind, s, 0)
    if kind == "mug":
        body_w, r = round(0.6 * s), round(0.28 * s)
        bx0 = x0 + r if flip else x0
        edge = bx0 if flip else bx0 + body_w - 1
        cy = y0 + (h - 1) // 2
        body = canvas_mask(canvas, lambda d: d.rectangle([bx0, y0, bx0 + body_w - 1, y0 + h - 1], fill=255))
        ring = canvas_mask(
            canvas,
            lambda d: d.ellipse([edge - r, cy - r, edge + r, cy + r], outline=255, width=max(2, s // 9)),
        )
        return {"body": body, "handle": ring & ~body}
    d_head = round(0.7 * s)
    hx0 = x0 + w - d_head if flip else x0
    head = canvas_mask(canvas, lambda d: d.ellipse([hx0, y0, hx0 + d_head - 1, y0 + d_head - 1], fill=255))
    t = max(3, s // 7)
    cy, hcx = y0 + (d_head - 1) // 2, hx0 + (d_head - 1) // 2
    sx0, sx1 = (x0, hcx) if flip else (hcx, x0 + w - 1)
    stick = canvas_mask(canvas, lambda d: d.rectangle([sx0, cy - t // 2, sx1, cy - t // 2 + t - 1], fill=255))
    return {"head": head, "handle": stick & ~head}


class Scene:
    """Objects placed without overlap on a W x H canvas, and off the ``keepout`` pixels (a path)."""

    def __init__(self, size: int):
        self.size = size
        self.objects: list[DrawnObject] = []
        self.keepout: np.ndarray | None = None

    def _free(self, x0: int, y0: int, w: int, h: int) -> bool:
        for o in self.objects:
            bx0, by0, bx1, by1 = o.box
            if x0 < bx1 + GAP and bx0 < x0 + w + GAP and y0 < by1 + GAP and by0 < y0 + h + GAP:
                return False
        if (
            self.keepout is not None
            and self.keepout[max(0, y0 - GAP) : y0 + h + GAP, max(0, x0 - GAP) : x0 + w + GAP].any()
        ):
            return False
        return 0 <= x0 and 0 <= y0 and x0 + w <= self.size and y0 + h <= self.size

    def _spot(
        self, rng: np.random.Generator, w: int, h: int, centre: tuple[float, float] | None
    ) -> tuple | None:
        for _ in range(ATTEMPTS if centre is None else 1):
            if centre is None:
                x0, y0 = int(rng.integers(0, self.size - w + 1)), int(rng.integers(0, self.size - h + 1))
            else:
                x0, y0 = round(centre[0] - w / 2), round(centre[1] - h / 2)
            if self._free(x0, y0, w, h):
                return x0, y0
        return None

    def add_shape(
        self, rng, kind: str, colour: str, size_cls: str, s: int, centre=None
    ) -> DrawnObject | None:
        w, h = _footprint(kind, s, int(rng.integers(2)))
        spot = self._spot(rng, w, h, centre)
        if spot is None:
            return None
        obj = DrawnObject(kind, colour, size_cls, _draw_shape((self.size, self.size), kind, *spot, w, h))
        self.objects.append(obj)
        return obj

    def add_tool(self, rng, kind: str, colour: str, s: int) -> DrawnObject | None:
        flip = bool(rng.integers(2))
        spot = self._spot(rng, *_footprint(kind, s, 0), None)
        if spot is None:
            return None
        parts = _draw_tool((self.size, self.size), kind, *spot, s, flip)
        obj = DrawnObject(kind, colour, "", np.logical_or.reduce(list(parts.values())), parts)
        self.objects.append(obj)
        return obj

    def render(self, rng: np.random.Generator, background: str) -> Image.Image:
        pixels = _background(rng, background, self.size)
        for o in self.objects:
            pixels[o.mask] = COLOURS[o.colour]
        return Image.fromarray(pixels, "RGB")


def _pale(rng: np.random.Generator) -> np.ndarray:
    grey = rng.integers(120, 221)
    return np.clip(grey + rng.integers(-15, 16, size=3), 105, 240).astype(np.float64)


def _background(rng: np.random.Generator, kind: str, size: int) -> np.ndarray:
    """A pale (every channel >= 90) uint8 [size, size, 3] background."""
    if kind == "solid":
        pixels = np.broadcast_to(_pale(rng), (size, size, 3)).copy()
    elif kind == "gradient":
        a, b, angle = _pale(rng), _pale(rng), rng.uniform(0, 2 * math.pi)
        yy, xx = np.mgrid[0:size, 0:size]
        t = xx * math.cos(angle) + yy * math.sin(angle)
        t = (t - t.min()) / max(t.max() - t.min(), 1e-9)
        pixels = a * (1 - t[..., None]) + b * t[..., None]
    elif kind == "noise":
        coarse = rng.uniform(-25, 25, size=(8, 8, 3))
        blobs = np.stack(
            [
                np.asarray(
                    Image.fromarray(coarse[..., c].astype(np.float32), "F").resize(
                        (size, size), Image.Resampling.BILINEAR
                    )
                )
                for c in range(3)
            ],
            -1,
        )
        pixels = _pale(rng) + blobs + rng.uniform(-8, 8, size=(size, size, 3))
    else:
        raise ValueError(f"unknown background {kind!r}")
    return np.clip(np.rint(pixels), 90, 255).astype(np.uint8)
