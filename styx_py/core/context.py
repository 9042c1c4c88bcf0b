"""The user-facing context of a function invocation.

This is the abstract API user code sees; the runtime implementation lives in ``worker.executor``
(kept apart so user code cannot reach runtime internals, as in Restate's sdk-python).
"""

from __future__ import annotations

import random as _random
import uuid as _uuid
from abc import ABC, abstractmethod
from typing import Any
from zlib import crc32

from styx_py.core.effectids import OUTBOX, TIMERS, call_key, owner_of, timer_id, timer_owner
from styx_py.core.operator import Operator, operator_name
from styx_py.core.partitioning import Key

Then = tuple[Any, ...]  # (operator, function, key) or (operator, function, key, [extra arguments])


def invocation_rng(tid: int, path: list[int]) -> _random.Random:
    """The random stream of one invocation: a function of its tid and call-tree position only, so a
    re-run, a fallback re-execution and a replay draw the same numbers (and so does the serial model)."""
    return _random.Random((tid << 32) | crc32(",".join(map(str, path)).encode()))


Number = int | float


def added(value: Any, amount: Number, field: str | None = None) -> Any:
    """``value`` with ``amount`` added: to the number itself, or with ``field`` to ``value[field]`` of a
    dict (a missing field counts as 0). An absent value (None) counts as 0, or as ``{}`` with
    ``field``. A bool is not a number here; anything else raises TypeError."""
    if not _is_number(amount):
        raise TypeError(f"add: amount must be an int or a float, not {type(amount).__name__}")
    if field is None:
        if value is None:
            return amount
        if not _is_number(value):
            raise TypeError(f"add: the state is a {type(value).__name__}, not a number")
        return value + amount
    if value is None:
        return {field: amount}
    if not isinstance(value, dict):
        raise TypeError(f"add: the state is a {type(value).__name__}, not a dict with field {field!r}")
    current = value.get(field, 0)
    if not _is_number(current):
        raise TypeError(f"add: field {field!r} is a {type(current).__name__}, not a number")
    value[field] = current + amount
    return value


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


class Context(ABC):
    """What a function can do: touch its own entity's state and call other entities.

    Every effect is part of the surrounding transaction: it commits or aborts as a whole.
    """

    key: Key
    operator: str

    @abstractmethod
    async def get(self, default: Any = None) -> Any:
        """This entity's state, or ``default`` when it has none."""

    @abstractmethod
    async def put(self, value: Any) -> None:
        """Replace this entity's state (any msgspec-encodable value)."""

    @abstractmethod
    async def delete(self) -> None:
        """Remove this entity's state."""

    async def add(self, amount: Number, field: str | None = None) -> None:
        """Add ``amount`` to this entity's state (a number), or to its ``field`` (a dict; a missing
        field or an absent state counts as 0), without reading it.

        The transaction's result cannot depend on the value, so adds commute: several transactions
        of an epoch that add to one entity do not conflict with each other and all commit without
        locks, in tid order. A read (``get``, ``scan``) or a ``put``/``delete`` of the entity by a
        higher tid of the epoch still conflicts with them, and an add conflicts with a lower tid's
        ``put`` or ``delete``. Within its transaction an add is an ordinary write: a later ``get``
        sees it (and then reads the entity), an add after a ``get`` or ``put`` of the entity changes
        the written value. Raises TypeError when the state is not a number (or a dict whose
        ``field`` is a number or missing), or ``amount`` is not an int or a float."""
        await self.put(added(await self.get(), amount, field))

    @abstractmethod
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
        """The entities of ``operator`` whose keys are in the range, as ``(key, value)`` in key order (int
        keys before str keys): ``start`` inclusive or ``after`` exclusive, ``end`` exclusive, ``prefix``
        (str keys only), at most ``limit`` rows (default and most:
        :data:`~styx_py.core.limits.MAX_SCAN_LIMIT`; beyond it
        :class:`~styx_py.core.errors.ScanLimitExceeded`). Serializable: the range is in the transaction's
        read set, so a lower tid's insert, update or delete in it is a conflict (no phantoms). It sees
        this transaction's own writes. Cost: one call to every partition of ``operator``
        (:mod:`styx_py.core.scan`)."""

    @abstractmethod
    def call_async(self, operator: Operator | str, function: str, key: Key, *args: Any) -> None:
        """Call a function of another entity in the same transaction, without waiting for it."""

    @abstractmethod
    async def call(self, operator: Operator | str, function: str, key: Key, *args: Any) -> Any:
        """Call a function of another entity in the same transaction and return its result."""

    @abstractmethod
    def random(self) -> float:
        """A deterministic pseudo-random float in [0, 1): identical when the transaction is replayed."""

    @abstractmethod
    def now(self) -> float:
        """The transaction's sequenced timestamp (seconds since the epoch), identical on replay."""

    @abstractmethod
    def next_call_place(self) -> tuple[str, list[int]]:
        """The request id of this transaction and the call-tree path the next call made here gets."""

    def partition_pending(self) -> int:
        """Of a system operator's entity (styx.outbox, styx.timers): the entries its partition had
        pending at the start of this transaction's epoch (styx_py.core.pendingcount); 0 elsewhere."""
        return 0

    # ---- external calls and timers (styx_py.core.effects; docs/effects.md) -------------------------------
    def call_external(
        self,
        service: str,
        function: str,
        *args: Any,
        idempotency_key: str | None = None,
        then: Then | None = None,
    ) -> str:
        """Ask for ``function(*args)`` of external ``service``, made after this transaction commits, once
        in effect: every attempt carries one idempotency key (``idempotency_key``, or one derived from
        the request id and this call's place). Its outcome runs ``then = (operator, function, key[,
        extra args])`` as a later transaction, called with ``{"call", "ok", "value", "error"}`` first
        (:func:`styx_py.core.effects.external_value`). Returns the idempotency key."""
        request_id, path = self.next_call_place()
        key = idempotency_key if idempotency_key is not None else call_key(request_id, path)
        if not isinstance(key, str) or not key:
            raise TypeError("idempotency_key must be a non-empty str")
        target: list[Any] = []
        if then is not None:
            if not 3 <= len(then) <= 4:
                raise TypeError("then must be (operator, function, key) or (operator, function, key, args)")
            extra = list(then[3]) if len(then) == 4 else []
            target = [operator_name(then[0]), then[1], then[2], extra]
        place = call_key(request_id, path)  # tells this intent from a later one under the same key
        owner = owner_of(self.operator, self.key)
        self.call_async(OUTBOX, "record", owner, key, service, function, list(args), target, place)
        return key

    def call_later(
        self, delay_s: float, operator: Operator | str, function: str, key: Key, *args: Any
    ) -> str:
        """Call ``operator.function(key, *args)`` as a transaction of its own once ``delay_s`` seconds of
        sequenced time have passed (exactly once, unless cancelled first). Returns the timer id."""
        if not isinstance(delay_s, (int, float)) or delay_s < 0:
            raise ValueError(f"delay_s must be a number >= 0, got {delay_s!r}")
        request_id, path = self.next_call_place()
        owner = owner_of(self.operator, self.key)
        tid = timer_id(owner, request_id, path)
        due_ms = int(self.now() * 1000 + delay_s * 1000)
        self.call_async(
            TIMERS, "add", owner, tid, due_ms, [operator_name(operator), function, key, list(args)]
        )
        return tid

    def cancel_timer(self, timer: str) -> None:
        """Cancel timer ``timer`` (an id :meth:`call_later` returned) in this transaction; a timer fired or
        cancelled already stays so."""
        self.call_async(TIMERS, "cancel", timer_owner(timer), timer)

    def uuid(self) -> _uuid.UUID:
        """A deterministic UUID (version 4 layout) drawn from :meth:`random`'s stream."""
        bits = 0
        for _ in range(4):
            bits = (bits << 32) | int(self.random() * 2**32)
        return _uuid.UUID(int=bits, version=4)
