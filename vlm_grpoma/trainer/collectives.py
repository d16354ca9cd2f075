"""Collectives with a name: a rank that never joins one (hung) or vanishes from it (died) ends the job with one
line saying which collective waited, instead of a backend traceback or a silent 30-minute hang."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from vlm_grpoma.errors import DistributedError, UserError

#: How torch's backends word a collective that a peer never joined (timeout) or left (crash, kill).
_PEER_FAILURE = re.compile(
    r"timed out|timeout|connection (closed|reset) by peer|broken pipe|communicator was aborted", re.IGNORECASE
)
#: ... and how such an error shows it comes from a backend (not, say, a reward's own timeout).
_BACKEND = re.compile(r"gloo|nccl|c10d|ProcessGroup|watchdog", re.IGNORECASE)


def _is_peer_failure(err: RuntimeError) -> bool:
    text = str(err)
    from_backend = isinstance(err, torch.distributed.DistError) or _BACKEND.search(text)
    return bool(from_backend and _PEER_FAILURE.search(text))


@contextmanager
def collective(what: str, timeout_s: float | None = None) -> Iterator[None]:
    """Run the collective(s) inside; a peer failure becomes a DistributedError naming ``what``.

    ``what`` names the collective, e.g. "the gradient all-reduce of the optimizer step". Other errors pass.
    """
    try:
        yield
    except RuntimeError as err:
        if not torch.distributed.is_initialized() or not _is_peer_failure(err):
            raise
        limit = f" within train.dist_timeout_s={timeout_s:g} s" if timeout_s else ""
        cause = "hung or died" if "time" in str(err).lower() else "died"
        raise DistributedError(
            f"rank {torch.distributed.get_rank()}: no answer from the other ranks{limit} in {what}: "
            f"a rank {cause}; its own output says why"
        ) from None


def barrier(what: str, timeout_s: float | None = None) -> None:
    """Wait for every rank (nothing without a process group), ``what`` naming the wait if a rank never comes."""
    if torch.distributed.is_initialized():
        with collective(what, timeout_s):
            torch.distributed.barrier()


def raise_on_every_rank(error: UserError | None, what: str, timeout_s: float | None = None) -> None:
    """Every rank calls with the error it met (or None); if any rank met one, every rank raises the error of the
    lowest such rank, so that a problem found on one rank (a locked folder, a damaged file) ends all of them
    alike instead of leaving the others waiting in the next collective."""
    found = None if error is None else (type(error), str(error))
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        gathered: list = [None] * torch.distributed.get_world_size()
        with collective(what, timeout_s):
            torch.distributed.all_gather_object(gathered, found)
        found = next((item for item in gathered if item is not None), None)
    if found is not None:
        if error is not None and found == (type(error), str(error)):
            raise error
        kind, message = found
        raise kind(message)
