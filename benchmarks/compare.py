"""GRPO-MA vs GRPO end to end on CPU: T4A1, T16A1, T4A4, T8A2 x 3 seeds on shapes detection and SAPIEN
manipulation from one SFT warm start per task; writes docs/results.md and its plots.

    python benchmarks/compare.py            # full: <= 60 min on 2 cores
    python benchmarks/compare.py --quick    # <= 10 min, 1 seed, short runs (checks the pipeline, not the method)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the comparison package lives next to this script

from comparison.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
