"""Admin reads over kept connections (:class:`styx_py.io.admin.AdminConnections`), against a stand-in
admin port that speaks the real handshake and frames: a run of requests pays one connection, one that
finds its kept connection closed goes again on a new one, and a connection whose exchange failed is
never given back."""

from __future__ import annotations

import asyncio

import pytest

from styx_py.core.wire import (
    HEADER_BYTES,
    AdminReply,
    Batch,
    ReadState,
    decode_batch,
    encode_frame,
    frame_length,
)
from styx_py.io.admin import AdminConnections
from styx_py.io.handshake import accept_handshake
from tests.test_transport_security import until

SECRET = "admin-connections-secret"


class StandIn:
    """Answers each ReadState with its operator's name; ``close_after`` answers per connection, then
    closes it without answering the next; ``silent`` never answers."""

    def __init__(self, close_after: int | None = None, silent: bool = False) -> None:
        self.accepted = 0
        self.requests = 0
        self.close_after, self.silent = close_after, silent
        self.server: asyncio.Server | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        await accept_handshake(reader, writer, SECRET.encode())
        answered = 0
        try:
            while True:
                header = await reader.readexactly(HEADER_BYTES)
                for m in decode_batch(await reader.readexactly(frame_length(header)), "coordinator").msgs:
                    if not isinstance(m, ReadState):
                        continue
                    self.requests += 1
                    if self.silent or (self.close_after is not None and answered >= self.close_after):
                        if not self.silent:
                            writer.close()
                            return
                        continue
                    answered += 1
                    writer.write(
                        encode_frame(Batch("coordinator", [AdminReply(True, "", {"op": m.operator})]))
                    )
        except asyncio.IncompleteReadError:
            writer.close()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


async def test_requests_in_a_row_share_one_connection() -> None:
    stand_in = StandIn()
    reads = AdminConnections(await stand_in.start(), secret=SECRET, timeout_s=10)
    answers = [(await reads(ReadState(f"op{i}"))).body["op"] for i in range(5)]
    assert answers == [f"op{i}" for i in range(5)]
    assert stand_in.accepted == 1
    both = await asyncio.gather(reads(ReadState("a")), reads(ReadState("b")))
    assert [r.body["op"] for r in both] == ["a", "b"]
    assert stand_in.accepted == 2, "two at once take two connections"
    assert len(reads.idle) == 2
    await reads.aclose()
    assert reads.idle == []


async def test_a_kept_connection_closed_meanwhile_is_replaced_and_the_request_sent_again() -> None:
    stand_in = StandIn(close_after=1)
    reads = AdminConnections(await stand_in.start(), secret=SECRET, timeout_s=10)
    assert (await reads(ReadState("first"))).body["op"] == "first"
    assert (await reads(ReadState("second"))).body["op"] == "second"
    assert stand_in.accepted == 2 and stand_in.requests == 3, "sent on the kept one, then again on a new one"
    await reads.aclose()


async def test_a_timed_out_exchange_closes_its_connection() -> None:
    stand_in = StandIn(silent=True)
    reads = AdminConnections(await stand_in.start(), secret=SECRET, timeout_s=0.2)
    with pytest.raises(TimeoutError):
        await reads(ReadState("never"))
    assert reads.idle == [], "a connection that may still carry a late answer is not kept"


async def test_an_idle_connection_is_closed_after_its_idle_time() -> None:
    stand_in = StandIn()
    reads = AdminConnections(await stand_in.start(), secret=SECRET, timeout_s=10, idle_s=0.05)
    await reads(ReadState("x"))
    ((conn, _timer),) = reads.idle
    await until(lambda: not reads.idle, "the idle connection closed", 10)
    assert conn.writer.is_closing()
