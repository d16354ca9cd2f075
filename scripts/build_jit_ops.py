"""Build DeepSpeed's CPU communication op once, before a parallel test run starts (``make test``).

Every CPU DeepSpeed process loads ``deepspeed_shm_comm``; the first one builds it (~35-100 s). Built here, the
test workers and their ranks find it ready instead of one of them building it while the others wait on its
lock. Already built: returns at once, without importing torch's build machinery or DeepSpeed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

OP = "deepspeed_shm_comm"


def main() -> int:
    from vlm_grpoma.distributed import import_deepspeed, torch_extensions_dir

    built = Path(torch_extensions_dir()) / OP / f"{OP}.so"
    if built.is_file():
        return 0
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import_deepspeed()
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    ShareMemCommBuilder().load()
    return 0


if __name__ == "__main__":
    sys.exit(main())
