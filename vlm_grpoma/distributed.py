"""The process group and what every layer needs to know about it: rank info, free ports, importing DeepSpeed.

Used alike by the trainer, the rollout backends (a colocated vLLM joins the trainer's group) and tools that
only need a port number, so nothing here imports torch or DeepSpeed until a function needs it.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the job: global rank, world size, rank on its node, and its device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def free_port() -> int:
    """A TCP port that is free right now on localhost."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torch_extensions_dir() -> str:
    """Where DeepSpeed's JIT-built ops go: a user's ``TORCH_EXTENSIONS_DIR``, else the suite's cache (a shared
    default lock under ``~/.cache/torch_extensions`` can stall a build until a timeout)."""
    from vlm_grpoma.cache import cache_dir

    return os.environ.get("TORCH_EXTENSIONS_DIR") or str(cache_dir() / "torch_extensions")


def prepare_jit_builds() -> None:
    """Set this process's environment for DeepSpeed's JIT builds: the ops folder, and the ``ninja`` that pip
    installed with DeepSpeed first on PATH, as an activated venv would have it. torch runs whatever ``ninja``
    is on PATH (none at all without activation on a machine lacking a system one), and two ninja versions
    (a system 1.11, pip's 1.13) record build commands differently, so processes finding different ones
    rebuild each other's ops on every switch."""
    os.environ["TORCH_EXTENSIONS_DIR"] = torch_extensions_dir()
    try:
        import ninja
    except ImportError:
        return
    path = os.environ.get("PATH", "")
    if ninja.BIN_DIR and path.split(os.pathsep)[0] != ninja.BIN_DIR:
        os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, path]) if path else ninja.BIN_DIR


def import_deepspeed() -> Any:
    """Import DeepSpeed: CPU accelerator without CUDA, JIT builds prepared by :func:`prepare_jit_builds`."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    prepare_jit_builds()
    import deepspeed

    return deepspeed


def init_distributed(backend: str = "auto", timeout_s: float | None = None) -> DistInfo:
    """Join (or create) the process group: under the ``deepspeed`` launcher, or as a lone process.

    A lone process gets ``RANK=0 WORLD_SIZE=1 LOCAL_RANK=0`` and a free ``MASTER_PORT``; without them
    DeepSpeed falls back to MPI discovery and fails. ``backend="auto"``: NCCL with CUDA, else gloo.
    ``timeout_s`` bounds the rendezvous and every collective (``train.dist_timeout_s``; None: DeepSpeed's
    30 minutes). Idempotent: the first call's settings stay.
    """
    import torch

    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    deepspeed = import_deepspeed()
    use_cuda = torch.cuda.is_available()
    if backend == "auto":
        backend = "nccl" if use_cuda else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
    if not torch.distributed.is_initialized():
        extra = {}
        if timeout_s is not None:
            extra["timeout"] = timedelta(seconds=timeout_s)
            # Groups made later (DeepSpeed's data-parallel groups, ZeRO's) call new_group() without a timeout,
            # which takes torch's module default (30 min gloo, 10 min NCCL), not the world group's: set both.
            from torch.distributed import distributed_c10d

            distributed_c10d.default_pg_timeout = distributed_c10d.default_pg_nccl_timeout = extra["timeout"]
        deepspeed.init_distributed(dist_backend=backend, **extra)
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    return DistInfo(torch.distributed.get_rank(), torch.distributed.get_world_size(), local_rank, device)
