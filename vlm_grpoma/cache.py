"""Where the suite keeps what it fetches or builds once: Qwen's BPE ranks, Mesa lavapipe, tokenizers, JIT ops.

``$VLM_GRPOMA_CACHE`` if set (the Makefile sets it to the checkout's ``.cache``); else the ``.cache`` folder
next to the active virtual environment when there is one (a checkout's ``.venv`` finds the checkout's cache
without the Makefile); else ``$XDG_CACHE_HOME/vlm-grpoma`` (``~/.cache/vlm-grpoma``) for installed wheels.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def cache_dir() -> Path:
    """The cache folder (not created here)."""
    if os.environ.get("VLM_GRPOMA_CACHE"):
        return Path(os.environ["VLM_GRPOMA_CACHE"])
    if sys.prefix != sys.base_prefix:
        beside_venv = Path(sys.prefix).resolve().parent / ".cache"
        if beside_venv.is_dir():
            return beside_venv
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vlm-grpoma"
