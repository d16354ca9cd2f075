"""Commands that write a folder check it before their work (issue 36, L20): an output that is a file, under a
file, on a read-only file system or without free space is one line naming ``--out``, and nothing was built."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fault_runs import error_lines

from vlm_grpoma import cli
from vlm_grpoma.errors import StorageError
from vlm_grpoma.output_folder import writable_folder

#: Each command, its arguments before ``--out``, and the function doing its work (it must not run).
COMMANDS = {
    "make-data": (
        ["--source", "shapes", "--task", "detection", "--n", "2"],
        "vlm_grpoma.datasets.synthetic.shapes.generate_shapes",
    ),
    "make-tiny-model": (["--arch", "qwen2_vl"], "vlm_grpoma.models.tiny.build_tiny_model"),
    "make-assets": (["--per-category", "1"], "vlm_grpoma.envs.sapien.partnet_export.generate_assets"),
}
READ_ONLY = Path("/sys/fs")  # sysfs: not writable, even for root


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_unwritable_out_is_one_line_before_the_work(tmp_path, monkeypatch, capsys, command):
    arguments, work = COMMANDS[command]
    monkeypatch.setattr(work, lambda *a, **k: pytest.fail(f"{command} started its work"))
    (tmp_path / "file").write_text("x")
    cases = {
        tmp_path / "file": f"--out {tmp_path / 'file'}: exists and is not a folder",
        tmp_path
        / "file"
        / "under": f"--out {tmp_path / 'file' / 'under'}: cannot write there (Not a directory)",
        READ_ONLY / "vlm-grpoma": f"--out {READ_ONLY / 'vlm-grpoma'}: cannot write there (",
        READ_ONLY: f"--out {READ_ONLY}: cannot write there (",
    }
    for out, message in cases.items():
        assert cli.main([command, *arguments, "--out", str(out)]) == 1
        [line] = error_lines(capsys.readouterr().err)
        assert line.startswith(f"vlm-grpoma {command}: error: {message}"), line
    assert (tmp_path / "file").read_text() == "x"


def test_a_folder_without_the_free_space_floor_is_refused(tmp_path):
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    assert writable_folder(tmp_path / "new", "--out") == tmp_path / "new" and (tmp_path / "new").is_dir()
    assert list((tmp_path / "new").iterdir()) == []  # the probe file is gone
    with pytest.raises(StorageError, match=rf"^--out {tmp_path}: only \d+ bytes free, need at least"):
        writable_folder(tmp_path, "--out", min_free_bytes=free + (1 << 40))
