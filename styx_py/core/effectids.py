"""The names of external calls and timers: the system operators, whose key an entity's intents and
timers live under, and ids derived from a call's place (request id and path in the call tree), so a
re-run, a fallback re-execution and a replay name the same call the same way."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from styx_py.core.partitioning import Key, partition_of

OUTBOX = "styx.outbox"
TIMERS = "styx.timers"
SYSTEM_OPERATORS = (OUTBOX, TIMERS)


# Suffixes tried at most to place an owner key on its entity's partition: with P partitions one in P
# fits, so 4 096 fail to fit with probability (1 - 1/P)^4096, below 1e-27 for P <= 64 (an assertion).
MAX_OWNER_SUFFIXES = 4096


def owner_of(operator: str, key: Key, partitions: int | None = None, system_partitions: int = 0) -> str:
    """The system operators' key for the entity ``(operator, key)`` (a str and an int key differ).

    Given ``partitions``, the partitions of ``operator``, and ``system_partitions``, those of the system
    operators (the graph's largest count, :func:`styx_py.core.effects.effect_operators`): the first of
    ``operator/key``, ``operator/key#1``, ``operator/key#2``… that lives on the entity's own partition
    (partition ``i`` of every operator is on one worker), so a transaction that asks for a call or a
    timer, and the completion that runs its continuation, stay on the entity's partition instead of
    adding one. Without them: ``operator/key``."""
    base = f"{operator}/{key!r}"
    if partitions is None:
        return base
    want = partition_of(key, partitions)
    candidate = base
    for i in range(1, MAX_OWNER_SUFFIXES + 1):
        if partition_of(candidate, system_partitions) == want:
            return candidate
        candidate = f"{base}#{i}"
    raise AssertionError(f"no owner key of {base} on partition {want} of {system_partitions}")


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
