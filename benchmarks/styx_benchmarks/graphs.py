"""Benchmark apps built from tables of functions, so a test can build a variant with a few replaced.

The TPC-C and DeathStar apps describe each operator as a table ``function name -> (function,
read-only)``; :func:`build_graph` turns the tables into a :class:`~styx_py.Graph`. Their functions name
the operators they call by string, never by ``Operator`` object, so one set of functions serves every
graph built from the tables: the product's and the deliberately broken variants under ``tests/apps``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from styx_py import Graph, Operator
from styx_py.core.operator import UserFunction

FunctionTable = Mapping[str, tuple[UserFunction, bool]]
"""An operator's functions: name -> (function, read-only)."""

Overrides = Mapping[tuple[str, str], UserFunction]
"""Replacement functions by (operator, function name)."""


def build_graph(
    name: str, operators: Iterable[tuple[str, int, FunctionTable]], overrides: Overrides | None = None
) -> Graph:
    """The graph of ``(operator name, partitions, functions)``; ``overrides`` replaces functions by
    (operator, function) and must name only functions the tables define."""
    remaining = dict(overrides or {})
    built: list[Operator] = []
    for op_name, partitions, functions in operators:
        op = Operator(op_name, partitions=partitions)
        for fname, (fn, read_only) in functions.items():
            op.function(remaining.pop((op_name, fname), fn), name=fname, read_only=read_only)
        built.append(op)
    if remaining:
        raise ValueError(f"overrides of unknown functions: {sorted(remaining)}")
    return Graph(name, built)
