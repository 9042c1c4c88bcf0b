"""The gateway's uvicorn protocol writes a response's head and body in one write, and keeps order."""

import asyncio
from typing import Any

import httpx
import pytest

from styx_client.gateway.onewrite import OneWriteProtocol, _HeldHead
from styx_client.gateway.server import bind_socket


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True
        self.writes.append(b"<close>")


async def test_head_and_body_leave_in_one_write() -> None:
    transport = FakeTransport()
    held = _HeldHead(transport)  # type: ignore[arg-type]
    held.write(b"HEAD")
    assert transport.writes == []
    held.write(b"BODY")
    held.write(b"MORE")
    assert transport.writes == [b"HEADBODY", b"MORE"]
    await asyncio.sleep(0)  # the cancelled flush sends nothing twice
    assert transport.writes == [b"HEADBODY", b"MORE"]


async def test_a_head_alone_leaves_at_the_next_loop_iteration() -> None:
    transport = FakeTransport()
    held = _HeldHead(transport)  # type: ignore[arg-type]
    held.write(b"HEAD")
    await asyncio.sleep(0)
    assert transport.writes == [b"HEAD"]
    held.write(b"BODY")
    assert transport.writes == [b"HEAD", b"BODY"]


async def test_anything_else_sends_the_held_head_first() -> None:
    transport = FakeTransport()
    held = _HeldHead(transport)  # type: ignore[arg-type]
    held.write(b"HEAD")
    assert held.is_closing() is False
    held.close()
    assert transport.writes == [b"HEAD", b"<close>"]


@pytest.mark.parametrize("pipelined", [1, 3])
async def test_a_served_response_arrives_whole(pipelined: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    # Every cycle uvicorn serves goes through the held head (the hook is a uvicorn internal: an
    # upgrade that drops it fails here instead of silently writing twice).
    held: list[_HeldHead] = []
    init = _HeldHead.__init__

    def recording_init(self: _HeldHead, transport: asyncio.Transport) -> None:
        init(self, transport)
        held.append(self)

    monkeypatch.setattr(_HeldHead, "__init__", recording_init)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        await receive()
        body = scope["path"].encode()
        headers = [(b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    sock = bind_socket("127.0.0.1", 0)  # listening already: connections wait in its backlog
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, http=OneWriteProtocol, lifespan="off", log_config=None)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        # Pipelined requests on one connection: each answer whole and in order.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"".join(b"GET /r%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(pipelined)))
        for i in range(pipelined):
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 OK\r\n")
            assert await reader.readexactly(len(b"/r%d" % i)) == b"/r%d" % i
        writer.close()
        assert len(held) == pipelined
        # Each head left joined with its body: its lone-head flush was cancelled, never run.
        assert all(h._flush is not None and h._flush.cancelled() for h in held)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            response = await http.get("/plain")
        assert (response.status_code, response.text) == (200, "/plain")
    finally:
        server.should_exit = True
        await task
        sock.close()
