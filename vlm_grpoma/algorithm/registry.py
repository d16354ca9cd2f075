"""Named variants of the objective's pieces (aggregations, KL estimators, importance levels, rollout corrections,
thought weightings): a new variant is one function registered under its config name.

The config (layer 0, no torch) lists the same names as ``Literal`` choices; ``tests/algorithm`` checks that each
``Literal`` equals its registry's names, so a variant registered here and not offered there (or the reverse)
fails the suite.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """Functions of one kind by name (as verl's ``register_policy_loss``)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator: ``@AGGREGATIONS.register("token_mean")``."""

        def add(function: F) -> F:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = function
            return function

        return add

    def __getitem__(self, name: str) -> F:
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; choose from {', '.join(self.names())}") from None

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)
