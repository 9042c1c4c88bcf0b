"""Operators: named, hash-partitioned sets of keyed entities with the functions that act on them."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

from styx_py.errors import GraphError
from styx_py.limits import MAX_PARTITIONS

if TYPE_CHECKING:
    from styx_py.context import Context

UserFunction = Callable[..., Awaitable[Any]]
F = TypeVar("F", bound=UserFunction)


class Operator:
    """A named operator with ``partitions`` hash partitions.

    Functions are registered with the ``@operator.function`` decorator; each takes a
    :class:`~styx_py.context.Context` first and runs on the entity ``(operator, ctx.key)``.
    """

    def __init__(self, name: str, partitions: int = 4) -> None:
        if not name or not isinstance(name, str):
            raise GraphError("operator name must be a non-empty string")
        if (
            not isinstance(partitions, int)
            or isinstance(partitions, bool)
            or not 1 <= partitions <= MAX_PARTITIONS
        ):
            raise GraphError(
                f"operator {name!r}: partitions must be an int in 1..{MAX_PARTITIONS}, got {partitions!r}"
            )
        self.name = name
        self.partitions = partitions
        self.functions: dict[str, UserFunction] = {}
        self.read_only: set[str] = set()

    @overload
    def function(self, fn: F, *, name: str | None = None, read_only: bool = False) -> F: ...

    @overload
    def function(
        self, fn: None = None, *, name: str | None = None, read_only: bool = False
    ) -> Callable[[F], F]: ...

    def function(self, fn: F | None = None, *, name: str | None = None, read_only: bool = False) -> Any:
        """Register ``fn`` as a function of this operator (usable bare or with arguments)."""

        def register(f: F) -> F:
            fname = name or f.__name__
            candidate: Any = f
            if not inspect.iscoroutinefunction(candidate):
                raise GraphError(f"{self.name}.{fname} must be an 'async def' function")
            if fname in self.functions:
                raise GraphError(f"{self.name}.{fname} is registered twice")
            self.functions[fname] = f
            if read_only:
                self.read_only.add(fname)
            return f

        return register(fn) if fn is not None else register

    def __repr__(self) -> str:
        return f"Operator({self.name!r}, partitions={self.partitions})"


def operator_name(target: Operator | str) -> str:
    return target.name if isinstance(target, Operator) else target


__all__ = ["Context", "Operator", "UserFunction", "operator_name"]
