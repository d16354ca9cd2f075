"""Image and mask loading: EXIF orientation, size checks, missing and corrupt files."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from vlm_grpoma.answers import Box, Boxes
from vlm_grpoma.datasets.images import ImageLoadError, image_problems, image_size, load_image, load_mask
from vlm_grpoma.datasets.schema import MaskRef, Record

RED, BLUE = (255, 0, 0), (0, 0, 255)


def _record(path, width, height, rid="img-1", gt=None):
    return Record(
        rid,
        str(path),
        "detection" if gt is None else "affordance",
        "p",
        width,
        height,
        gt or Boxes((Box(0, 0, 1, 1),)),
    )


@pytest.fixture
def rotated_jpeg(tmp_path):
    """Stored 40x20: left half red, right half blue; EXIF orientation 6 = display rotated 90° clockwise."""
    img = Image.new("RGB", (40, 20), BLUE)
    img.paste(RED, (0, 0, 20, 20))
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / "photo.jpg"
    img.save(path, "JPEG", quality=95, exif=exif)
    return path


def test_exif_orientation_is_applied(rotated_jpeg):
    img = load_image(rotated_jpeg)
    assert img.mode == "RGB" and img.size == (20, 40)
    pixels = np.asarray(img).astype(int)
    # rotating clockwise puts the stored left (red) half on top
    assert np.abs(pixels[5, 10] - RED).max() < 20
    assert np.abs(pixels[35, 10] - BLUE).max() < 20
    assert image_size(rotated_jpeg) == (20, 40)  # header-only read agrees


def test_record_size_is_checked_after_orientation(rotated_jpeg):
    assert load_image(_record(rotated_jpeg, 20, 40)).size == (20, 40)
    assert image_problems([_record(rotated_jpeg, 20, 40)]) == {}
    with pytest.raises(
        ImageLoadError,
        match=r"record img-1: .*photo\.jpg: image is 20x40 \(after EXIF "
        r"orientation\) but the record says 40x20",
    ):
        load_image(_record(rotated_jpeg, 40, 20))
    assert "but the record says 40x20" in image_problems([_record(rotated_jpeg, 40, 20)])[0]


def test_greyscale_and_palette_images_come_back_rgb(tmp_path):
    path = tmp_path / "p.png"
    Image.new("P", (8, 6), 0).save(path)
    assert load_image(path).mode == "RGB"


def test_missing_image_names_record_and_path(tmp_path):
    with pytest.raises(ImageLoadError, match=r"record img-9: .*gone\.png: image file not found"):
        load_image(_record(tmp_path / "gone.png", 10, 10, rid="img-9"))
    with pytest.raises(ImageLoadError, match=r"record r2: .*gone\.png: image file not found"):
        load_image(tmp_path / "gone.png", record_id="r2")
    with pytest.raises(ImageLoadError, match="image file not found"):
        image_size(tmp_path / "gone.png")


def test_corrupt_and_truncated_images_raise_clear_errors(tmp_path):
    garbage = tmp_path / "garbage.png"
    garbage.write_bytes(b"this is not an image at all")
    with pytest.raises(ImageLoadError, match=r"record c1: .*garbage\.png: cannot decode image"):
        load_image(_record(garbage, 10, 10, rid="c1"))
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buf, "PNG")
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    with pytest.raises(ImageLoadError, match=r"truncated\.png: cannot decode image"):
        load_image(truncated, record_id="c2")


def test_mask_nonzero_is_inside_and_alpha_is_ignored(tmp_path):
    rgba = np.zeros((6, 8, 4), np.uint8)
    rgba[..., 3] = 255  # fully opaque everywhere: must not count as inside
    rgba[2:4, 1:3, 0] = 1  # a dark but non-zero red
    path = tmp_path / "m.png"
    Image.fromarray(rgba, "RGBA").save(path)
    expected = np.zeros((6, 8), bool)
    expected[2:4, 1:3] = True
    np.testing.assert_array_equal(load_mask(path), expected)
    record = _record(tmp_path / "img.png", 8, 6, gt=MaskRef(str(path)))
    np.testing.assert_array_equal(load_mask(record), expected)
    with pytest.raises(ImageLoadError, match=r"record img-1: .*m\.png: mask is 8x6 .* record says 9x6"):
        load_mask(_record(tmp_path / "img.png", 9, 6, gt=MaskRef(str(path))))
    with pytest.raises(ImageLoadError, match="ground truth is not a mask"):
        load_mask(_record(tmp_path / "img.png", 8, 6))


def test_palette_mask_uses_indices(tmp_path):
    pal = Image.new("P", (5, 5), 0)
    pal.putpalette([200, 200, 200, 0, 0, 0] + [0] * 762)  # index 0 is drawn light grey, index 1 black
    pal.putpixel((2, 3), 1)
    path = tmp_path / "pal.png"
    pal.save(path)
    mask = load_mask(path)
    assert mask.sum() == 1 and mask[3, 2]
