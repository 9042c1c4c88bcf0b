"""Requests pushed to the workers that read their partitions (:mod:`styx_client.sdk.push`): whether to
push at the client's rate, and the outbox written once per event-loop tick.

A push saves a fetch that Tansu answers after up to half its wait, which is most of a request's latency
at low rates, and costs a write on the client and a wake-up on the worker, which at higher rates cost
more latency than the fetch did (benchmarks/results/pushed-requests.md, request-hops.md). So requests
are pushed only while the client sends fewer than
:data:`~styx_py.core.limits.PUSH_BELOW_REQUESTS_PER_S` a second (:class:`PushRate`), and the worker's
ingress fetch stays the path for every request the push misses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from styx_py.core.limits import (
    MAX_PUSH_BUFFER_BYTES,
    PUSH_AGAIN_BELOW_REQUESTS_PER_S,
    PUSH_BELOW_REQUESTS_PER_S,
    PUSH_RATE_WINDOW_S,
)
from styx_py.core.wire import PushedRequest, encode_frames

__all__ = ["PushRate", "RequestOutbox"]


class PushRate:
    """Whether to push the requests acknowledged now, by how many a second were acknowledged: plain data,
    told the time. It stops at :data:`~styx_py.core.limits.PUSH_BELOW_REQUESTS_PER_S` and goes on again
    below :data:`~styx_py.core.limits.PUSH_AGAIN_BELOW_REQUESTS_PER_S`, so a client sending at about the
    threshold does not switch every window."""

    __slots__ = ("_count", "_pushing", "_start")

    def __init__(self) -> None:
        self._start = -float("inf")  # the window being counted
        self._count = 0
        self._pushing = True  # whether to push during it

    def push(self, now: float) -> bool:
        """One more request acknowledged at ``now`` (monotonic s): whether to push it."""
        elapsed = now - self._start
        if elapsed >= PUSH_RATE_WINDOW_S:
            limit = PUSH_BELOW_REQUESTS_PER_S if self._pushing else PUSH_AGAIN_BELOW_REQUESTS_PER_S
            self._pushing = self._count < limit * elapsed
            self._start, self._count = now, 0
        self._count += 1
        return self._pushing


class RequestOutbox:
    """The acknowledged requests to push, per worker address, written at the end of this event-loop tick
    in one frame per connection; the rate that decides whether to push, and what became of the requests
    acknowledged (:meth:`WorkerLinks.push_request <styx_client.sdk.push.WorkerLinks.push_request>`)."""

    def __init__(self, name: str, writers: Mapping[str, asyncio.StreamWriter]) -> None:
        self.name = name  # the node id the frames come from
        self.writers = writers  # the subscribed connections, by address
        self.rate = PushRate()
        self.waiting: dict[str, list[PushedRequest]] = {}
        self.pushed = 0
        self.not_pushed = 0  # acknowledged with no subscribed owner, or its connection full
        self.too_fast = 0  # acknowledged while the client sent PUSH_BELOW_REQUESTS_PER_S a second or more

    def add(self, address: str, request: PushedRequest) -> None:
        """Push ``request`` to ``address`` with the others of this event-loop tick."""
        out = self.waiting.get(address)
        if out is None:
            if not self.waiting:
                asyncio.get_running_loop().call_soon(self._write)
            out = self.waiting[address] = []
        out.append(request)

    def _write(self) -> None:
        waiting, self.waiting = self.waiting, {}
        for address, requests in waiting.items():
            writer = self.writers.get(address)
            if (
                writer is None
                or writer.is_closing()
                or writer.transport.get_write_buffer_size() > MAX_PUSH_BUFFER_BYTES
            ):
                self.not_pushed += len(requests)
                continue
            writer.writelines(encode_frames(self.name, requests))
            self.pushed += len(requests)
