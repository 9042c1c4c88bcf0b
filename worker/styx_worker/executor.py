"""Running one function invocation: the runtime Context, and the invocation's outcome.

An invocation runs user code against a :class:`~styx_worker.txn.TxnView` — the committed state, its
transaction's buffered writes on this worker, its read set, the epoch's code — and *returns* what it
did as an :class:`~styx_worker.effects.Invoked`: its status, result and kept share, the asynchronous
calls to dispatch and every call it made (the call-graph cache). It sends nothing itself. A synchronous
call is the one thing it waits for: :class:`Calls` dispatches it and hands back the awaitable result.

Three modes:

* optimistic: reads are recorded in the read set; the invocation is cached (arguments, outgoing
  calls, kept share) for the fallback phase;
* fallback, re-executed: the root function runs again and calls are made as usual (the epoch machine
  starts each invocation only once its tid holds its entity's lock);
* fallback, cached: each worker re-invokes its cached invocations of the transaction in parallel;
  outgoing calls are only compared with the cached ones (a difference => ``Status.CHANGED``, the
  transaction is rescheduled) and synchronous results arrive from the callee's own re-invocation.

The code it runs is the epoch's graph (``TxnView.graph``): every invocation of an epoch runs the graph
version of that epoch, whichever version is the newest.
"""

from __future__ import annotations

import random as _random
from collections.abc import Awaitable
from typing import Any, Protocol

import msgspec

from styx_py.core.context import Context, Number, invocation_rng
from styx_py.core.errors import Abort
from styx_py.core.limits import MAX_CALL_DEPTH, MAX_CALLS_PER_FUNCTION
from styx_py.core.operator import Operator, bind_error, operator_name
from styx_py.core.partitioning import Key, key_bytes, partition_of
from styx_py.core.requests import ARGS_DEPTH, TOO_DEEP, nests_deeper
from styx_py.core.scan import SCAN_FUNCTION, SCAN_OP, merge, scan_key, scan_range
from styx_py.core.wire import Invoke, Phase, Status, decode_value, encode_value
from styx_worker.ackshare import ZERO, Share, from_wire, scaled, split_async, split_sync, to_wire
from styx_worker.effects import Invoked
from styx_worker.scan import run_scan
from styx_worker.txn import CachedInvocation, CallRecord, TxnView, added_raw

__all__ = ["EMPTY_RAW", "Calls", "RuntimeContext", "run_invocation"]

EMPTY_RAW = msgspec.Raw(encode_value(None))
CallOutcome = tuple[Status, msgspec.Raw]


class Calls(Protocol):
    """Where an invocation's synchronous calls go (the shell's invocation runner)."""

    def call(self, child: Invoke, dispatch: bool) -> Awaitable[CallOutcome]:
        """The result of ``child`` once it comes; ``dispatch``: send ``child`` first (a cached
        re-invocation does not: the callee's worker re-invokes its own cached copy)."""
        ...


class _Changed(BaseException):
    """Internal signal: the fallback run diverged from the optimistic one (reschedule)."""


class _CalleeFailed(BaseException):
    """Internal signal: a synchronous callee failed; the callee reports the reason to the root."""

    def __init__(self, status: Status) -> None:
        super().__init__(status)
        self.status = status


class _BadCall(BaseException):
    """Internal signal: a call names an unknown operator/function or has an invalid key (Status.BAD).
    A BaseException: the user's ``except Exception`` around the call cannot swallow it, so the whole
    transaction fails, as the serial model fails it (:mod:`styx_py.core.serial`)."""


def _encode_args(args: tuple[Any, ...]) -> bytes:
    """A call's arguments, within the nesting limit of a request's (checked on the bytes, so the
    verdict does not depend on how deep the stack is when the call is made or replayed)."""
    try:
        raw = encode_value(list(args))
    except RecursionError:
        raise _BadCall(TOO_DEEP) from None
    if nests_deeper(raw, ARGS_DEPTH):
        raise _BadCall(TOO_DEEP)
    return raw


class RuntimeContext(Context):
    __slots__ = (
        "_async",
        "_buf",
        "_cached",
        "_calls",
        "_ekey",
        "_inv",
        "_rng",
        "_runner",
        "_share",
        "_view",
        "key",
        "operator",
    )

    def __init__(self, view: TxnView, runner: Calls, inv: Invoke, cached: CachedInvocation | None) -> None:
        self.key = inv.key
        self.operator = inv.operator
        self._view = view
        self._runner = runner
        self._inv = inv
        self._cached = cached
        self._ekey = (inv.operator, inv.key)
        self._share = from_wire(inv.share_n, inv.share_d)
        self._calls: list[CallRecord] = []
        self._async: list[Invoke] = []
        self._rng: _random.Random | None = None
        self._buf = view.buffer(inv.phase, inv.tid)

    # ---- state -----------------------------------------------------------------------------------
    async def get(self, default: Any = None) -> Any:
        buf = self._buf
        if self._ekey in buf:
            raw = buf[self._ekey]
            if self._inv.phase == Phase.OPTIMISTIC and self._view.unadd(self._inv.tid, self._ekey):
                self._view.record_read(self._inv.tid, self._ekey)  # its adds were blind: now it reads
        else:
            if self._inv.phase == Phase.OPTIMISTIC:
                self._view.record_read(self._inv.tid, self._ekey)
            raw = self._view.read(self._ekey)
        return default if raw is None else decode_value(raw)

    async def put(self, value: Any) -> None:
        self._buf[self._ekey] = encode_value(value)
        if self._inv.phase == Phase.OPTIMISTIC:
            self._view.unadd(self._inv.tid, self._ekey)

    async def delete(self) -> None:
        self._buf[self._ekey] = None
        if self._inv.phase == Phase.OPTIMISTIC:
            self._view.unadd(self._inv.tid, self._ekey)

    async def add(self, amount: Number, field: str | None = None) -> None:
        """In the optimistic run, an add to an entity this transaction has neither read nor written is
        blind: it buffers the value it gives on the epoch's committed state (what this run reads),
        records the add instead of a read, and the lock-free commit adds it again to the state as the
        lower tids' adds left it (:mod:`styx_worker.conflicts` for what conflicts). Otherwise, and in
        the fallback and serial runs (under locks), it reads and writes the entity."""
        inv, key, buf = self._inv, self._ekey, self._buf
        view = self._view
        if (
            inv.phase != Phase.OPTIMISTIC
            or view.was_read(inv.tid, key)
            or (key in buf and not view.is_added(inv.tid, key))
        ):
            await super().add(amount, field)
            return
        raw = buf[key] if key in buf else view.read(key)  # no read recorded: nothing depends on it
        buf[key] = added_raw(raw, ((amount, field),))
        view.record_add(inv.tid, key, amount, field)

    # ---- calls -----------------------------------------------------------------------------------
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
        spec = self._view.graph.operators.get(op)
        if spec is None:
            raise _BadCall(f"unknown operator {op!r}")
        args = (op, rng.low, rng.low_open, rng.high, rng.high_open, rng.prefix, rows)
        waits = []
        for p in range(spec.partitions):  # every partition at once; each answers its part of the range
            record = self._record(SCAN_OP, SCAN_FUNCTION, scan_key(op, p), args, True, system=True)
            keep, give = split_sync(self._share)
            self._share = keep
            waits.append(self._runner.call(self._child(record, give, want_result=True), self._cached is None))
        parts = []
        for wait in waits:
            status, value = await wait
            if status != Status.OK:
                raise _CalleeFailed(status)
            parts.append(decode_value(value))
        return merge(parts, rows)

    def _record(
        self,
        target: Operator | str,
        function: str,
        key: Key,
        args: tuple[Any, ...],
        sync: bool,
        system: bool = False,
    ) -> CallRecord:
        op = operator_name(target)
        if not system and self._view.graph.function(op, function) is None:
            raise _BadCall(f"unknown function {op}.{function}")
        try:
            key_bytes(key)
        except TypeError as exc:
            raise _BadCall(str(exc)) from None
        if len(self._calls) >= MAX_CALLS_PER_FUNCTION:
            raise _BadCall(f"more than {MAX_CALLS_PER_FUNCTION} calls from one invocation")
        if len(self._inv.path) >= MAX_CALL_DEPTH:
            raise _BadCall(f"call depth exceeds {MAX_CALL_DEPTH}")
        record = CallRecord(op, function, key, _encode_args(args), sync)
        if self._cached is not None:
            cached_calls = self._cached.calls
            i = len(self._calls)
            if i >= len(cached_calls) or cached_calls[i] != record:
                raise _Changed
        self._calls.append(record)
        return record

    def _child(self, record: CallRecord, share: Share, want_result: bool) -> Invoke:
        inv = self._inv
        return Invoke(
            inv.epoch,
            inv.tid,
            inv.phase,
            [*inv.path, len(self._calls) - 1],
            inv.root,
            self._view.node_id,
            record.operator,
            record.function,
            record.key,
            msgspec.Raw(record.args),
            *to_wire(share),
            want_result,
            inv.ts_ms,
            inv.gen,
            inv.request_id,
        )

    def call_async(self, operator: Operator | str, function: str, key: Key, *args: Any) -> None:
        record = self._record(operator, function, key, args, sync=False)
        if self._cached is None:
            # The share is assigned when the invocation ends and the number of calls is known.
            self._async.append(self._child(record, ZERO, want_result=False))

    async def call(self, operator: Operator | str, function: str, key: Key, *args: Any) -> Any:
        record = self._record(operator, function, key, args, sync=True)
        keep, give = split_sync(self._share)
        self._share = keep
        child = self._child(record, give, want_result=True)
        status, value = await self._runner.call(child, self._cached is None)
        if status != Status.OK:
            raise _CalleeFailed(status)
        return decode_value(value)

    # ---- determinism -----------------------------------------------------------------------------
    def random(self) -> float:
        if self._rng is None:
            self._rng = invocation_rng(self._inv.tid, self._inv.path)
        return self._rng.random()

    def now(self) -> float:
        return self._inv.ts_ms / 1000.0

    def next_call_place(self) -> tuple[str, list[int]]:
        return self._inv.request_id, [*self._inv.path, len(self._calls)]

    def partition_pending(self) -> int:
        op = self._view.graph.operators[self.operator]
        return self._view.pending.get((self.operator, partition_of(self.key, op.partitions)), 0)


async def run_invocation(
    view: TxnView, runner: Calls, inv: Invoke, cached: CachedInvocation | None
) -> Invoked:
    """Run one invocation to its end and say what it did; never raises for anything user code does."""
    if inv.operator == SCAN_OP:
        return run_scan(view, inv, cached)
    status, error, value = Status.OK, "", EMPTY_RAW
    ctx = RuntimeContext(view, runner, inv, cached)
    fn = view.graph.function(inv.operator, inv.function)
    if fn is None:
        status, error = Status.BAD, f"unknown function {inv.operator}.{inv.function}"
    else:
        try:
            args = decode_value(inv.args)
            if not isinstance(args, list):
                raise _BadCall("arguments must be a list")
            bad = bind_error(fn, args)
            if bad is not None:
                raise _BadCall(bad)
            result = await fn(ctx, *args)
            try:
                value = msgspec.Raw(encode_value(result))
            except (TypeError, msgspec.EncodeError) as exc:
                raise TypeError(f"result of {inv.operator}.{inv.function} cannot be encoded: {exc}") from exc
            if cached is not None and len(ctx._calls) != len(cached.calls):
                raise _Changed
        except Abort as exc:
            status, error = Status.ABORT, str(exc)
        except _BadCall as exc:
            status, error = Status.BAD, str(exc)
        except _Changed:
            status = Status.CHANGED
        except _CalleeFailed as exc:
            status = Status.CHANGED if exc.status == Status.CHANGED else Status.PROPAGATED
        except (msgspec.DecodeError, msgspec.EncodeError) as exc:
            status, error = Status.ERROR, f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # noqa: BLE001 - any user exception aborts the transaction, by design
            status, error = Status.ERROR, f"{type(exc).__name__}: {exc}"

    # Shares: a cached re-invocation acks exactly what it kept in the optimistic run (its callees are
    # re-invoked by their own workers and ack theirs); otherwise async callees get their parts now.
    children: list[Invoke] = []
    if cached is not None:
        own = cached.own_share
    elif status == Status.OK and ctx._async:
        own = split_async(ctx._share, len(ctx._async))
        for child in ctx._async:
            child.share_n, child.share_d = to_wire(own)
        if inv.phase == Phase.SERIAL:
            status, own = await _in_call_order(runner, ctx._async, own)
        else:
            children = ctx._async
    else:
        own = ctx._share
    return Invoked(inv, status, error, value, own, children, ctx._calls)


async def _in_call_order(runner: Calls, children: list[Invoke], part: Share) -> tuple[Status, Share]:
    """Phase.SERIAL: each asynchronous callee's whole subtree before the next one starts (the serial
    model's order: a callee answers its caller only once its own callees are done). The first that
    fails ends it, as an exception would: the rest never run and their parts of the share are acked
    with the caller's. Returns (the caller's status, the share it acks)."""
    for i, child in enumerate(children):
        child.want_result = True  # its result tells when its subtree is done
        status, _ = await runner.call(child, True)
        if status != Status.OK:
            return Status.PROPAGATED, scaled(part, len(children) - i)
    return Status.OK, part
