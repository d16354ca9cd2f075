"""``vlm-grpoma make-data``: shapes through the real CLI, argument checks, a missing sapien source."""

from __future__ import annotations

import sys

from vlm_grpoma.cli import main as cli_main
from vlm_grpoma.datasets.jsonl import read_records


def test_make_data_shapes_writes_records_and_reports(tmp_path, capsys):
    out = tmp_path / "data"
    rc = cli_main(
        [
            "make-data",
            "--task",
            "trajectory",
            "--source",
            "shapes",
            "--n",
            "5",
            "--out",
            str(out),
            "--seed",
            "4",
            "--split",
            "val",
        ]
    )
    assert rc == 0
    records = read_records(out / "records.jsonl")
    assert [r.split for r in records] == ["val"] * 5 and {r.task for r in records} == {"trajectory"}
    assert len(list((out / "images").glob("*.png"))) == 5
    printed = capsys.readouterr().out
    assert f"wrote 5 trajectory records (shapes, seed 4) to {out / 'records.jsonl'}" in printed
    assert "splits: val=5; ground truth: Trajectory=5" in printed


def test_make_data_refuses_bad_arguments(tmp_path, capsys):
    base = ["make-data", "--source", "shapes", "--out", str(tmp_path / "x")]
    assert cli_main([*base, "--task", "detection", "--n", "0"]) == 1
    assert "--n must be a positive number of records, got 0" in capsys.readouterr().err
    assert cli_main([*base, "--task", "detection", "--n", "2", "--seed", "-1"]) == 1
    assert "--seed must be >= 0" in capsys.readouterr().err
    assert cli_main([*base, "--task", "manipulation", "--n", "2"]) == 1
    assert "use --source sapien for manipulation" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert (
        cli_main(
            [
                "make-data",
                "--source",
                "shapes",
                "--task",
                "detection",
                "--n",
                "1",
                "--out",
                str(tmp_path / "file"),
            ]
        )
        == 1
    )
    assert "exists and is not a folder" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_missing_sapien_source_is_one_clear_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "vlm_grpoma.datasets.synthetic.sapien", None)  # import now fails
    rc = cli_main(
        [
            "make-data",
            "--task",
            "manipulation",
            "--source",
            "sapien",
            "--n",
            "2",
            "--out",
            str(tmp_path / "m"),
        ]
    )
    assert rc == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("vlm-grpoma make-data: error: the sapien source is not available")
    assert len(err.splitlines()) == 1
