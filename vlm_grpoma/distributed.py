"""The process group and what every layer needs to know about it: rank info, free ports, importing DeepSpeed.

Used alike by the trainer, the rollout backends (a colocated vLLM joins the trainer's group) and tools that
only need a port number, so nothing here imports torch or DeepSpeed until a function needs it.
"""

from __future__ import annotations

import atexit
import fcntl
import functools
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


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


#: A JIT build's ``lock`` that no process here holds, in an op folder unchanged for this many seconds, was left
#: by a builder that died (killed mid-build): it is removed before DeepSpeed builds there.
JIT_LOCK_STALE_S = 180.0
#: About how long the first build of each op takes on 2 CPU cores (measured), for the notice before it.
_BUILD_SECONDS = {"deepspeed_shm_comm": 35, "cpu_adam": 50, "fused_adam": 50}
_GUARDED = "_vlm_grpoma_guarded"


def jit_ops_tag() -> str:
    """The ops folder's name for this torch and Python (``torch-2.14.1-py311``): environments with other
    versions build into their own folder instead of rebuilding each other's ops on every switch."""
    from importlib.metadata import version

    return f"torch-{version('torch')}-py{sys.version_info.major}{sys.version_info.minor}"


def torch_extensions_dir() -> str:
    """Where DeepSpeed's JIT-built ops go: ``<root>/<torch-version tag>``, the root being a user's
    ``TORCH_EXTENSIONS_DIR``, else the suite's cache (a shared default lock under ``~/.cache/torch_extensions``
    can stall a build until a timeout). Already-tagged (a child of a prepared process) stays as it is."""
    from vlm_grpoma.cache import cache_dir

    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or cache_dir() / "torch_extensions")
    tag = jit_ops_tag()
    return str(root if root.name == tag else root / tag)


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


def _torch_waits_for_lock_file() -> bool:
    """torch < 2.14.1 (``FileBaton``) waits for a build's lock file to disappear, however long; later torch
    holds an OS lock that the kernel drops when its holder dies, so a leftover file stalls nothing."""
    import torch.utils.cpp_extension as cpp_extension

    return "FileBaton" in vars(cpp_extension)


def _held(lock: Path) -> bool:
    """Whether a live process holds ``lock``: an OS lock on it (torch >= 2.14.1), or, as far as ``/proc``
    shows, the file open (torch's ``FileBaton`` keeps it open while it builds)."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    target = os.path.realpath(lock)
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd_link) == target for fd_link in fd_dir.iterdir()):
                return True
        except OSError:  # the process ended meanwhile, or is another user's
            continue
    return False


def _last_change(folder: Path) -> float:
    """The newest modification time in ``folder`` (a live build writes its objects and logs there)."""
    times = [folder.stat().st_mtime]
    for entry in folder.iterdir():
        try:
            times.append(entry.lstat().st_mtime)
        except FileNotFoundError:
            continue
    return max(times)


def release_stale_jit_lock(build_dir: Path, stale_s: float = JIT_LOCK_STALE_S, poll_s: float = 1.0) -> None:
    """Before DeepSpeed builds an op in ``build_dir``: remove its ``lock`` with a warning naming the file when
    no live process holds it and the folder has not changed for ``stale_s`` (a builder killed mid-build).

    Only torch < 2.14.1 needs this (it waits for the file to disappear, forever); later torch holds an OS lock
    and leaves the file after every build. A held lock is a live build: torch waits for it, as it should; a
    young unheld one is waited out here (printing why) until it is stale or gone.
    """
    if not _torch_waits_for_lock_file():
        return  # torch >= 2.14.1 leaves its lock file after every build, harmlessly
    lock = build_dir / "lock"
    said = False
    while lock.exists() and not _held(lock):
        quiet = time.time() - _last_change(build_dir)
        if quiet >= stale_s:
            lock.unlink(missing_ok=True)
            log.warning(
                "removed the stale JIT build lock %s: no live process holds it and %s has not changed for "
                "%.0f s (a build killed midway); building again",
                lock,
                build_dir,
                quiet,
            )
            return
        if not said:
            print(
                f"{lock}: held by no live process; waiting up to {stale_s - quiet:.0f} s for it to go stale "
                "before removing it",
                file=sys.stderr,
                flush=True,
            )
            said = True
        time.sleep(min(poll_s, stale_s - quiet))


def before_jit_build(op_name: str) -> None:
    """What runs before DeepSpeed JIT-loads ``op_name``: a stale lock removed, and a one-line notice when the
    op has not been built in this environment yet."""
    build_dir = Path(torch_extensions_dir()) / op_name
    if build_dir.is_dir():
        release_stale_jit_lock(build_dir)
    if not (build_dir / f"{op_name}.so").is_file() and os.environ.get("LOCAL_RANK", "0") == "0":
        seconds = _BUILD_SECONDS.get(op_name, 60)
        print(
            f"building DeepSpeed's {op_name} op (first run in this environment, about {seconds} s on 2 CPU "
            f"cores) in {build_dir}",
            file=sys.stderr,
            flush=True,
        )


def _guard_jit_builds(deepspeed: Any) -> None:
    """Route DeepSpeed's JIT op loading (``OpBuilder.jit_load``, used by every op it builds on first use)
    through :func:`before_jit_build`, once per process."""
    from deepspeed.ops.op_builder.builder import OpBuilder

    original = OpBuilder.jit_load
    if getattr(original, _GUARDED, False):
        return

    @functools.wraps(original)
    def jit_load(self: Any, verbose: bool = True) -> Any:
        before_jit_build(self.name)
        return original(self, verbose)

    setattr(jit_load, _GUARDED, True)
    OpBuilder.jit_load = jit_load


def import_deepspeed() -> Any:
    """Import DeepSpeed: CPU accelerator without CUDA, JIT builds prepared by :func:`prepare_jit_builds` and
    guarded by :func:`before_jit_build`."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    prepare_jit_builds()
    import deepspeed

    _guard_jit_builds(deepspeed)
    return deepspeed


#: DeepSpeed's CPU communication op (csrc/cpu/comm/shm.cpp): each rank's all-reduce workspace in /dev/shm
SHM_BUFFER = "deepspeed_allreduce_buffer_{uid}_{addr}_{port}_{rank}"
SHM_DIR = Path("/dev/shm")


def release_shm_buffer() -> Path | None:
    """Unlink this rank's shared-memory all-reduce workspace once every rank has mapped it.

    DeepSpeed's CPU op creates one ~69 MB segment per rank when all ranks are on one node and never unlinks it,
    so every run (and every killed one) left its segments in /dev/shm until the machine ran out of memory. The
    op maps its peers' segments inside ``init_distributed``; after a barrier every rank holds its mappings, and
    an unlinked segment lives as long as they do. Returns the path removed, if this rank had one."""
    import torch

    path = SHM_DIR / SHM_BUFFER.format(
        uid=os.getuid(),
        addr=os.environ.get("MASTER_ADDR", ""),
        port=os.environ.get("MASTER_PORT", ""),
        rank=torch.distributed.get_rank(),
    )
    if torch.distributed.get_world_size() > 1:  # every rank, with a segment or not: no rank waits alone
        torch.distributed.barrier()
    if not path.exists():  # several nodes, or no CPU op: nothing was created
        return None
    path.unlink(missing_ok=True)
    return path


def leave_process_group() -> None:
    """Destroy this process's group before the interpreter finalizes (registered at exit): left to static
    destructors, gloo's threads were sometimes destroyed while joinable and the rank aborted after its work
    was done ("terminate called without an active exception", exit 250/-6; seen after ZeRO-3 runs)."""
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


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
        atexit.register(leave_process_group)
        if not use_cuda:  # DeepSpeed's CPU op; the same on every rank of a job
            release_shm_buffer()
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    return DistInfo(torch.distributed.get_rank(), torch.distributed.get_world_size(), local_rank, device)
