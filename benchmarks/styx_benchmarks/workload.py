"""What every benchmark workload provides to the one harness (driver, CLI, audit).

A workload is a styx-py app (deployed by import path) plus three things the harness calls:

* :meth:`Workload.load` populates the initial state in bulk (few large transactions, not one per row);
* :meth:`Workload.next_op` draws the next request of the mix from the driver's random stream;
* :meth:`Workload.check_state` verifies the workload's invariants on a state map. It is a plain
  function of ``{(operator, key): value}``, so the same rules run on state read through the client
  (:meth:`Workload.check`) and on snapshot rows in the offline audit.

The workloads themselves import this module; the registry of them by name is
:mod:`styx_benchmarks.workloads`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, cast

from styx_py.core.partitioning import Key

if TYPE_CHECKING:
    from styx_client import Reply, StyxClient

CHECK_ID_PREFIX = "check-"
"""The request ids of a check's own reads (:func:`submit_checks`) start with this, so the offline audit
tells them from the workload's traffic (they would dominate its per-second throughput: every entity
read once, right after the run)."""

State = Mapping[tuple[str, Key], Any]
"""Entity state by (operator, key): what ``check_state`` verifies."""

Progress = Callable[[str], None]


class Op(NamedTuple):
    """One request of the mix. ``label`` names its kind in the per-kind statistics.

    A named tuple, not a frozen dataclass: as immutable, and built in a third of the time (a frozen
    dataclass sets each field through ``object.__setattr__``; one is built per request)."""

    label: str
    operator: str
    key: Key
    function: str
    args: tuple[Any, ...] = ()


@dataclass(slots=True)
class Options:
    """Workload parameters; each workload reads the ones that apply to it (the CLI sets them all)."""

    keys: int = 10_000  # YCSB-T accounts
    zipf: float = 0.0  # key skew: 0 uniform … 0.999 very skewed
    multi_partition: float | None = None  # YCSB-T share of cross-partition transfers (None: as drawn)
    warehouses: int = 1  # TPC-C
    scale: float = 1.0  # DeathStar / TPC-C population scale (1.0 = the standard cardinalities)
    seed: int = 1
    partitions: int | None = None  # YCSB-T: the bank app's partition count (None: its default, 4)
    extra: dict[str, Any] = field(default_factory=dict)


class Workload(ABC):
    """Base of every workload; subclasses set ``name`` and ``app`` and implement the four methods."""

    name: ClassVar[str]
    app: str  # import path of the graph, e.g. "styx_benchmarks.bank:app" (an option may choose it)
    description: ClassVar[str] = ""

    def __init__(self, options: Options | None = None) -> None:
        self.options = options or Options()

    @abstractmethod
    async def load(self, client: StyxClient, progress: Progress = print) -> None:
        """Populate the initial state through ``client`` (bulk transactions), reporting progress."""

    @abstractmethod
    def next_op(self, rng: random.Random) -> Op:
        """The next request of the mix, drawn from ``rng`` only (a run is reproducible by seed)."""

    @abstractmethod
    async def read_state(self, client: StyxClient) -> State:
        """Read, through read-only functions, the entities :meth:`check_state` needs."""

    @abstractmethod
    def check_state(self, state: State) -> list[str]:
        """Every violated invariant as a precise message; empty when the state is consistent."""

    async def check(self, client: StyxClient) -> list[str]:
        return self.check_state(await self.read_state(client))

    def services(self) -> contextlib.AbstractContextManager[dict[str, str]]:
        """The outside services a cluster started for this workload needs, running while the context
        is: their settings, added to the cluster's environment (none by default)."""
        return contextlib.nullcontext({})

    def service_pids(self) -> dict[str, int]:
        """Process id of each service :meth:`services` runs now, by name, so a benchmark charges each its
        CPU time beside the cluster's (none by default)."""
        return {}


CHECK_WAIT_S = (0.25, 4.0)  # a check's first and longest wait before it sends a refused read again
CHECK_PATIENCE_S = 60.0  # and how long it keeps sending it


async def submit_checks(
    client: StyxClient,
    calls: Iterable[tuple[str, Key, str, tuple[Any, ...]]],
    concurrency: int,
    patience_s: float = CHECK_PATIENCE_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> list[Reply]:
    """Submit a check's read-only calls ``(operator, key, function, args)``, at most ``concurrency`` in
    flight, with request ids ``check-<uuid hex>``; replies in call order. Every call runs to its end
    before the first failure (in call order) is raised, as in ``StyxClient.submit_many``.

    A cluster still working through an overloaded run's backlog refuses reads too (nothing ran): a
    refused call is sent again under a new id after a wait, 0.25 s doubling up to 4 s, and its refused
    reply is returned only once the next wait would end ``patience_s`` after its first send."""
    limit = asyncio.Semaphore(max(1, concurrency))

    async def one(operator: str, key: Key, function: str, args: tuple[Any, ...]) -> Reply:
        deadline = clock() + patience_s
        wait, longest = CHECK_WAIT_S
        while True:
            async with limit:
                rid = f"{CHECK_ID_PREFIX}{uuid.uuid4().hex}"
                reply = await client.submit(operator, key, function, *args, request_id=rid)
            if reply.status != "refused" or clock() + wait > deadline:
                return reply
            await sleep(wait)
            wait = min(longest, wait * 2)

    outcomes = await asyncio.gather(*(one(*call) for call in calls), return_exceptions=True)
    failure = next((o for o in outcomes if isinstance(o, BaseException)), None)
    if failure is not None:
        raise failure
    return cast("list[Reply]", outcomes)


async def read_many(
    client: StyxClient, reads: Iterable[tuple[str, Key, str]], concurrency: int = 2000
) -> dict[tuple[str, Key], Any]:
    """Run read-only calls ``(operator, key, function)`` and map (operator, key) to each result."""
    calls: list[tuple[str, Key, str, tuple[Any, ...]]] = [(op, key, fn, ()) for op, key, fn in reads]
    replies = await submit_checks(client, calls, concurrency)
    out: dict[tuple[str, Key], Any] = {}
    for (op, key, fn, _), reply in zip(calls, replies, strict=True):
        if reply.status != "committed":
            raise RuntimeError(f"reading {op}.{fn}({key!r}) failed: {reply.status} {reply.error}")
        out[(op, key)] = reply.value
    return out
