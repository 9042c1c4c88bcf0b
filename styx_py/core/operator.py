"""Operators: named, hash-partitioned sets of keyed entities with the functions that act on them."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

from styx_py.core.errors import GraphError
from styx_py.core.limits import MAX_PARTITIONS

UserFunction = Callable[..., Awaitable[Any]]
F = TypeVar("F", bound=UserFunction)


class Operator:
    """A named operator with ``partitions`` hash partitions.

    Functions are registered with the ``@operator.function`` decorator; each takes a
    :class:`~styx_py.core.context.Context` first and runs on the entity ``(operator, ctx.key)``.
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
        self.state_function: str | None = None  # declared with ``@op.function(state=True)``

    @overload
    def function(
        self, fn: F, *, name: str | None = None, read_only: bool = False, state: bool = False
    ) -> F: ...

    @overload
    def function(
        self, fn: None = None, *, name: str | None = None, read_only: bool = False, state: bool = False
    ) -> Callable[[F], F]: ...

    def function(
        self, fn: F | None = None, *, name: str | None = None, read_only: bool = False, state: bool = False
    ) -> Any:
        """Register ``fn`` as a function of this operator (usable bare or with arguments).

        ``state=True`` declares it the function that returns an entity's state (read-only, no
        arguments): what the HTTP gateway's ``GET /v1/state/{operator}/{key}`` runs."""

        def register(f: F) -> F:
            fname = name or f.__name__
            candidate: Any = f
            if not inspect.iscoroutinefunction(candidate):
                raise GraphError(f"{self.name}.{fname} must be an 'async def' function")
            if fname in self.functions:
                raise GraphError(f"{self.name}.{fname} is registered twice")
            if state and (self.state_function is not None or bind_error(f, []) is not None):
                raise GraphError(
                    f"{self.name}.{fname}: a state function takes no arguments, one per operator"
                )
            self.functions[fname] = f
            if read_only or state:
                self.read_only.add(fname)
            if state:
                self.state_function = fname
            return f

        return register(fn) if fn is not None else register

    def state_reader(self) -> str | None:
        """The function that returns an entity's state: the declared one, else the only read-only
        function that takes no arguments (None when there is no such function, or several)."""
        if self.state_function is not None:
            return self.state_function
        readers = [f for f in sorted(self.read_only) if bind_error(self.functions[f], []) is None]
        return readers[0] if len(readers) == 1 else None

    def __repr__(self) -> str:
        return f"Operator({self.name!r}, partitions={self.partitions})"


def operator_name(target: Operator | str) -> str:
    return target.name if isinstance(target, Operator) else target


__all__ = ["Operator", "UserFunction", "bind_error", "operator_name"]


_arity: dict[Any, tuple[int, int]] = {}


def _positional_arity(fn: Any) -> tuple[int, int]:
    """(min, max) positional arguments after ``ctx``; max is huge with ``*args``."""
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())[1:]
    if any(p.kind in (p.KEYWORD_ONLY,) and p.default is p.empty for p in params):
        return (1 << 30, 0)  # required keyword-only arguments cannot be passed by a call
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(p.default is p.empty for p in positional)
    variadic = any(p.kind == p.VAR_POSITIONAL for p in params)
    return required, (1 << 30) if variadic else len(positional)


def bind_error(fn: Any, args: list[Any]) -> str | None:
    """Why ``fn(ctx, *args)`` cannot be called, or None. Cheap: the arity is computed once per function."""
    arity = _arity.get(fn)
    if arity is None:
        arity = _arity[fn] = _positional_arity(fn)
    if arity[0] <= len(args) <= arity[1]:
        return None
    try:
        inspect.signature(fn).bind(None, *args)
    except TypeError as exc:
        return f"wrong arguments for {fn.__name__}: {exc}"
    return f"wrong arguments for {fn.__name__}"
