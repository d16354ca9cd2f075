"""Load a record's image (RGB, EXIF orientation applied) or mask, with errors naming the record and path.

Records store width/height of the image as displayed, i.e. after EXIF orientation; a photo whose stored
pixels are landscape but whose orientation tag says "rotate 90°" is portrait here, and so are its boxes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from vlm_grpoma.datasets.schema import MaskRef, Record
from vlm_grpoma.errors import DataError

#: EXIF orientations (tag 0x0112) that swap width and height.
_TRANSPOSING_ORIENTATIONS = {5, 6, 7, 8}
_ORIENTATION_TAG = 0x0112


class ImageLoadError(DataError):
    """An image or mask that is missing, unreadable, or not the size its record says."""


def _describe(path: str | Path, record_id: str | None) -> str:
    return (f"record {record_id}: " if record_id else "") + f"{path}"


def _open(path: str | Path, record_id: str | None, what: str) -> Image.Image:
    """The decoded image with EXIF orientation applied; any failure becomes ImageLoadError."""
    try:
        with Image.open(path) as img:
            img.load()
            return ImageOps.exif_transpose(img)
    except FileNotFoundError:
        raise ImageLoadError(f"{_describe(path, record_id)}: {what} file not found") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise ImageLoadError(f"{_describe(path, record_id)}: cannot decode {what}: {err}") from None


def _check_size(size: tuple[int, int], record: Record, path: str | Path, what: str) -> None:
    if size != (record.width, record.height):
        raise ImageLoadError(
            f"{_describe(path, record.id)}: {what} is {size[0]}x{size[1]} (after EXIF "
            f"orientation) but the record says {record.width}x{record.height}"
        )


def load_image(record_or_path: Record | str | Path, record_id: str | None = None) -> Image.Image:
    """An RGB image with EXIF orientation applied; for a Record its size must match width/height."""
    record = record_or_path if isinstance(record_or_path, Record) else None
    path = record.image if record else record_or_path
    rid = record.id if record else record_id
    img = _open(path, rid, "image").convert("RGB")
    if record is not None:
        _check_size(img.size, record, path, "image")
    return img


def image_size(path: str | Path, record_id: str | None = None) -> tuple[int, int]:
    """(width, height) after EXIF orientation, read from the header without decoding the pixels."""
    try:
        with Image.open(path) as img:
            width, height = img.size
            orientation = img.getexif().get(_ORIENTATION_TAG, 1)
    except FileNotFoundError:
        raise ImageLoadError(f"{_describe(path, record_id)}: image file not found") from None
    except (OSError, SyntaxError, ValueError) as err:
        raise ImageLoadError(f"{_describe(path, record_id)}: cannot read image header: {err}") from None
    return (height, width) if orientation in _TRANSPOSING_ORIENTATIONS else (width, height)


def check_image(record: Record) -> None:
    """Raise ImageLoadError unless the record's image exists and has the record's width/height (cheap)."""
    _check_size(image_size(record.image, record.id), record, record.image, "image")


def load_mask(record_or_path: Record | str | Path, record_id: str | None = None) -> np.ndarray:
    """A boolean [height, width] mask: True where any colour channel (or palette index) is non-zero.

    For a Record the mask path is its ``MaskRef`` ground truth and the size must match width/height.
    """
    record = record_or_path if isinstance(record_or_path, Record) else None
    if record is not None:
        if not isinstance(record.ground_truth, MaskRef):
            raise ImageLoadError(f"record {record.id}: ground truth is not a mask")
        path: str | Path = record.ground_truth.path
    else:
        path = record_or_path  # type: ignore[assignment]
    rid = record.id if record else record_id
    img = _open(path, rid, "mask")
    if record is not None:
        _check_size(img.size, record, path, "mask")
    array = np.asarray(img)
    if img.mode in ("RGBA", "LA"):  # the alpha channel is opacity, not the region
        array = array[..., :-1]
    return array.any(axis=2) if array.ndim == 3 else array != 0


__all__ = ["ImageLoadError", "check_image", "image_size", "load_image", "load_mask"]
