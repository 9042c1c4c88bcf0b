"""The client's task group: a background task that fails breaks the client, fails what is in flight
with the cause, refuses new requests, and is raised from close(). No broker: a transport that fails."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

from styx_client.sdk import StyxClient
from styx_client.sdk.config import ClientConfig
from styx_client.sdk.entry import Pending
from styx_client.sdk.resting import EgressRest
from styx_client.sdk.transport import Batching, Opened, TransportEvents
from styx_py.core.errors import StyxError


class BrokenListing(Exception):
    """What the fake broker raises when asked for the ingress segments."""


class SegmentsFail:
    """A transport whose records are never acknowledged and whose look at the segments raises."""

    def __init__(self) -> None:
        self.closed = False
        self.produced: list[bytes] = []

    async def open(
        self,
        config: ClientConfig,
        operators: Mapping[str, int],
        events: TransportEvents,
        rest: EgressRest | None,
        reply_to: str,
    ) -> Opened:
        return Opened(0, 0)

    def start(self, group: asyncio.TaskGroup) -> None:
        pass

    def produce(self, segment: int, partition: int, key: bytes, value: bytes, entry: Pending) -> int:
        self.produced.append(key)
        return 1

    def push_request(self, entry: Pending, segment: int, offset: int) -> None:
        pass

    @property
    def pushes_healthy(self) -> bool:
        return False

    def ask_workers_soon(self) -> None:
        pass

    async def newest_segment(self, known: int) -> int | None:
        raise BrokenListing("the listing broke")

    async def follow_egress(self, newest: int) -> bool:
        return True

    def retire(self, keep: set[int]) -> None:
        pass

    def wall_ms(self) -> int:
        return 0

    @property
    def batching(self) -> Batching:
        return Batching(0, 0, 0)

    @property
    def requests_pushed(self) -> int:
        return 0

    async def close(self) -> None:
        self.closed = True


async def test_a_failing_segment_follower_fails_pending_requests_and_surfaces_at_close() -> None:
    transport = SegmentsFail()
    client = StyxClient("fake:0", {"acct": 2}, transport=transport, segment_poll_s=0.01, timeout_s=600)
    await client.start()
    pending = client.submit_future("acct", "k", "deposit", 1)
    assert transport.produced == [pending_id(client)]
    with pytest.raises(StyxError, match="background task failed") as failed:
        await pending
    assert isinstance(failed.value.__cause__, BrokenListing)
    assert client.pending_count == 0 and client.stats.timeouts == 0
    # A broken client refuses at once, naming the cause.
    with pytest.raises(StyxError, match="BrokenListing") as refused:
        client.submit_future("acct", "k", "deposit", 2)
    assert isinstance(refused.value.__cause__, BrokenListing)
    with pytest.raises(BrokenListing):
        await client.close()
    assert transport.closed
    await client.close()  # closed already: nothing more to raise


def pending_id(client: StyxClient) -> bytes:
    return f"{client.request_id_prefix}{0:012x}".encode()
