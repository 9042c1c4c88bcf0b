"""Where an entity lives: the cluster view as routing needs it (pure).

:class:`RoutingTable` says which worker owns which partition, how many partitions each operator has and
who the peers are. The epoch machine (:mod:`styx_worker.epoch`) routes a transaction's messages with it:
an :class:`~styx_py.core.wire.Invoke` to the owner of its entity, a
:class:`~styx_py.core.wire.CallResult` to the caller's worker, an :class:`~styx_py.core.wire.Ack` to the
root's worker — handled at once when that is this worker, sent as an effect otherwise.
"""

from __future__ import annotations

from styx_py.core.graph import Graph
from styx_py.core.partitioning import Key, partition_of
from styx_py.core.requests import request_problem
from styx_py.core.scan import SCAN_OP, scan_partition
from styx_py.core.wire import (
    ClusterView,
    Request,
)


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
        if operator == SCAN_OP:  # a scan's call to one partition of an operator (styx_worker.scan)
            return self.placement[scan_partition(key)]
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
