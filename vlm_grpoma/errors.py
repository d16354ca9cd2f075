"""The suite's domain errors: what library code raises when the user's input, files or machine are at fault.

Every error here carries a one-line message that names the key, record, file or option at fault. Library
code raises them and never exits; the entry point (``vlm_grpoma.cli.main``) is the only place that turns a
:class:`UserError` into one printed line and exit code 1. Anything else that escapes is a bug in the suite
and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Base class: a problem the user can fix from the message alone (printed as one line, exit code 1)."""


class ConfigError(UserError, ValueError):
    """A configuration problem; the message starts with the dotted key (``rollout.num_thoughts: ...``)."""


class DataError(UserError, ValueError):
    """Bad input data: a records file, an image, a mask or a dataset in a public format."""


class CheckpointError(UserError):
    """A checkpoint that cannot be resumed from or loaded: missing, incomplete, damaged or untrusted."""


class MissingDependencyError(UserError, ImportError):
    """An optional part (vLLM, SAPIEN rendering, a CUDA device) that the command needs is not available."""


class StorageError(UserError, OSError):
    """The output location cannot be written: disk full, read-only, or already used by another job."""


class DistributedError(UserError):
    """Another rank stopped answering inside a collective (hung past ``train.dist_timeout_s``, or died).

    The process group is unusable afterwards, so the entry point exits without tearing it down.
    """


class CommandError(UserError):
    """Bad command-line input that fits none of the kinds above (e.g. ``--episodes 0``)."""


class RolloutServerError(UserError):
    """A rollout server (``rollout.backend=vllm_server``) unreachable, silent past ``rollout.server.timeout_s``,
    or refusing a request; the message names its URL."""
