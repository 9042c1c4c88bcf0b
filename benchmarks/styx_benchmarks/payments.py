"""A small HTTP payment service with a ledger by idempotency key, for the reservation app's tests and
benchmark (:mod:`styx_benchmarks.reservations`).

    python -m styx_benchmarks.payments --port 8700 --delay-ms 100 --fail 0.1 --lose 0.1

``POST /charge`` and ``POST /refund`` take ``{"args": [...]}`` and the ``Idempotency-Key`` header (a
request without one is refused with 400). The first request of a key takes effect and records its
answer; every later one with that key gets the recorded answer and takes no effect (a key reused for
another function or other arguments is refused with 409). Knobs, also settable at run time with
``POST /config``: ``delay_ms`` (each answer waits that long), ``fail`` (the share of requests refused
with 503 before any effect) and ``lose`` (the share whose effect is taken and whose answer is then
replaced by a 503, as a lost answer looks to the caller). ``GET /ledger`` lists every key with its
entry and how often it took effect (``effects``, which must be 1); ``GET /stats`` counts requests.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import msgspec
import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from styx_client.gateway.onewrite import OneWriteProtocol

__all__ = ["Client", "Knobs", "make_app", "serve_in_thread"]

IDLE_S = 4.0  # how long the client reuses an idle keep-alive connection


class Knobs(msgspec.Struct, forbid_unknown_fields=True):
    delay_ms: float = 0.0
    fail: float = 0.0
    lose: float = 0.0


class Body(msgspec.Struct):
    args: list[Any] = msgspec.field(default_factory=list)


class Refused(Exception):
    """An answer other than 200: its status and detail (``{"detail": ...}``, as FastAPI writes one)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


_decode_body = msgspec.json.Decoder(Body).decode
_decode_knobs = msgspec.json.Decoder(Knobs).decode
_encode = msgspec.json.Encoder().encode
_JSON_HEADERS = [(b"content-type", b"application/json")]


def make_app(knobs: Knobs | None = None, seed: int = 0) -> ASGIApp:
    """The service as a bare ASGI app (run it under uvicorn with lifespan off).

    It stands in for the outside world on the machine that runs the cluster, so its CPU is taken from
    the cluster's: 260 to 350 µs per call at 100 calls a second (most of it the event loop waking for
    the request and for its delay), ~45 µs when busy (benchmarks/results/effects.md)."""
    state = {"knobs": knobs or Knobs()}
    rng = random.Random(seed)
    ledger: dict[str, dict[str, Any]] = {}
    effects: dict[str, int] = {}
    stats = {"requests": 0, "refused": 0, "lost": 0, "replayed": 0}

    async def handle(function: str, body: Body, key: str | None) -> dict[str, Any]:
        if not key:
            raise Refused(400, "an Idempotency-Key header is required")
        k = state["knobs"]
        stats["requests"] += 1
        if k.delay_ms:
            await asyncio.sleep(k.delay_ms / 1000)
        if rng.random() < k.fail:
            stats["refused"] += 1
            raise Refused(503, "payment service unavailable")
        entry = ledger.get(key)
        if entry is None:
            if function == "charge":
                who, amount = body.args[0], body.args[1]
                entry = {"kind": "charge", "user": who, "amount": amount, "args": body.args}
            else:
                entry = {"kind": "refund", "charge": body.args[0], "args": body.args}
            ledger[key] = entry
            effects[key] = effects.get(key, 0) + 1
        elif entry["kind"] != function or entry["args"] != body.args:
            raise Refused(409, f"idempotency key {key!r} was used for another request")
        else:
            stats["replayed"] += 1
        if rng.random() < k.lose:
            stats["lost"] += 1
            raise Refused(503, "answer lost")
        return {"ok": True, **{f: v for f, v in entry.items() if f != "args"}}

    async def pay(function: str, scope: Scope, receive: Receive) -> Any:
        body = _decode(_decode_body, await _read(receive))
        if len(body.args) < (wanted := 2 if function == "charge" else 1):
            raise Refused(422, f"{function} takes {wanted} args")
        key = next((v.decode("latin-1") for n, v in scope["headers"] if n == b"idempotency-key"), None)
        return await handle(function, body, key)

    async def configure(scope: Scope, receive: Receive) -> Any:
        state["knobs"] = _decode(_decode_knobs, await _read(receive))
        return state["knobs"]

    async def get_ledger(scope: Scope, receive: Receive) -> Any:
        return {key: {**entry, "effects": effects[key]} for key, entry in ledger.items()}

    async def get_stats(scope: Scope, receive: Receive) -> Any:
        return dict(stats)

    routes: dict[str, tuple[str, Callable[[Scope, Receive], Any]]] = {
        "/charge": ("POST", functools.partial(pay, "charge")),
        "/refund": ("POST", functools.partial(pay, "refund")),
        "/config": ("POST", configure),
        "/ledger": ("GET", get_ledger),
        "/stats": ("GET", get_stats),
    }

    async def route(method: str, path: str, scope: Scope, receive: Receive) -> Any:
        if path not in routes:
            raise Refused(404, "Not Found")
        wanted, handler = routes[path]
        if method != wanted:
            raise Refused(405, "Method Not Allowed")
        return await handler(scope, receive)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http", f"the payment service serves HTTP only, not {scope['type']}"
        try:
            status, answer = 200, await route(scope["method"], scope["path"], scope, receive)
        except Refused as refused:
            status, answer = refused.status, {"detail": refused.detail}
        data = _encode(answer)
        headers = [*_JSON_HEADERS, (b"content-length", str(len(data)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    return app


def _decode(decode: Callable[[bytes], Any], data: bytes) -> Any:
    try:
        return decode(data)
    except msgspec.DecodeError as exc:  # a ValidationError too
        raise Refused(422, str(exc)) from None


async def _read(receive: Receive) -> bytes:
    message = await receive()
    data = message.get("body", b"")
    while message.get("more_body"):
        message = await receive()
        data += message.get("body", b"")
    return bytes(data)


def _config(app: ASGIApp, host: str, port: int) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="off",
        http=OneWriteProtocol,  # httptools; head and body in one write: the caller wakes once
        access_log=False,
        log_level="warning",
    )


class Client:
    """A lean client of the service: ``POST /{function}`` with a JSON body on keep-alive HTTP/1.1
    connections (a pool of idle ones), the JSON answer or ``RuntimeError`` naming the status.

    The effect runner calls a graph's services on the worker's event loop, so their CPU is the
    worker's: httpx spent ~1 ms of it per call here (its connection pool, and an import attempt of
    ``sniffio`` per request where sniffio is not installed), which at 1 000 calls a second left the
    workers' loops no time for their epochs (benchmarks/results/effects.md).

    An idle connection is reused for at most :data:`IDLE_S` (below uvicorn's 5 s keep-alive, after which
    the server closes it: a request written to it would get no answer), and one that ended without a
    complete answer is closed, never pooled again."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self._head = f"HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
        self.idle: list[tuple[float, asyncio.StreamReader, asyncio.StreamWriter]] = []  # (idle since, …)

    async def post(self, function: str, body: Any, headers: dict[str, str]) -> Any:
        data = _encode(body)
        head = f"POST /{function} {self._head}"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        request = (head + f"Content-Length: {len(data)}\r\n\r\n").encode() + data
        reader, writer = await self._connection()
        try:
            writer.write(request)
            try:  # the status line and headers in one read of the buffer, not a readline each
                lines = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
            except asyncio.IncompleteReadError:  # closed before an answer (an idle one the server ended)
                lines = [b""]
            length, close = 0, False
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                name = name.lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"connection" and value.strip().lower() == b"close":
                    close = True
            payload = await reader.readexactly(length)
        except BaseException:
            writer.close()
            raise
        status_line = lines[0]
        if close or not status_line:
            writer.close()
        else:
            self.idle.append((time.monotonic(), reader, writer))
        status = int(status_line.split()[1]) if status_line else 0
        if status != 200:
            raise RuntimeError(f"payment service answered {status}: {payload[:200]!r}")
        return msgspec.json.decode(payload)

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        now = time.monotonic()
        while self.idle:
            since, reader, writer = self.idle.pop()
            if now - since < IDLE_S and not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        return await asyncio.open_connection(self.host, self.port)


@contextmanager
def serve_in_thread(knobs: Knobs | None = None, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Run the service on a thread of this process; yields its base URL."""
    server = uvicorn.Server(_config(make_app(knobs), host, port))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:  # polling uvicorn's flag, bounded by the deadline
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the payment service did not start")
            threading.Event().wait(0.01)
        sock = server.servers[0].sockets[0]
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8700)
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--fail", type=float, default=0.0)
    p.add_argument("--lose", type=float, default=0.0)
    a = p.parse_args()
    knobs = Knobs(delay_ms=a.delay_ms, fail=a.fail, lose=a.lose)
    uvicorn.Server(_config(make_app(knobs), a.host, a.port)).run()


if __name__ == "__main__":
    main()
