"""The simulation's clients: the real :class:`~styx_client.sdk.StyxClient` s that send every request of a
:class:`~styx_py.testing.cluster.SimCluster`, each on the in-memory transport
(:mod:`styx_py.testing.client_transport`), and each submission's future."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping

import msgspec

from styx_client.sdk import StyxClient
from styx_py.core.config import Config
from styx_py.core.segments import FRESH_S, MIN_PERIOD_S
from styx_py.core.wire import Reply, Request
from styx_py.testing.client_transport import MemoryTransport
from styx_py.testing.memory import MemoryLog, MemoryNetwork
from styx_py.testing.submissions import Submissions, call_of

__all__ = ["CLIENT_TIMEOUT_S", "SimClients"]

# The simulation's clients wait this long (virtual time) before a request times out: longer than any
# run, so a request that is never answered fails the run's own check instead.
CLIENT_TIMEOUT_S = 10_000.0


class SimClients:
    """2-3 seeded clients (:meth:`start`) and what each submission came to (:meth:`check`)."""

    def __init__(
        self,
        seed: int,
        config: Config,
        log: MemoryLog,
        network: MemoryNetwork,
        sent: Submissions,
        placement: Callable[[], dict[str, list[int]]],
        wake: Callable[[], None],
        resting: bool | None = None,
    ) -> None:
        self.rng = random.Random(seed)
        # Whether the clients with pushed replies let their egress reader rest: all of them, none, or
        # (None) every second one (the workers' egress marks follow the event loop's virtual clock).
        self.resting = resting
        self.config = config
        self.log = log
        self.network = network
        self.sent = sent
        self.placement = placement  # each worker and the ingress partitions it reads
        self.wake = wake  # a submission settled
        self.clients: list[StyxClient] = []
        self.futures: list[tuple[int, str, asyncio.Future[Reply]]] = []  # (client, request id, reply)
        self.sent_by: dict[str, set[int]] = {}  # the clients each request id was sent through
        self.last_sent: dict[str, Request] = {}  # the request each id was last sent for

    async def start(self, operators: Mapping[str, int], n_partitions: int) -> None:
        for i in range(self.rng.randint(2, 3)):
            client = self._new_client(i, operators, n_partitions)
            await client.start()
            self.clients.append(client)

    def _new_client(self, i: int, operators: Mapping[str, int], n_partitions: int) -> StyxClient:
        """A seeded client: its reply partition (some read every one), pushed replies and requests on or
        off, and how often it looks for a newer ingress segment (a slow one writes late to older ones); one
        with pushed replies lets its egress reader rest as :attr:`resting` says."""
        rng, cfg = self.rng, self.config
        push = rng.random() < 0.6
        # A client's write counts as read for sure FRESH_S after a look, which must stay below the
        # cluster's shortest segment period (MIN_PERIOD_S, which real coordinators enforce): the
        # simulation's segments are milliseconds long, so its clients' timings shrink with them. A slow
        # client looks only every few periods, and so writes late to older segments.
        period = cfg.log_segment_s
        fresh_s = FRESH_S if not period else period * FRESH_S / MIN_PERIOD_S
        poll_s = rng.choice((fresh_s / 2, fresh_s / 2, 4 * max(period, fresh_s)))
        transport = MemoryTransport(
            self.log, self.network, rng.randrange(1 << 30), self.placement, self.sent.on_write
        )
        return StyxClient(
            "memory",
            operators,
            ingress_topic=cfg.ingress_topic,
            egress_topic=cfg.egress_topic,
            max_pending=1_000_000,
            shed_when_refused=False,  # the simulation offers the cluster everything it sends
            timeout_s=CLIENT_TIMEOUT_S,
            client_id=f"sim-client-{i}",
            reply_partition=rng.randrange(-1, n_partitions),
            coordinator="memory" if push else None,
            push_requests=rng.random() < 0.5,
            rest_egress=i % 2 == 1 if self.resting is None else self.resting,
            request_id_prefix=f"sim{i}-",
            segment_poll_s=poll_s,
            fresh_s=fresh_s,
            transport=transport,
        )

    def send(self, req: Request) -> None:
        """Send ``req`` through one of the clients (seeded)."""
        rid = req.request_id
        sent_by = self.sent_by.setdefault(rid, set())
        # A client with the id in flight would join it (no new send); one that sent it for another request
        # recently would refuse it (a test that reuses an id for another request).
        free = [i for i, c in enumerate(self.clients) if not c.is_pending(rid)]
        previous = self.last_sent.get(rid)
        other = previous is not None and call_of(previous) != call_of(req)
        fresh = [i for i in free if i not in sent_by] if other else free
        i = self.rng.choice(fresh or free or range(len(self.clients)))
        client = self.clients[i]
        if i in free:
            self.sent.submissions[rid] += 1
        sent_by.add(i)
        self.last_sent[rid] = req
        self.sent.routes.setdefault(rid, set()).add(client.reply_partition)
        args = msgspec.msgpack.decode(req.args)
        future = client.submit_future(req.operator, req.key, req.function, *args, request_id=rid)
        future.add_done_callback(self._settled)
        self.futures.append((i, rid, future))

    def _settled(self, future: asyncio.Future[Reply]) -> None:
        if not future.cancelled():
            future.exception()  # looked at by check()
        self.wake()

    def waiting(self) -> bool:
        """A client still waits for a reply."""
        return any(not f.done() for _, _, f in self.futures)

    def set_deployment(self, operators: Mapping[str, int]) -> None:
        for client in self.clients:
            client.set_deployment(operators)

    async def close(self) -> None:
        for client in self.clients:
            await client.close()  # raises what failed in one of its tasks

    def check(self) -> None:
        """Every submission settled exactly once at its client, with the reply the egress log holds for
        its request id; no client counted a timeout or lost a task."""
        logged = {r.request_id: r for r in self.sent.replies}
        for i, rid, future in self.futures:
            assert future.done(), f"client {i} still waits for {rid}"
            assert future.exception() is None, (i, rid, future.exception())
            assert future.result() == logged[rid], (i, rid, future.result(), logged.get(rid))
        for client in self.clients:
            assert client.stats.timeouts == 0 and client.pending_count == 0, client.stats
            answered = sum(1 for i, _, _ in self.futures if self.clients[i] is client)
            assert client.stats.replied <= answered, (client.stats, answered)
