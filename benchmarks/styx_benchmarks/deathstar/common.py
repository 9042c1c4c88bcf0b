"""What both DeathStar workloads share: partitions, the bulk loader's functions, the mix, loading.

Loading uses one bulk function per operator: ``load(items)`` fans out ``init(value)`` calls with
``call_async``, :data:`LOAD_CHUNK` entities per transaction, :data:`LOAD_CONCURRENCY` transactions in
flight.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from styx_benchmarks.graphs import FunctionTable
from styx_benchmarks.workload import Progress
from styx_py import Context
from styx_py.core.partitioning import Key

if TYPE_CHECKING:
    from styx_client import Call, StyxClient

PARTITIONS = 4
LOAD_CHUNK = 500  # entities initialised per loading transaction
LOAD_CONCURRENCY = 256  # loading transactions in flight


async def init(ctx: Context, value: Any) -> None:
    """Set this entity's state (the loader's per-entity function)."""
    await ctx.put(value)


async def load(ctx: Context, items: list[list[Any]]) -> int:
    """Run on any key (e.g. ``loader3``): fan ``init`` out to ``[key, value]`` pairs in one transaction."""
    for key, value in items:
        ctx.call_async(ctx.operator, "init", key, value)
    return len(items)


async def read(ctx: Context) -> Any:
    """This entity's state (None when absent)."""
    return await ctx.get()


BULK_STATE: FunctionTable = {"init": (init, False), "load": (load, False), "read": (read, True)}
"""The loader pair and the reader, given to every operator whose state is loaded or checked."""


def scaled(n: int, scale: float) -> int:
    return max(1, round(n * scale))


def parse_mix(default: Mapping[str, float], override: Any) -> tuple[list[str], list[float]]:
    """Labels and cumulative weights of a request mix (``override`` replaces ``default`` when given)."""
    mix = default if override is None else override
    if not isinstance(mix, Mapping) or not mix:
        raise ValueError(f"mix must be a non-empty mapping of request kind to weight, got {mix!r}")
    unknown = sorted(set(mix) - set(default))
    if unknown:
        raise ValueError(f"unknown request kinds {unknown} in mix; known: {sorted(default)}")
    if any(not isinstance(w, int | float) or w < 0 for w in mix.values()) or sum(mix.values()) <= 0:
        raise ValueError(f"mix weights must be non-negative numbers with a positive sum, got {dict(mix)}")
    labels = [label for label, weight in mix.items() if weight > 0]
    cumulative: list[float] = []
    total = 0.0
    for label in labels:
        total += float(mix[label])
        cumulative.append(total)
    return labels, cumulative


def draw(rng: random.Random, labels: list[str], cumulative: list[float]) -> str:
    """One request kind of a mix made by :func:`parse_mix`."""
    coin = rng.random() * cumulative[-1]
    for label, edge in zip(labels, cumulative, strict=True):
        if coin < edge:
            return label
    return labels[-1]


def format_ids(items: Iterable[Any], limit: int = 5) -> str:
    """A short, sorted rendering of ids for messages."""
    ids = sorted(map(str, items))
    if not ids:
        return "nothing"
    more = f", … ({len(ids)} in all)" if len(ids) > limit else ""
    return ", ".join(ids[:limit]) + more


def password_hash(salt: str, password: str) -> str:
    return hashlib.sha256((salt + password).encode()).hexdigest()


def load_calls(groups: Iterable[tuple[str, list[tuple[Key, Any]]]]) -> list[Call]:
    """The bulk-loading transactions: ``load`` with ``LOAD_CHUNK`` ``[key, value]`` pairs each."""
    calls: list[Call] = []
    for operator, items in groups:
        for n, start in enumerate(range(0, len(items), LOAD_CHUNK)):
            chunk = [[key, value] for key, value in items[start : start + LOAD_CHUNK]]
            calls.append((operator, f"loader{n}", "load", (chunk,)))
    return calls


async def run_load(
    client: StyxClient, name: str, calls: list[Call], entities: int, progress: Progress
) -> None:
    """Submit the loading transactions; the first that does not commit fails the load."""
    replies = await client.submit_many(calls, concurrency=LOAD_CONCURRENCY)
    bad = [(call, r) for call, r in zip(calls, replies, strict=True) if r.status != "committed"]
    if bad:
        (operator, key, _, _), reply = bad[0]
        raise RuntimeError(f"{name} load failed: {operator}.load at {key!r}: {reply.status} {reply.error}")
    progress(f"{name}: loaded {entities} entities in {len(calls)} transactions")
