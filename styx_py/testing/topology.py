"""How the workers' epoch reports could travel, emulated under the unchanged workers.

The workers send every ExecDone, Vote and Revote to every peer (and a Vote or Revote to the
coordinator too): n² messages per round. :class:`ReportRoutes` carries the same reports through hubs
instead, for :class:`~styx_py.testing.latency.TimedNetwork` to measure what such a topology would
cost: each worker's report goes once to its hub; a hub that has its whole group's reports sends them
as one bundle to every other hub (and a Vote's or Revote's to the coordinator, unless it is the hub);
a hub that has every worker's sends each member one bundle of the copies addressed to it. The
workers receive exactly the reports they would have, later and in fewer messages.

* ``relay``: the coordinator is every worker's hub: 2n messages per round;
* ``tree``: groups of ⌈√n⌉ workers in name order, the first of each its hub:
  2(n - h) + h(h - 1) messages per round for h hubs, plus h bundles of Votes to the coordinator.

Bundles are counted as ``<type> bundle``, with the bytes of the one-message frames they carry; the
receiver of one pays ``bundled_cpu_us`` per report in it beyond the first (LatencyModel).
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Callable, Mapping
from typing import Protocol

from styx_py.core.wire import COORDINATOR, ExecDone, Message, Revote, Vote

__all__ = ["REPORTS", "TOPOLOGIES", "ReportRoutes"]

REPORTS = (ExecDone, Vote, Revote)
TOPOLOGIES = ("all-to-all", "relay", "tree")
Report = tuple[type, int, int]  # (message type, epoch, generation)


class Carrier(Protocol):
    """What the routes need of the network that carries the packets (TimedNetwork)."""

    @property
    def inboxes(self) -> Mapping[str, str]: ...  # each node's channel ("worker", "coordinator", …)

    @property
    def handlers(self) -> Mapping[str, object]: ...  # the nodes running now

    def transmit(
        self,
        src: str,
        dest: str,
        kind: str,
        epoch: int | None,
        items: list[tuple[str, Message]],
        size: int,
        then: Callable[[], None] | None = None,
        carried: int = 1,
    ) -> None: ...

    def deliver(self, node: str, src: str, msg: Message) -> None: ...


class ReportRoutes:
    def __init__(self, network: Carrier, topology: str) -> None:
        assert topology in TOPOLOGIES[1:], f"topology: one of {TOPOLOGIES}, not {topology!r}"
        self.net = network
        self.topology = topology
        self.hubs: dict[Report, dict[str, str]] = {}  # per report: each worker's hub
        self.held: dict[tuple[Report, str], list[tuple[str, Message]]] = {}  # copies, by receiver
        self.sizes: dict[tuple[Report, str], int] = {}  # a sender's report: its frame's bytes
        self.known: dict[tuple[Report, str], set[str]] = {}  # whose reports a hub has
        self.forwarded: set[tuple[Report, str]] = set()

    def _hubs(self) -> dict[str, str]:
        net = self.net
        workers = sorted(n for n, box in net.inboxes.items() if box == "worker" and n in net.handlers)
        if self.topology == "relay":
            return dict.fromkeys(workers, COORDINATOR)
        group = math.isqrt(max(0, len(workers) - 1)) + 1  # ⌈√n⌉
        return {w: workers[i - i % group] for i, w in enumerate(workers)}

    def send(self, src: str, dest: str, msg: ExecDone | Vote | Revote, size: int) -> None:
        """One copy of a report: held for its receiver; the first one's send is the upload."""
        report: Report = (type(msg), msg.epoch, msg.gen)
        hubs = self.hubs.setdefault(report, self._hubs())
        self.held.setdefault((report, dest), []).append((src, msg))
        if (report, src) in self.sizes:
            return
        self.sizes[report, src] = size
        learn = functools.partial(self._learn, report, hubs[src], {src})
        if hubs[src] == src:
            asyncio.get_running_loop().call_soon(learn)  # once every copy of this send is held
            return
        self.net.transmit(src, hubs[src], type(msg).__name__, msg.epoch, [], size, learn)

    def _learn(self, report: Report, node: str, senders: set[str]) -> None:
        """``node`` has the reports of ``senders``: the coordinator handles its copies; a hub forwards
        its group's once complete, and hands out every copy once it has every worker's."""
        hubs = self.hubs[report]
        if node == COORDINATOR:
            mine = self.held.get((report, COORDINATOR), [])
            for src, msg in [c for c in mine if c[0] in senders]:
                self.net.deliver(COORDINATOR, src, msg)
        if node not in hubs.values():
            return
        known = self.known.setdefault((report, node), set())
        known |= senders
        group = {w for w, h in hubs.items() if h == node}
        kind, epoch = f"{report[0].__name__} bundle", report[1]
        if group <= known and (report, node) not in self.forwarded:
            self.forwarded.add((report, node))
            size = sum(self.sizes[report, w] for w in group)
            to = sorted(set(hubs.values()) - {node})
            if report[0] is not ExecDone and COORDINATOR not in hubs.values():
                to.append(COORDINATOR)
            for other in to:
                learn = functools.partial(self._learn, report, other, group)
                self.net.transmit(node, other, kind, epoch, [], size, learn, len(group))
        if len(known) < len(hubs):
            return
        for member in sorted(group):
            copies = self.held.pop((report, member), [])
            if member == node:
                for src, msg in copies:
                    self.net.deliver(node, src, msg)
            else:
                size = sum(self.sizes[report, src] for src, _ in copies)
                self.net.transmit(node, member, kind, epoch, copies, size, None, len(copies))
