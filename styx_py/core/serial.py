"""The reference model: run committed transactions one at a time, in commit order.

The commit order of the cluster is ``(epoch, phase, tid)`` (lock-free commits of an epoch in tid
order, then its fallback commits in tid order); every reply carries those three numbers. Replaying
the requests serially in that order must give the same final state and the same replies. After code
updates each transaction runs the graph version of its epoch (``graph`` is then a function of the
epoch).

Calls follow the engine's semantics: ``await ctx.call`` runs the callee inline; ``call_async``
callees run after the caller returns, in call order, depth first. A failure anywhere undoes the
whole transaction. ``ctx.scan`` reads the committed state and the transaction's own writes so far
(the engine's calls to every partition take as many call places here).
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable, Iterable
from typing import Any

from styx_py.core.context import Context, invocation_rng
from styx_py.core.effectids import OUTBOX
from styx_py.core.errors import Abort
from styx_py.core.graph import Graph
from styx_py.core.operator import Operator, bind_error, operator_name
from styx_py.core.partitioning import Key, partition_of
from styx_py.core.pendingcount import PendingCounts, Totals
from styx_py.core.scan import operator_entries, scan_range, select
from styx_py.core.wire import Reply, ReplyStatus, Request, decode_value, encode_value

EntityKey = tuple[str, Key]


class _Failed(BaseException):
    def __init__(self, status: str, error: str) -> None:
        super().__init__(error)
        self.status = status
        self.error = error


class _SerialContext(Context):
    def __init__(self, run: _SerialRun, operator: str, key: Key, path: list[int]) -> None:
        self.run = run
        self.operator = operator
        self.key = key
        self.path = path
        self.children = 0
        self.pending: list[tuple[str, str, Key, list[Any], list[int]]] = []
        self._rng: _random.Random | None = None

    async def get(self, default: Any = None) -> Any:
        raw = self.run.read((self.operator, self.key))
        return default if raw is None else decode_value(raw)

    async def put(self, value: Any) -> None:
        self.run.writes[(self.operator, self.key)] = encode_value(value)

    async def delete(self) -> None:
        self.run.writes[(self.operator, self.key)] = None

    async def scan(
        self,
        operator: Operator | str,
        *,
        start: Key | None = None,
        end: Key | None = None,
        prefix: str | None = None,
        limit: int | None = None,
        after: Key | None = None,
    ) -> list[tuple[Key, Any]]:
        op = operator_name(operator)
        rng, rows = scan_range(op, start, end, prefix, limit, after)
        spec = self.run.graph.operators.get(op)
        if spec is None:
            raise _Failed("failed", f"unknown operator {op!r}")
        self.children += spec.partitions  # the engine calls every partition: each call takes a place
        entries: dict[Key, bytes | None] = dict(operator_entries(self.run.state.items(), op))
        entries.update(operator_entries(self.run.writes.items(), op))
        live, _ = select(rng, rows, entries.items())
        return [(k, decode_value(v)) for k, v in live]

    def _next_path(self) -> list[int]:
        self.children += 1
        return [*self.path, self.children - 1]

    def call_async(self, operator: Operator | str, function: str, key: Key, *args: Any) -> None:
        self.pending.append((operator_name(operator), function, key, list(args), self._next_path()))

    async def call(self, operator: Operator | str, function: str, key: Key, *args: Any) -> Any:
        return await self.run.invoke(operator_name(operator), function, key, list(args), self._next_path())

    def random(self) -> float:
        if self._rng is None:
            self._rng = invocation_rng(self.run.tid, self.path)
        return self._rng.random()

    def now(self) -> float:
        return self.run.ts_ms / 1000.0

    def next_call_place(self) -> tuple[str, list[int]]:
        return self.run.request_id, [*self.path, self.children]

    def partition_pending(self) -> int:
        n = self.run.graph.operators[self.operator].partitions
        return self.run.pending.get((self.operator, partition_of(self.key, n)), 0)


class _SerialRun:
    def __init__(
        self,
        graph: Graph,
        state: dict[EntityKey, bytes],
        tid: int,
        ts_ms: int,
        request_id: str,
        pending: Totals | None = None,
    ) -> None:
        self.pending = pending or {}  # per partition, pending at the start of the epoch (pendingcount)
        self.request_id = request_id
        self.graph = graph
        self.state = state
        self.writes: dict[EntityKey, bytes | None] = {}
        self.tid = tid
        self.ts_ms = ts_ms

    def read(self, key: EntityKey) -> bytes | None:
        return self.writes[key] if key in self.writes else self.state.get(key)

    async def invoke(self, operator: str, function: str, key: Key, args: list[Any], path: list[int]) -> Any:
        fn = self.graph.function(operator, function)
        if fn is None:
            raise _Failed("failed", f"unknown function {operator}.{function}")
        bad = bind_error(fn, args)
        if bad is not None:
            raise _Failed("failed", bad)
        ctx = _SerialContext(self, operator, key, path)
        try:
            result = await fn(ctx, *args)
            encode_value(result)
        except Abort as exc:
            raise _Failed("aborted", str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - mirrors the engine: any user exception aborts
            raise _Failed("failed", f"{type(exc).__name__}: {exc}") from None
        for op, fname, k, a, p in ctx.pending:
            await self.invoke(op, fname, k, a, p)
        return result


GraphAt = Callable[[int], Graph]  # epoch -> the graph version that ran it


Writes = dict[EntityKey, bytes | None]  # one transaction's writes (encoded values; None: delete)


class PendingByEpoch(PendingCounts):
    """What each partition has pending, as the engine counts it for its bounds: as of the start of each
    epoch. Feed it every committed transaction's writes (:meth:`write_all`) in commit order."""

    __slots__ = ("epoch", "frozen")

    def __init__(self) -> None:
        super().__init__()
        self.epoch = -1
        self.frozen: Totals = {}

    def for_epoch(self, graph: Graph, epoch: int) -> Totals:
        """The totals of ``epoch``'s start, for a transaction of ``epoch`` running ``graph``."""
        if epoch != self.epoch:
            outbox = graph.operators.get(OUTBOX)
            self.epoch = epoch
            self.frozen = {} if outbox is None else super().at(outbox.partitions)
        return self.frozen


async def serial_replay(
    graph: Graph | GraphAt,
    requests: dict[str, Request],
    replies: Iterable[Reply],
    commits: list[tuple[Reply, Writes]] | None = None,
) -> tuple[dict[EntityKey, Any], dict[str, tuple[str, Any]]]:
    """Final state and ``request_id -> (status, result or error)`` of the serial execution; each
    transaction runs ``graph``, or ``graph(epoch)`` of its epoch when the cluster's code changed. With
    ``commits``, every committed transaction's reply and writes are appended to it, in commit order.
    A refused request (not admitted: admission control) runs nothing; its outcome is its reply."""
    state: dict[EntityKey, bytes] = {}
    outcomes: dict[str, tuple[str, Any]] = {}
    counts = PendingByEpoch()
    for reply in sorted(replies, key=lambda r: (r.epoch, r.phase, r.tid)):
        if reply.status == ReplyStatus.REFUSED:
            outcomes[reply.request_id] = reply_outcome(reply)
            continue
        req = requests[reply.request_id]
        g = graph if isinstance(graph, Graph) else graph(reply.epoch)
        writes: Writes = {}
        pending = counts.for_epoch(g, reply.epoch)
        outcomes[req.request_id] = await apply_serially(g, state, req, reply.tid, writes, pending)
        counts.write_all(writes.items())
        if commits is not None and outcomes[req.request_id][0] == "committed":
            commits.append((reply, writes))
    return {k: decode_value(v) for k, v in state.items()}, outcomes


async def apply_serially(
    graph: Graph,
    state: dict[EntityKey, bytes],
    req: Request,
    tid: int,
    written: Writes | None = None,
    pending: Totals | None = None,
) -> tuple[str, Any]:
    """Run ``req`` as the next transaction of the serial order: its writes go into ``state`` (encoded
    values) when it commits, and into ``written`` if given; ``pending``: what each partition had
    pending at the start of its epoch (styx_py.core.pendingcount). Returns ``(status, result or
    error)``."""
    if req.operator not in graph.operators:
        return ("failed", f"unknown operator {req.operator!r}")  # as the engine rejects it at the root
    run = _SerialRun(graph, state, tid, req.ts_ms, req.request_id, pending)
    try:
        result = await run.invoke(req.operator, req.function, req.key, decode_value(req.args), [])
    except _Failed as exc:
        return (exc.status, exc.error)
    if written is not None:
        written.update(run.writes)
    for k, v in run.writes.items():
        if v is None:
            state.pop(k, None)
        else:
            state[k] = v
    return ("committed", result)


def reply_outcome(reply: Reply) -> tuple[str, Any]:
    if reply.status == "committed":
        return ("committed", decode_value(reply.result))
    return (reply.status, reply.error)
