"""The names of external calls and timers: the system operators, whose key an entity's intents and
timers live under, and ids derived from a call's place (request id and path in the call tree), so a
re-run, a fallback re-execution and a replay name the same call the same way."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from styx_py.core.partitioning import Key

OUTBOX = "styx.outbox"
TIMERS = "styx.timers"
SYSTEM_OPERATORS = (OUTBOX, TIMERS)


def owner_of(operator: str, key: Key) -> str:
    """The system operators' key for the entity ``(operator, key)`` (a str and an int key differ)."""
    return f"{operator}/{key!r}"


def call_key(request_id: str, path: Sequence[int]) -> str:
    """The idempotency key of the external call made at ``path`` of request ``request_id``."""
    return f"{request_id}/" + ".".join(map(str, path))


def timer_id(owner: str, request_id: str, path: Sequence[int]) -> str:
    """``owner@digest``: the timer set at ``path`` of ``request_id`` (the digest has no ``@``)."""
    text = call_key(request_id, path)
    return f"{owner}@{hashlib.sha256(text.encode()).hexdigest()[:20]}"


def timer_owner(timer: str) -> str:
    """The owner key a timer id names."""
    owner, sep, _ = timer.rpartition("@")
    if not sep:
        raise ValueError(f"not a timer id: {timer!r}")
    return owner
