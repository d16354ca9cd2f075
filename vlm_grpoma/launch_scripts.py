"""``vlm-grpoma launch-scripts``: write the shipped launchers (train.sh, slurm.sbatch, hostfile.example) to a folder.

The scripts are package data (``vlm_grpoma/launch/``), so an installed wheel has the same launchers as a
checkout's ``launch/``; a cluster user copies them out once and edits the ``#SBATCH`` lines for their site.
"""

from __future__ import annotations

import argparse
import shutil
from importlib import resources
from pathlib import Path

from vlm_grpoma.errors import StorageError

SCRIPTS = ("train.sh", "slurm.sbatch", "hostfile.example")
EXECUTABLE = ("train.sh", "slurm.sbatch")


def write_launch_scripts(out: str | Path, *, force: bool = False) -> list[Path]:
    """Copy the launchers into ``out`` (created); refuse to overwrite an existing file unless ``force``."""
    out = Path(out)
    targets = [out / name for name in SCRIPTS]
    existing = [str(t) for t in targets if t.exists()]
    if existing and not force:
        raise StorageError(f"{', '.join(existing)} already exist(s); pass --force to overwrite")
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, target in zip(SCRIPTS, targets):
            with resources.as_file(resources.files("vlm_grpoma") / "launch" / name) as source:
                shutil.copyfile(source, target)
            target.chmod(0o755 if name in EXECUTABLE else 0o644)
    except OSError as err:
        raise StorageError(f"{out}: cannot write the launch scripts ({err})") from None
    return targets


def main(args: argparse.Namespace) -> int:
    for path in write_launch_scripts(args.out, force=args.force):
        print(path)
    return 0
