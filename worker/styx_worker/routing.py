"""Where an entity lives and how a transaction's messages reach it.

:class:`RoutingTable` is the cluster view as routing needs it (pure): which worker owns which
partition, how many partitions each operator has, who the peers are. :class:`Router` delivers a
transaction's messages: an :class:`~styx_py.core.wire.Invoke` to the owner of its entity, a
:class:`~styx_py.core.wire.CallResult` to the caller's worker, an :class:`~styx_py.core.wire.Ack` to the
root's worker — handed straight to this worker's epoch driver when it is the destination, sent over
the transport otherwise.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from styx_py.core.graph import Graph
from styx_py.core.partitioning import Key, partition_of
from styx_py.core.ports import Transport
from styx_py.core.requests import request_problem
from styx_py.core.wire import (
    Ack,
    CallResult,
    ClusterView,
    ExecDone,
    Final,
    Invoke,
    Request,
    Revote,
    Status,
    Vote,
)
from styx_worker.ackshare import Share, to_wire


class RoutingTable:
    """Partition ownership of the current cluster view, as seen from ``node_id``."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.placement: list[str] = []  # partition index -> owning worker
        self.op_partitions: dict[str, int] = {}
        self.peers: list[str] = []  # every worker, sorted (this one included)

    def update(self, view: ClusterView) -> None:
        self.placement = view.placement
        self.op_partitions = {spec.name: spec.partitions for spec in view.operators}
        self.peers = sorted(w.node_id for w in view.workers)

    def know(self, graph: Graph) -> None:
        """Route to every operator of ``graph`` too: an epoch running a new graph version may call an
        operator it added before this worker saw the view that lists it (that view may have been lost;
        the update committed once every worker had prepared the version). An update never changes an
        existing operator's partition count nor removes one, so adding is all it takes."""
        for name, op in graph.operators.items():
            self.op_partitions.setdefault(name, op.partitions)

    def owner_of(self, operator: str, key: Key) -> str:
        return self.placement[partition_of(key, self.op_partitions[operator])]

    def owned(self) -> list[int]:
        """The partitions this worker owns."""
        return [p for p, owner in enumerate(self.placement) if owner == self.node_id]

    def misrouted(self, request: Request, partition: int, graph: Graph) -> str | None:
        """Why ``request`` (taken from ingress ``partition``) cannot run here, or None: a limit it
        breaks (:func:`~styx_py.core.requests.request_problem`, whatever produced the record), an
        operator the epoch's ``graph`` lacks, a key of another partition. A pure function of the
        request, the graph version and the view (a replay answers as the original run did)."""
        problem = request_problem(request)
        if problem is not None:
            return problem
        op = graph.operators.get(request.operator)
        if op is None:
            return f"unknown operator {request.operator!r}"
        partitions = op.partitions
        if partition_of(request.key, partitions) != partition:
            return f"request for key {request.key!r} arrived on ingress partition {partition}, not its own"
        return None


class LocalDelivery(Protocol):
    """The receiving end on this worker (the epoch driver)."""

    def on_invoke(self, inv: Invoke) -> None: ...

    def on_call_result(self, msg: CallResult) -> None: ...

    def on_ack(self, ack: Ack, root_value: msgspec.Raw | None) -> None: ...


class Router:
    def __init__(self, table: RoutingTable, transport: Transport, local: LocalDelivery) -> None:
        self.table = table
        self.node_id = table.node_id
        self.transport = transport
        self.local = local

    def dispatch(self, inv: Invoke) -> None:
        owner = self.table.owner_of(inv.operator, inv.key)
        if owner == self.node_id:
            self.local.on_invoke(inv)
        else:
            self.transport.send(owner, inv)

    def send_result(self, inv: Invoke, status: Status, value: msgspec.Raw) -> None:
        msg = CallResult(inv.epoch, inv.tid, inv.phase, inv.path, status, value, inv.gen)
        if inv.parent == self.node_id:
            self.local.on_call_result(msg)
        else:
            self.transport.send(inv.parent, msg)

    def send_ack(self, inv: Invoke, own: Share, status: Status, error: str, value: msgspec.Raw) -> None:
        ack = Ack(inv.epoch, inv.tid, inv.phase, *to_wire(own), status, error, inv.path, inv.gen)
        if inv.root == self.node_id:
            # The root invocation's own result travels with its ack (no CallResult for the root).
            self.local.on_ack(ack, value if not inv.path else None)
        else:
            self.transport.send(inv.root, ack)

    def to_peers(self, msg: Final | ExecDone | Vote | Revote) -> None:
        """A fallback transaction's outcome (each worker releases its locks) or an epoch report (each
        worker decides from all of them), to every other worker."""
        for peer in self.table.peers:
            if peer != self.node_id:
                self.transport.send(peer, msg)
