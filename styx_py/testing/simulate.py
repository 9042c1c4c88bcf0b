"""Test your own app the way styx-py tests itself: the whole cluster in one process, on virtual time,
with seeded faults, every reply and the final state checked against a serial execution.

::

    from styx_py.testing.simulate import simulate

    def workload(rng):                      # a seeded stream of calls: (operator, key, function, args)
        for i in range(20):
            yield ("account", f"a{i}", "deposit", (100,))
        while True:
            a, b = rng.sample(range(20), 2)
            yield ("account", f"a{a}", "transfer", (f"a{b}", rng.randint(1, 50)))

    def money_is_conserved(state):          # the final state: {(operator, key): value}
        total = sum(v for (op, _), v in state.items() if op == "account")
        if total != 2000:
            yield f"money is not conserved: {total} != 2000"

    report = simulate("myapp.bank:app", workload, seeds=range(100), invariant=money_is_conserved)
    assert report.ok, report.describe()

Each seed runs the real coordinator, workers and SDK clients of :class:`~styx_py.testing.cluster.
SimCluster` on the user's graph, sends the workload's calls in rounds while :class:`Faults` fire at
seeded points of the message flow (worker and coordinator crashes, lost and repeated messages, workers
joining, drained and lost for good, a code update), and then checks that every request was answered once
and that every reply and the final state equal a serial execution of the requests in commit order
(:func:`~styx_py.testing.cluster.check_against_serial`), and the user's invariant on the final state. A
run is a pure function of its seed (the kit also seeds the ``random`` module, so a function that draws
from it by mistake fails the same way each time): a failing seed fails the same way every time, and the
report says how to run it alone. The same kit runs from the command line (``styx simulate``) and in
pytest (the ``styx_simulation`` fixture of :mod:`styx_py.testing.plugin`). A graph that calls external
services runs on doubles of them (``services``: :class:`~styx_py.testing.services.ServiceDouble` s
with seeded faults), which the invariant gets too.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import itertools
import logging
import random
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from styx_py.core.effects import Service
from styx_py.core.errors import ConfigError, GraphError, StyxError
from styx_py.core.graph import Graph, load_graph
from styx_py.core.partitioning import Key
from styx_py.core.words import counted
from styx_py.testing.cluster import SimCluster, check_against_serial, run_simulated

__all__ = [
    "NO_FAULTS",
    "Call",
    "Faults",
    "Invariant",
    "Report",
    "SeedResult",
    "Services",
    "Workload",
    "resolve",
    "simulate",
]

Call = tuple[str, Key, str, tuple[Any, ...]]
"""One request: ``(operator, key, function, args)``, as :meth:`StyxClient.submit_many` takes them."""
Workload = Callable[[random.Random], Iterable[Call]]
"""A seeded stream of calls (it may be endless: the kit takes what it needs)."""
Invariant = Callable[..., Iterable[str]]
"""What must hold of the final state (``{(operator, key): value}``): each problem it finds, as a line.
With ``services``, it is called with the seed's service doubles too: ``invariant(state, doubles)``."""
Services = Callable[[random.Random], Mapping[str, Service]]
"""One seed's doubles of the graph's external services, by name, from a generator seeded by the seed
(for example :class:`~styx_py.testing.services.ServiceDouble` s with seeded fault rates)."""

ROUNDS = 3  # the workload is sent in this many rounds; each waits until every request has its reply


@dataclass(frozen=True)
class Faults:
    """What goes wrong during one seed's run, each at a seeded point of the message flow."""

    crashes: int = 2  # worker crashes (the process restarts: the cluster recovers from S3 and the log)
    coordinator_crashes: int = 1  # the coordinator killed (a new one resumes from its state in S3)
    drops: int = 1  # messages lost (an epoch stalls; the watchdog recovers)
    duplicates: int = 1  # messages delivered twice
    reshapes: int = 2  # workers joining, drained or lost for good, one per round at most
    update: str | None = None  # a code update to this graph (import path), deployed during the run

    def describe(self) -> str:
        parts = [counted(self.crashes, "worker crash", "worker crashes")]
        parts.append(counted(self.coordinator_crashes, "coordinator crash", "coordinator crashes"))
        repeated = "message" if self.drops + self.duplicates == 1 else "messages"
        parts.append(f"{self.drops} lost and {self.duplicates} repeated {repeated}")
        parts.append(counted(self.reshapes, "reshape"))
        if self.update:
            parts.append(f"a code update to {self.update}")
        return ", ".join(parts)


NO_FAULTS = Faults(0, 0, 0, 0, 0)


@dataclass(frozen=True)
class SeedResult:
    seed: int
    ok: bool
    error: str = ""  # why it failed: the check's message, or the traceback of what raised
    replies: int = 0
    crashes: int = 0


@dataclass
class Report:
    app: str
    results: list[SeedResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def failed(self) -> list[SeedResult]:
        return [r for r in self.results if not r.ok]

    def describe(self, replay: str = "simulate(..., seeds=[{seed}])") -> str:
        """What a person reads: how many seeds passed, and the first that failed, with how to run it
        alone (``replay``, with ``{seed}`` in it)."""
        n, bad = len(self.results), self.failed
        head = f"{self.app}: {n - len(bad)} of {counted(n, 'seed')} passed in {self.seconds:.1f} s"
        if not bad:
            return head
        first = bad[0]
        return (
            f"{head}; failed: {[r.seed for r in bad][:20]}\n"
            f"seed {first.seed} failed:\n{first.error.rstrip()}\n"
            f"run it alone: {replay.format(seed=first.seed)}"
        )


def resolve(path: str, what: str) -> Any:
    """The object at ``module:name`` (a workload, an invariant); a ConfigError naming ``what`` if none."""
    module, _, name = path.partition(":")
    if not module or not name:
        raise ConfigError(f"{what} {path!r} is not module:name")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{what} {path!r}: {exc}") from exc


def simulate(
    app: str,
    workload: Workload,
    *,
    seeds: Iterable[int] = range(100),
    faults: Faults = Faults(),
    invariant: Invariant | None = None,
    services: Services | None = None,
    requests: int = 200,
    workers: int = 3,
    progress: Callable[[SeedResult], None] | None = None,
) -> Report:
    """Run ``app`` (an import path, ``module:graph``) under ``workload`` once per seed (module
    docstring); ``services`` replaces the graph's external services (and those of ``faults.update``)
    for each seed; ``progress`` hears each seed's result as it ends."""
    report = Report(app)
    started = time.monotonic()
    quiet = logging.getLogger("styx")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL + 1)  # the recoveries (and halts) the faults cause: the report says
    try:
        for seed in seeds:
            result = _run_seed(app, workload, seed, faults, invariant, services, requests, workers)
            report.results.append(result)
            if progress is not None:
                progress(result)
    finally:
        quiet.setLevel(level)
        report.seconds = time.monotonic() - started
    return report


def _run_seed(
    app: str,
    workload: Workload,
    seed: int,
    faults: Faults,
    invariant: Invariant | None,
    services: Services | None,
    requests: int,
    workers: int,
) -> SeedResult:
    # The ``random`` module too: a function that wrongly draws from it (instead of ctx.random()) still
    # fails the same way every time its seed runs.
    random.seed(seed)
    try:
        doubles = dict(services(random.Random(seed))) if services is not None else None
        with _installed(doubles, [app, *([faults.update] if faults.update else [])]):
            scenario = _scenario(app, workload, seed, faults, invariant, doubles, requests, workers)
            c = run_simulated(scenario)
    except Exception as exc:  # noqa: BLE001 - a failed check, or the user's code raising: this seed's result
        return SeedResult(seed, False, _failure(exc))
    return SeedResult(seed, True, "", len(c.replies), c.crashes)


@contextlib.contextmanager
def _installed(doubles: dict[str, Service] | None, apps: list[str]) -> Iterator[None]:
    """The graphs at ``apps`` call ``doubles`` instead of their services while it lasts (the workers
    load a graph by import path: the same object)."""
    if not doubles:
        yield
        return
    graphs: list[Graph] = [load_graph(path) for path in apps]
    saved = [dict(g.services) for g in graphs]
    for g in graphs:
        unknown = sorted(set(doubles) - set(g.services))
        if unknown:
            raise ConfigError(f"graph {g.name!r} calls no service named {', '.join(map(repr, unknown))}")
        g.services.update(doubles)
    try:
        yield
    finally:
        for g, before in zip(graphs, saved, strict=True):
            g.services.clear()
            g.services.update(before)


def _failure(exc: BaseException) -> str:
    if isinstance(exc, AssertionError) and str(exc):
        return f"AssertionError: {exc}"
    return "".join(traceback.format_exception(exc)[-6:])


async def _scenario(
    app: str,
    workload: Workload,
    seed: int,
    faults: Faults,
    invariant: Invariant | None,
    doubles: dict[str, Service] | None,
    requests: int,
    workers: int,
) -> SimCluster:
    rng = random.Random(seed)
    calls = iter(workload(random.Random(seed)))
    async with SimCluster(
        app,
        workers=workers,
        seed=seed,
        epoch_size_max=rng.choice([5, 20, 100]),
        snapshot_interval_epochs=rng.choice([1, 2, 4, 8]),
        snapshot_compact_after=4,
        epoch_timeout_ms=300,
        takeover_after_ms=3000,
        egress_ack_lag=rng.choice([0, 2, 8]),
        seqlog_ack_lag=(seed % 3) * 20,
    ) as c:
        events = Events(c, rng)
        events.schedule(faults)
        update_at = rng.randrange(ROUNDS) if faults.update else -1
        per_round = max(1, requests // ROUNDS)
        for step in range(ROUNDS):
            if step < faults.reshapes:
                events.at_random(rng.choice(["join", "drain", "lose"]), 400)
            for call in itertools.islice(calls, per_round):
                operator, key, function, args = call
                c.submit(operator, function, key, *args)
            if step == update_at and faults.update is not None:
                await c.wait_for_replies(len(c.replies) + 1)
                await _deploy(c, faults.update)
            await c.wait(timeout_s=600)
        if c.graph.effects:
            await c.settle()  # the external calls' outcomes and the timers' firings come in as requests
        await check_against_serial(c)
        if invariant is not None:
            problems = list(invariant(c.state()) if doubles is None else invariant(c.state(), doubles))
            assert not problems, "the invariant does not hold: " + "; ".join(problems[:10])
        return c


async def _deploy(c: SimCluster, import_path: str, attempts: int = 20) -> None:
    """Deploy, retrying what a crash refused (a recovery in between, a coordinator that died)."""
    for _ in range(attempts):
        with contextlib.suppress(GraphError):
            await c.deploy(import_path, timeout_s=5.0)
            return
        await asyncio.sleep(0.5)  # virtual time: the recovery that refused it goes on meanwhile
    raise AssertionError(f"the code update to {import_path} was never committed")


class Events:
    """Faults and shape changes, each fired at a random message of the seeded run: ``join``, ``drain``,
    ``lose`` (for good), ``crash`` (a worker, restarted) or ``coordinator``."""

    def __init__(self, c: SimCluster, rng: random.Random, names: Iterator[str] | None = None) -> None:
        self.c, self.rng = c, rng
        # The ids of the workers that join (by default the ones after the cluster's first workers').
        self.names = names or (f"w{i}" for i in itertools.count(len(c.worker_tasks) + 1))

    def schedule(self, faults: Faults) -> None:
        net = self.c.network
        base = net.delivered
        for _ in range(faults.crashes):
            self.at_random("crash", 1500)
        for _ in range(faults.coordinator_crashes):
            self.at_random("coordinator", 1500)
        for _ in range(faults.drops):
            net.faults.drops.add(base + self.rng.randint(20, 1500))
        for _ in range(faults.duplicates):
            net.faults.duplicates.add(base + self.rng.randint(20, 1500))

    def at_random(self, kind: str, within: int) -> None:
        net = self.c.network
        net.faults.at(net.delivered + self.rng.randint(10, within), lambda: self.fire(kind))

    def fire(self, kind: str) -> None:
        c, members = self.c, self._staying()
        if kind == "join" or (kind in ("drain", "lose") and len(members) < 2):
            c.add_worker(next(self.names))
        elif kind == "drain":
            with contextlib.suppress(StyxError):
                c.coordinator.drain(self.rng.choice(members))
        elif kind == "lose":
            c.lose(self.rng.choice(members))
        elif kind == "crash":
            c.crash(self.rng.choice(sorted(c.worker_tasks)))
        else:
            c.crash_coordinator()

    def _staying(self) -> list[str]:
        """The workers that stay once the changes asked for are applied (losing the last one would stall
        the cluster until it comes back)."""
        c = self.c
        alive = set(c.worker_tasks)
        return sorted((set(c.coordinator.workers) - set(c.coordinator.reshaper.pending.leaves)) & alive)
