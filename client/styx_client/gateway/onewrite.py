"""uvicorn's httptools protocol, writing a response's head and its body in one ``send`` syscall.

uvicorn writes the status line and headers when the app sends ``http.response.start`` and the body
when it sends ``http.response.body``: two writes to the socket per response, and the client, which
may read the head alone, wakes twice. :class:`OneWriteProtocol` gives each request's cycle a
:class:`_HeldHead` in front of the connection's transport: the first write of a cycle (the head) is
held until the next write (the body, sent in the same step of the app's task) and goes out with it;
one the app does not follow with more in the same loop iteration leaves on its own (``call_soon``),
so a streamed or slow body never delays its head. Anything else the cycle asks of the transport
(``close``, ``is_closing``, …) sends a held head first, so the bytes keep their order.

Profiled at 2 000/s (py-spy, ``styx bench ycsbt --via http``): uvicorn's two writes per response were
~10 % of the gateway process's CPU samples.
"""

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

__all__ = ["OneWriteProtocol"]


class _HeldHead:
    """One cycle's view of the connection's transport: its first write waits for its second."""

    __slots__ = ("_flush", "_head", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._head: bytes | None = None
        self._flush: asyncio.Handle | None = None

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            assert self._flush is not None
            self._flush.cancel()
            self._transport.write(head + data)
        elif self._flush is None:  # the cycle's first write
            self._head = data
            self._flush = asyncio.get_running_loop().call_soon(self._send_head)
        else:
            self._transport.write(data)

    def _send_head(self) -> None:
        head, self._head = self._head, None
        if head is not None:
            self._transport.write(head)

    def __getattr__(self, name: str) -> Any:
        self._send_head()
        return getattr(self._transport, name)


class OneWriteProtocol(HttpToolsProtocol):
    """uvicorn's ``HttpToolsProtocol`` (``Config(http=OneWriteProtocol)``) with one write per response."""

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        # Every cycle, pipelined ones too, starts here, after uvicorn gave it the connection's transport.
        cycle.transport = _HeldHead(cycle.transport)  # type: ignore[assignment]
        super()._start_asgi_task(cycle, app)
