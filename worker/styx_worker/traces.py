"""The invocations a worker ran, by request id: the call graph and the entities of recent transactions.

Every invocation that ends here (:meth:`Traces.record`, from the epoch machine's ``on_invoked``) is
retained as a :class:`~styx_py.core.wire.Traced`: its request, epoch, phase and tid, its place in the
call graph (``path``), the entity it ran on and whether its transaction wrote that entity. An
invocation runs on the worker that owns its entity, so a transaction's graph is spread over the
workers; a reply lookup that asks for traces (the gateway's ``GET /v1/invocations/{id}/view``) gathers
it from all of them. A transaction that ran in several phases (optimistic, then the fallback) has an
entry for each; the reader keeps those of the phase its reply names.

Bounded, in memory: the :data:`MAX_TRACED_REQUESTS` most recent request ids (the oldest go first), at
most :data:`MAX_TRACE_NODES` invocations each (the rest are counted, not kept). Nothing is logged or
snapshotted: a restarted worker starts empty, and a replayed epoch records its invocations again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection

from styx_py.core.wire import Invoke, Status, Traced

__all__ = ["MAX_TRACED_REQUESTS", "MAX_TRACE_NODES", "Traces"]

MAX_TRACED_REQUESTS = 1000  # request ids per worker
MAX_TRACE_NODES = 64  # invocations per request id and worker


class Traces:
    def __init__(self, max_requests: int = MAX_TRACED_REQUESTS, max_nodes: int = MAX_TRACE_NODES) -> None:
        self.max_requests, self.max_nodes = max_requests, max_nodes
        self._by_id: OrderedDict[str, dict[tuple[int, int, int, tuple[int, ...]], Traced]] = OrderedDict()
        self.dropped = 0  # invocations not kept: their request had max_nodes already

    def __len__(self) -> int:
        return len(self._by_id)

    def record(self, inv: Invoke, status: Status, wrote: bool) -> None:
        rid = inv.request_id
        if not rid:
            return
        nodes = self._by_id.get(rid)
        if nodes is None:
            nodes = self._by_id[rid] = {}
            while len(self._by_id) > self.max_requests:
                self._by_id.popitem(last=False)
        else:
            self._by_id.move_to_end(rid)
        at = (inv.epoch, int(inv.phase), inv.tid, tuple(inv.path))
        if at not in nodes and len(nodes) >= self.max_nodes:
            self.dropped += 1
            return
        nodes[at] = Traced(
            rid, inv.epoch, int(inv.phase), inv.tid, list(inv.path), inv.operator, inv.function, inv.key,
            int(status), wrote,
        )  # fmt: skip

    def recent(self, n: int) -> list[Traced]:
        """The root invocations of the ``n`` most recent transactions whose root ran here, newest
        first (of a transaction re-run in the fallback, the latest run)."""
        out: list[Traced] = []
        for nodes in reversed(self._by_id.values()):
            roots = [t for at, t in nodes.items() if not at[3]]
            if roots:
                out.append(max(roots, key=lambda t: (t.epoch, t.phase)))
                if len(out) == n:
                    break
        return out

    def find(self, request_ids: Collection[str]) -> list[Traced]:
        """Every invocation retained of these requests, in (request, epoch, phase, tid, path) order."""
        out: list[Traced] = []
        for rid in sorted(set(request_ids)):
            nodes = self._by_id.get(rid, {})
            out.extend(nodes[at] for at in sorted(nodes))
        return out
