"""A deployable application: a named set of operators, validated before it reaches a worker."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping, Sequence
from types import CodeType
from typing import Any

import msgspec

from styx_py.core.effectids import SYSTEM_OPERATORS
from styx_py.core.effects import MAX_PENDING_PER_PARTITION, effect_operators
from styx_py.core.errors import GraphError
from styx_py.core.operator import Operator, UserFunction
from styx_py.core.scan import SCAN_OP


class OperatorSpec(msgspec.Struct, frozen=True):
    """What clients and the coordinator need to know of an operator (no code)."""

    name: str
    partitions: int
    functions: list[str]
    state_function: str | None = None  # what ``GET /v1/state`` runs (see Operator.state_reader)


class GraphVersion(msgspec.Struct, array_like=True, frozen=True):
    """One deployed version of a cluster's graph: version ``number`` (1 for the first deploy) runs
    every epoch from ``first_epoch`` until the next version's first epoch (a code update takes effect
    at an epoch boundary on every worker at once)."""

    number: int
    import_path: str
    first_epoch: int


def version_at(versions: Sequence[GraphVersion], epoch: int) -> GraphVersion:
    """The version that runs (or ran) ``epoch``; ``versions`` in deploy order, never empty."""
    assert versions, "no graph deployed"
    current = versions[0]
    for v in versions:
        if v.first_epoch <= epoch:
            current = v
    return current


class Graph:
    """``Graph(name, operators)``: the unit of deployment.

    Validation happens here, at construction (deploy) time: duplicate operator names, bad partition
    counts and references from a function to an operator object that is not part of the graph are
    clear :class:`GraphError` s instead of failures in the middle of a transaction.
    """

    def __init__(
        self,
        name: str,
        operators: Iterable[Operator],
        *,
        services: Mapping[str, Any] | None = None,
        effects: bool | None = None,
        max_pending_per_partition: int = MAX_PENDING_PER_PARTITION,
    ) -> None:
        """``services``: the external services its functions call (``ctx.call_external``), by name,
        each a :data:`styx_py.core.effects.Service`. ``effects``: whether the graph gets the system
        operators of external calls and timers (``styx.outbox``, ``styx.timers``); by default when it
        names services or a function calls ``call_external``, ``call_later`` or ``cancel_timer``.
        ``max_pending_per_partition``: the external calls pending (and, apart, the timers) one partition
        holds at most; a transaction that asks for more aborts with ``PendingLimit`` (docs/effects.md).
        Part of the code, not of a process's configuration, so every worker and every replay apply the
        same bound."""
        if not name or not isinstance(name, str):
            raise GraphError("graph name must be a non-empty string")
        self.name = name
        self.operators: dict[str, Operator] = {}
        self.services: dict[str, Any] = dict(services or {})
        for op in operators:
            if not isinstance(op, Operator):
                raise GraphError(f"graph {name!r}: {op!r} is not an Operator")
            if op.name in self.operators:
                raise GraphError(f"graph {name!r}: duplicate operator name {op.name!r}")
            if op.name in SYSTEM_OPERATORS or op.name == SCAN_OP:
                raise GraphError(f"graph {name!r}: operator name {op.name!r} is reserved")
            self.operators[op.name] = op
        if not self.operators:
            raise GraphError(f"graph {name!r} has no operators")
        for sname, service in self.services.items():
            if not isinstance(sname, str) or not callable(service):
                raise GraphError(f"graph {name!r}: service {sname!r} must be named by a str and callable")
        if effects is None:
            effects = bool(self.services) or any(
                _uses_effects(fn.__code__)
                for op in self.operators.values()
                for fn in op.functions.values()
                if hasattr(fn, "__code__")
            )
        self.effects = effects
        if not isinstance(max_pending_per_partition, int) or max_pending_per_partition < 1:
            raise GraphError(f"graph {name!r}: max_pending_per_partition must be an int >= 1")
        self.max_pending_per_partition = max_pending_per_partition
        if effects:
            partitions = max(op.partitions for op in self.operators.values())
            for op in effect_operators(partitions, max_pending_per_partition):
                self.operators[op.name] = op
        for op in self.operators.values():
            if not op.functions:
                raise GraphError(f"operator {op.name!r} has no functions")
            for fname, fn in op.functions.items():
                self._check_targets(op, fname, fn)

    def _check_targets(self, op: Operator, fname: str, fn: UserFunction) -> None:
        """Every Operator object a function refers to by global name must belong to this graph."""
        code = getattr(fn, "__code__", None)
        env = getattr(fn, "__globals__", {})
        if code is None:
            return
        for ref in code.co_names:
            target = env.get(ref)
            if isinstance(target, Operator) and self.operators.get(target.name) is not target:
                raise GraphError(
                    f"{op.name}.{fname} calls operator {target.name!r}, "
                    f"which is not part of graph {self.name!r}"
                )

    @property
    def n_partitions(self) -> int:
        """Ingress/placement partitions: operator partition ``p`` of every operator maps to ``p``."""
        return max(op.partitions for op in self.operators.values())

    def function(self, operator: str, function: str) -> UserFunction | None:
        op = self.operators.get(operator)
        return None if op is None else op.functions.get(function)

    def specs(self) -> list[OperatorSpec]:
        return [
            OperatorSpec(op.name, op.partitions, sorted(op.functions), op.state_reader())
            for op in self.operators.values()
        ]


_EFFECT_METHODS = frozenset({"call_external", "call_later", "cancel_timer"})


def _uses_effects(code: CodeType) -> bool:
    """Whether ``code`` (or a function nested in it) names one of the Context's effect methods."""
    if _EFFECT_METHODS.intersection(code.co_names):
        return True
    return any(isinstance(c, CodeType) and _uses_effects(c) for c in code.co_consts)


def load_graph(import_path: str) -> Graph:
    """Import ``pkg.module:attr`` and return the Graph it names.

    Code travels by import path, never by pickle.
    """
    module_name, sep, attr = import_path.partition(":")
    if not sep or not module_name or not attr:
        raise GraphError(f"expected 'package.module:graph', got {import_path!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise GraphError(f"cannot import {module_name!r}: {exc}") from exc
    except Exception as exc:
        raise GraphError(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
    if not hasattr(module, attr):
        raise GraphError(f"module {module_name!r} has no attribute {attr!r}")
    graph = getattr(module, attr)
    if not isinstance(graph, Graph):
        raise GraphError(f"{import_path!r} is not a styx_py.Graph (got {type(graph).__name__})")
    return graph


def check_update(running: Sequence[OperatorSpec], new: Graph, n_partitions: int) -> None:
    """Raise :class:`GraphError` unless ``new`` can replace the running graph at an epoch barrier.

    Keys live on the partition their operator's partition count sends them to, so an update keeps
    every partition count: moving keys between partitions is a migration, not a code update. A new
    operator may have at most ``n_partitions`` (what the topics have). Removing an operator is
    refused: its state would stay in the store, unreachable, and come back if a later version added
    the operator again (an operator without state may simply keep its functions).
    """
    for spec in running:
        op = new.operators.get(spec.name)
        if op is None:
            raise GraphError(
                f"graph {new.name!r} removes operator {spec.name!r}: an update cannot drop an "
                "operator and its state (keep the operator; its functions may change)"
            )
        if op.partitions != spec.partitions:
            raise GraphError(
                f"operator {spec.name!r} has {spec.partitions} partitions and graph {new.name!r} gives it "
                f"{op.partitions}: changing an operator's partition count moves its keys between "
                "partitions, which is not a code update"
            )
    if new.n_partitions > n_partitions:
        raise GraphError(
            f"graph {new.name!r} needs {new.n_partitions} partitions and the cluster's topics have "
            f"{n_partitions}: a code update cannot add partitions"
        )
