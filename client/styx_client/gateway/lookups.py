"""Replies any gateway replica can serve: request ids looked up in the cluster's reply tables.

Every worker keeps the replies it gave, per ingress partition (the table that deduplicates resent
request ids, see :mod:`styx_worker.dedup`). A ``GET /v1/invocations/{id}`` that this process has
neither cached nor pending asks the coordinator (admin ``ReplyLookup``), which asks every worker.

Lookups are coalesced: one admin request at a time per gateway, carrying every id asked for while the
previous one was out (at most ``MAX_LOOKUP_IDS``), so a burst of polls costs one fan-out, not one
each. Ids the workers deferred (their answer's byte budget was spent) go into the next request.

:meth:`ClusterReplies.trace` (the invocation view) is one request of its own for one id that asks the
workers for its invocations too (:mod:`styx_worker.traces`): the call graph and the entities.
"""

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from styx_py.core.errors import StyxError
from styx_py.core.wire import MAX_LOOKUP_IDS, UNDECODABLE, Reply, ReplyLookup, Traced, reply_decoder
from styx_py.io.admin import admin_request

__all__ = ["ClusterReplies", "Found", "LookupSource", "coordinator_lookup"]


class LookupSource(Protocol):
    """Sends one ``ReplyLookup`` and returns the coordinator's answer body (injectable for tests)."""

    def __call__(
        self, request_ids: list[str], traces: bool = False, recent: int = 0
    ) -> Awaitable[Mapping[str, Any]]: ...


_traced = msgspec.msgpack.Decoder(Traced)


@dataclass(frozen=True, slots=True)
class Found:
    """What the cluster knows of one request id."""

    replies: tuple[Reply, ...] = ()
    """Every reply recorded under the id (several only if the id was reused for other keys)."""
    pending: bool = False
    """Running on a worker now: no reply yet."""
    complete: bool = True
    """False when a worker did not answer or is recovering: a miss may not be final."""
    error: str = ""
    """Why the lookup could not be made (coordinator unreachable); nothing else is known then."""
    traces: tuple[Traced, ...] = ()
    """The invocations the workers retain of the id's transactions (:meth:`ClusterReplies.trace`)."""

    @property
    def reply(self) -> Reply | None:
        """The latest reply in the serial order ``(epoch, phase, tid)``, the same on every replica."""
        return max(self.replies, key=lambda r: (r.epoch, r.phase, r.tid), default=None)


def coordinator_lookup(
    address: str, timeout_s: float = 5.0, cluster_secret: str | None = None
) -> LookupSource:
    """The default :data:`LookupSource`: the coordinator's admin port, authenticated like the status."""

    async def lookup(request_ids: list[str], traces: bool = False, recent: int = 0) -> Mapping[str, Any]:
        reply = await admin_request(
            address, ReplyLookup(request_ids, traces, recent), timeout_s=timeout_s, secret=cluster_secret
        )
        if not reply.ok:
            raise StyxError(f"coordinator at {address} refused the reply lookup: {reply.error}")
        return reply.body

    return lookup


class ClusterReplies:
    """Coalesced reply lookups; :meth:`run` (in the gateway's task group) sends them."""

    def __init__(self, source: LookupSource, on_lookup: Callable[[int], None] = lambda ids: None) -> None:
        self.source = source
        self.on_lookup = on_lookup  # called with the number of ids of every admin request sent (metrics)
        self._asked: dict[str, list[asyncio.Future[Found]]] = {}
        self._wake = asyncio.Event()

    def __len__(self) -> int:
        """Request ids waiting for the next lookup."""
        return len(self._asked)

    async def find(self, rid: str) -> Found:
        """What the cluster knows of ``rid`` (joins the next lookup)."""
        future: asyncio.Future[Found] = asyncio.get_running_loop().create_future()
        self._asked.setdefault(rid, []).append(future)
        self._wake.set()
        try:
            return await future
        finally:
            waiters = self._asked.get(rid)
            if waiters is not None and future in waiters:  # cancelled before its lookup was sent
                waiters.remove(future)
                if not waiters:
                    del self._asked[rid]

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._asked:
                continue
            batch = {rid: self._asked.pop(rid) for rid in list(self._asked)[:MAX_LOOKUP_IDS]}
            if self._asked:
                self._wake.set()
            found = await self._lookup(list(batch))
            for rid, futures in batch.items():
                answer = found.get(rid)
                if answer is None:  # deferred by a worker: asked again in the next lookup
                    self._asked.setdefault(rid, []).extend(futures)
                    self._wake.set()
                    continue
                for future in futures:
                    if not future.done():
                        future.set_result(answer)

    async def trace(self, rid: str) -> Found:
        """What the cluster knows of ``rid``, with the invocations of its transactions (not coalesced:
        one admin request of its own)."""
        found = await self._lookup([rid], traces=True)
        return found.get(rid) or Found(complete=False, error="the reply was deferred; retry")

    async def recent(self, n: int) -> tuple[list[tuple[Traced, Found]], bool, str]:
        """Each worker's ``n`` most recent transactions: their roots with what the cluster knows of
        each (its replies, or running), newest first in the serial order; whether every worker
        answered; and why the lookup failed, if it did."""
        self.on_lookup(0)
        try:
            body = await self.source([], False, n)
            replies = [reply_decoder.decode(raw) for raw in body["replies"]]
            pending, complete = set(body["pending"]), bool(body["complete"])
            roots = [_traced.decode(raw) for raw in body.get("traces", ())]
        except (StyxError, OSError, TimeoutError, EOFError, KeyError, TypeError, *UNDECODABLE) as exc:
            return [], False, f"{type(exc).__name__}: {exc}"
        by_id: dict[str, list[Reply]] = {}
        for reply in replies:
            by_id.setdefault(reply.request_id, []).append(reply)
        latest: dict[str, Traced] = {}
        for root in roots:  # a request id whose transactions started on several workers: the latest
            seen = latest.get(root.request_id)
            if seen is None or (root.epoch, root.phase, root.tid) > (seen.epoch, seen.phase, seen.tid):
                latest[root.request_id] = root
        found = [
            (root, Found(tuple(by_id.get(rid, ())), rid in pending, complete)) for rid, root in latest.items()
        ]
        found.sort(key=lambda rf: (rf[0].epoch, rf[0].phase, rf[0].tid), reverse=True)
        return found, complete, ""

    async def _lookup(self, rids: list[str], traces: bool = False) -> dict[str, Found]:
        """One admin request; every id's answer (missing: deferred)."""
        self.on_lookup(len(rids))
        try:
            body = await (self.source(rids, True) if traces else self.source(rids))
            replies = [reply_decoder.decode(raw) for raw in body["replies"]]
            pending, deferred = set(body["pending"]), set(body["deferred"])
            complete = bool(body["complete"])
            traced = [_traced.decode(raw) for raw in body.get("traces", ())]
        except (StyxError, OSError, TimeoutError, EOFError, KeyError, TypeError, *UNDECODABLE) as exc:
            return {rid: Found(complete=False, error=f"{type(exc).__name__}: {exc}") for rid in rids}
        by_id: dict[str, list[Reply]] = {}
        for reply in replies:
            by_id.setdefault(reply.request_id, []).append(reply)
        return {
            rid: Found(
                tuple(by_id.get(rid, ())),
                rid in pending,
                complete,
                traces=tuple(t for t in traced if t.request_id == rid),
            )
            for rid in rids
            if rid in by_id or rid not in deferred
        }
