"""Internal ports: authenticated connections, refused and counted bad frames, bounded memory, timeouts,
and handler exceptions that end the process.

Real TCP on loopback throughout. Timeouts run on a :class:`ManualClock` the test advances (no test waits
for a timeout in real time); memory is measured, not timed: the transport's inbound budget and the
traced allocations (in process), the peak RSS of a real ``styx coordinator`` (out of process).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import tracemalloc
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from styx_client.sdk import StyxClient
from styx_py.core.config import load_config
from styx_py.core.errors import ConfigError
from styx_py.core.limits import MAX_FRAME_BYTES, MAX_INBOUND_BYTES
from styx_py.core.wire import (
    AdminReply,
    Batch,
    ClusterView,
    EpochStart,
    Heartbeat,
    Inbox,
    Message,
    Register,
    StatusRequest,
    WorkerInfo,
    encode_frame,
)
from styx_py.io.admin import admin_request
from styx_py.io.handshake import HandshakeFailed, dial_handshake, require_secret
from styx_py.io.links import TransportLimits
from styx_py.io.tcp import EXIT_HANDLER_FAILED, HandlerFailed, TcpTransport
from styx_py.stack.net import free_port
from tests.service_fixtures import ClusterFactory

SECRET = "test-cluster-secret-0123456789"
MiB = 1024 * 1024
STYX = [sys.executable, "-m", "styx_py.cli"]


class ManualClock:
    """A :class:`~styx_py.core.ports.Clock` whose time moves only when the test calls :meth:`advance`."""

    def __init__(self) -> None:
        self.t = 1000.0
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self.t

    def _at(self, when: float, fire: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (when, next(self._seq), fire))

    async def sleep(self, seconds: float) -> None:
        done = asyncio.get_running_loop().create_future()
        self._at(self.t + seconds, lambda: None if done.done() else done.set_result(None))
        await done

    def timeout(self, seconds: float) -> AbstractAsyncContextManager[object]:
        @asynccontextmanager
        async def expiring() -> AsyncIterator[object]:
            scope = asyncio.timeout(None)
            inside = True

            def fire() -> None:
                if inside and not scope.expired():
                    scope.reschedule(asyncio.get_running_loop().time())

            async with scope:
                self._at(self.t + seconds, fire)
                try:
                    yield scope
                finally:
                    inside = False

        return expiring()

    def advance(self, seconds: float) -> None:
        self.t += seconds
        while self._timers and self._timers[0][0] <= self.t:
            heapq.heappop(self._timers)[2]()


async def until(predicate: Callable[[], bool], what: str, deadline_s: float = 30.0) -> None:
    """Poll ``predicate`` (a condition on real state, never on elapsed time) up to a generous deadline."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while not predicate():
        if loop.time() > end:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.005)


class Node:
    """A started :class:`TcpTransport` that records what its handler got; its ``run()`` as a task."""

    def __init__(
        self,
        node_id: str,
        inbox: Inbox,
        *,
        secret: str = SECRET,
        clock: ManualClock | None = None,
        limits: TransportLimits | None = None,
        handler: Callable[[str, Message], None] | None = None,
    ) -> None:
        self.got: list[tuple[str, Message]] = []
        self.transport = TcpTransport(
            node_id,
            handler or (lambda src, msg: self.got.append((src, msg))),
            inbox=inbox,
            secret=secret,
            clock=clock,
            limits=limits,
        )
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Node:
        await self.transport.start()
        self.task = asyncio.get_running_loop().create_task(self.transport.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        with pytest.raises((asyncio.CancelledError, HandlerFailed)):
            await self.task
        await self.transport.close()

    @property
    def refused(self) -> dict[str, int]:
        return {k: v for k, v in self.transport.refusals.counts.items() if v}


async def raw(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def authenticated(
    port: int, node_id: str, secret: str = SECRET
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await raw(port)
    await dial_handshake(reader, writer, secret.encode(), node_id, "test-incarnation")
    return reader, writer


async def closed_by_peer(reader: asyncio.StreamReader) -> bool:
    """True once the other side closed: EOF or a reset, after whatever it had sent."""
    try:
        while await reader.read(65536):
            pass
    except ConnectionError:
        pass
    return True


def register(node_id: str = "w1") -> bytes:
    return encode_frame(Batch(node_id, [Register(node_id, "127.0.0.1", 1)], "spoofed"))


# ---- authentication ---------------------------------------------------------------------------------------


async def test_authenticated_nodes_talk_both_ways() -> None:
    async with Node("coordinator", "coordinator") as coordinator, Node("w1", "worker") as worker:
        worker.transport.set_address("coordinator", "127.0.0.1", coordinator.transport.port)
        worker.transport.send("coordinator", Heartbeat("w1", 3))
        await until(lambda: len(coordinator.got) == 1, "the coordinator hears the worker")
        assert coordinator.got == [("w1", Heartbeat("w1", 3))]
        coordinator.transport.send("w1", Heartbeat("coordinator", 4))  # back on the worker's connection
        await until(lambda: len(worker.got) == 1, "the worker hears the coordinator")
        assert worker.got == [("coordinator", Heartbeat("coordinator", 4))]
        large = Register("w1", "h" * (5 * MiB), 1)  # read piece by piece into one buffer
        worker.transport.send("coordinator", large)
        await until(lambda: len(coordinator.got) == 2, "a large frame arrives whole")
        assert coordinator.got[1] == ("w1", large) and coordinator.transport.budget.used == 0
        assert not coordinator.refused and not worker.refused


async def test_a_node_with_another_secret_is_refused_both_ways() -> None:
    other = "another-cluster-secret-0123"
    async with Node("coordinator", "coordinator") as coordinator, Node("w1", "worker", secret=other) as w1:
        w1.transport.set_address("coordinator", "127.0.0.1", coordinator.transport.port)
        w1.transport.send("coordinator", Register("w1", "127.0.0.1", 1))
        await until(lambda: coordinator.refused == {"unauthenticated": 1}, "the wrong secret is refused")
        assert not coordinator.got and "coordinator" not in w1.transport.writers
        # The other way round: a dialer with the right secret does not trust an acceptor without it.
        reader, writer = await raw(w1.transport.port)
        with pytest.raises(HandshakeFailed):
            await dial_handshake(reader, writer, SECRET.encode(), "coordinator", "x")
        writer.close()
        await until(lambda: w1.refused == {"unauthenticated": 1}, "the acceptor refuses the dialer")


async def test_a_spoofed_frame_without_the_handshake_changes_nothing() -> None:
    async with Node("coordinator", "coordinator") as coordinator:
        port = coordinator.transport.port
        reader, writer = await raw(port)
        writer.write(register("w1"))  # a valid frame claiming to be w1, where a Hello belongs
        assert await closed_by_peer(reader)
        # An announced 16 MiB frame before authenticating is refused at its header.
        reader, writer = await raw(port)
        writer.write(struct.pack(">I", MAX_FRAME_BYTES) + b"\0" * 1000)
        assert await closed_by_peer(reader)
        await until(lambda: coordinator.refused == {"unauthenticated": 2}, "both are counted")
        assert coordinator.got == [] and coordinator.transport.links == {}
        assert "w1" not in coordinator.transport.writers and coordinator.transport.accepted == 0


async def test_frames_of_the_wrong_channel_or_garbage_close_only_their_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "styx.transport")
    async with Node("coordinator", "coordinator") as coordinator:
        port = coordinator.transport.port
        good_reader, good = await authenticated(port, "w2")
        cases = {
            # coordinator → worker
            "wrong_channel": encode_frame(Batch("w1", [EpochStart(1, 0, False, False, 0)])),
            "undecodable": struct.pack(">I", 5) + b"\xc1\xc1\xc1\xc1\xc1",
            "spoofed_source": register("w9"),  # authenticated as w1, claims w9
            "oversized_frame": struct.pack(">I", MAX_FRAME_BYTES + 1),
        }
        for reason, frame in cases.items():
            reader, writer = await authenticated(port, "w1")
            writer.write(frame)
            assert await closed_by_peer(reader), reason
        await until(lambda: coordinator.refused == dict.fromkeys(cases, 1), "each refusal is counted")
        assert coordinator.got == []
        good.write(register("w2"))  # the other connection is unaffected
        await until(lambda: len(coordinator.got) == 1, "a good frame on another connection is handled")
        assert coordinator.got[0][0] == "w2" and coordinator.task is not None and not coordinator.task.done()
        good.close()
        del good_reader
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "refused" in r.getMessage()]
    assert warnings and all("127.0.0.1:" in r.getMessage() for r in warnings), "logged with the peer address"


async def test_refusals_are_logged_at_most_once_a_second(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "styx.transport")
    clock = ManualClock()
    async with Node("coordinator", "coordinator", clock=clock) as coordinator:
        for _ in range(10):
            reader, writer = await raw(coordinator.transport.port)
            writer.write(register())
            await closed_by_peer(reader)
        await until(lambda: coordinator.refused == {"unauthenticated": 10}, "all counted")
        clock.advance(1.5)
        reader, writer = await raw(coordinator.transport.port)
        writer.write(register())
        await closed_by_peer(reader)
        await until(lambda: coordinator.refused == {"unauthenticated": 11}, "counted")
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 2 and "9 more refused" in lines[1]


async def test_admin_requests_authenticate() -> None:
    def answer(src: str, msg: Message) -> None:
        assert isinstance(msg, StatusRequest)
        coordinator.transport.send(src, AdminReply(True, "", {"hello": src}))

    coordinator = Node("coordinator", "coordinator", handler=answer)
    async with coordinator:
        address = f"127.0.0.1:{coordinator.transport.port}"
        reply = await admin_request(address, StatusRequest(), 10.0, secret=SECRET)
        assert reply.ok and reply.body["hello"].startswith("admin-")
        with pytest.raises(HandshakeFailed, match="STYX_CLUSTER_SECRET"):
            await admin_request(address, StatusRequest(), 10.0, secret="not-the-cluster-secret")
        await until(lambda: coordinator.refused == {"unauthenticated": 1}, "counted")


def test_a_short_secret_is_a_config_error_that_does_not_show_it() -> None:
    with pytest.raises(ConfigError, match=r"cluster_secret \(STYX_CLUSTER_SECRET\): \(hidden\)") as bad:
        load_config(env={"STYX_CLUSTER_SECRET": "too-short"})
    assert "too-short" not in str(bad.value)
    assert load_config(env={"STYX_CLUSTER_SECRET": SECRET}).cluster_secret == SECRET
    assert load_config(env={}).cluster_secret == ""


def test_an_empty_secret_is_refused_off_loopback() -> None:
    with pytest.raises(ConfigError, match=r"cluster_secret \(STYX_CLUSTER_SECRET\) is required"):
        require_secret("", "0.0.0.0", "coordinator")
    require_secret("", "127.0.0.1", "coordinator")
    require_secret("", "localhost", "coordinator")
    require_secret(SECRET, "0.0.0.0", "coordinator")


# ---- time: half-open, idle and live connections ----------------------------------------------------------


async def test_half_open_and_idle_connections_are_closed_on_the_clock() -> None:
    clock = ManualClock()
    limits = TransportLimits(idle_timeout_s=60.0, frame_timeout_s=10.0, handshake_timeout_s=5.0)
    async with Node("coordinator", "coordinator", clock=clock, limits=limits) as coordinator:
        port = coordinator.transport.port
        mute_reader, _mute = await raw(port)  # never says Hello
        await until(lambda: coordinator.transport.accepted == 1, "accepted")
        half_reader, half = await authenticated(port, "w1")
        half.write(struct.pack(">I", 1000) + b"x" * 400)  # 400 of 1000 bytes, then silence
        idle_reader, _idle = await authenticated(port, "w2")
        await until(lambda: len(coordinator.transport.links) == 2, "both authenticated")
        await until(
            lambda: any(link.stage.value == "reading" for link in coordinator.transport.links.values()),
            "the half frame is being read",
        )
        clock.advance(5.0 + limits.tick_s)
        assert await closed_by_peer(mute_reader)
        assert coordinator.refused == {"handshake_timeout": 1}
        assert len(coordinator.transport.links) == 2
        clock.advance(10.0)
        await until(lambda: coordinator.refused.get("frame_timeout") == 1, "the half frame times out")
        assert await closed_by_peer(half_reader)
        assert len(coordinator.transport.links) == 1
        clock.advance(60.0)
        assert await closed_by_peer(idle_reader)
        await until(lambda: coordinator.transport.refusals.idle_closed == 1, "the idle one is closed")
        assert coordinator.transport.links == {} and coordinator.got == []


async def test_keepalives_hold_a_quiet_live_link_open() -> None:
    clock = ManualClock()
    limits = TransportLimits(idle_timeout_s=3.0, frame_timeout_s=1.0)
    async with (
        Node("coordinator", "coordinator", clock=clock, limits=limits) as coordinator,
        Node("w1", "worker", clock=clock, limits=limits) as w1,
    ):
        w1.transport.set_address("coordinator", "127.0.0.1", coordinator.transport.port)
        w1.transport.send("coordinator", Heartbeat("w1", 1))
        await until(lambda: len(coordinator.got) == 1, "linked")
        link = next(iter(coordinator.transport.links.values()))
        for _ in range(40):  # ten idle timeouts of silence but for keepalives
            clock.advance(limits.tick_s)
            await until(
                lambda: clock.now() - link.since <= limits.keepalive_s + 2 * limits.tick_s,
                "the peer's keepalives arrive",
            )
        assert coordinator.transport.refusals.idle_closed == 0
        assert list(coordinator.transport.links.values()) == [link]
        w1.transport.send("coordinator", Heartbeat("w1", 2))
        await until(lambda: len(coordinator.got) == 2, "the same link still carries messages")


# ---- memory: half-sent large frames ------------------------------------------------------------------------


async def test_twenty_half_sent_16mib_frames_stay_within_the_inbound_budget() -> None:
    """20 authenticated connections each announce 16 MiB and send 15 MiB. At most ``budget / 16 MiB``
    of them are read at a time (the rest wait, unread, in the kernel); each is closed when its frame
    timeout passes. Traced memory stays within the budget plus per-connection read buffers."""
    clock = ManualClock()
    budget = 2 * MAX_FRAME_BYTES
    limits = TransportLimits(frame_timeout_s=10.0, inbound_bytes=budget)
    body = b"\xa5" * (15 * MiB)
    n = 20
    async with Node("coordinator", "coordinator", clock=clock, limits=limits) as coordinator:
        transport = coordinator.transport
        socks: list[socket.socket] = []
        for i in range(n):
            _, writer = await authenticated(transport.port, f"w{i}")
            sock = writer.get_extra_info("socket").dup()  # written to with no buffer in this process
            sock.setblocking(False)
            socks.append(sock)
        await until(lambda: len(transport.links) == n, "all authenticated")
        loop = asyncio.get_running_loop()
        sent = [0] * n

        async def send_half_frame(i: int) -> None:
            header = struct.pack(">I", MAX_FRAME_BYTES)
            try:
                await loop.sock_sendall(socks[i], header)
                view = memoryview(body)
                for start in range(0, len(body), MiB):
                    await loop.sock_sendall(socks[i], view[start : start + MiB])
                    sent[i] += MiB
            except ConnectionError:
                pass  # closed by the frame timeout

        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            senders = [loop.create_task(send_half_frame(i)) for i in range(n)]
            max_used = 0
            for done in range(2, n + 1, 2):  # two frames fit the budget at a time
                await until(lambda: transport.budget.used == budget, "the budget is spent")
                await until(partial(lambda d: sum(s == 15 * MiB for s in sent) >= d, done), "frames sent")
                max_used = max(max_used, transport.budget.used)
                assert transport.budget.waiting == n - done
                clock.advance(limits.frame_timeout_s + limits.tick_s)
                await until(
                    partial(lambda d: coordinator.refused.get("frame_timeout") == d, done), "timed out"
                )
            await asyncio.gather(*senders)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
            for sock in socks:
                sock.close()
        assert coordinator.refused == {"frame_timeout": n}
        assert transport.budget.used == 0 and transport.links == {} and coordinator.got == []
        # The bound: the budget (bytearray growth adds up to 1/8) plus each connection's read buffer
        # (asyncio pauses a reader past 2 x 64 KiB; one more 256 KiB read may land).
        bound = budget * 9 // 8 + n * (2 * 64 * 1024 + 256 * 1024) + 4 * MiB
        assert max_used <= budget
        assert peak <= bound, f"{peak / MiB:.0f} MiB traced at peak; the bound is {bound / MiB:.0f} MiB"
        assert peak < n * 15 * MiB / 4  # what unbounded buffering holds: 300 MiB


# ---- handler exceptions -----------------------------------------------------------------------------------


async def test_a_raising_handler_ends_run_and_stops_delivery(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[Message] = []

    def handler(src: str, msg: Message) -> None:
        seen.append(msg)
        assert not isinstance(msg, Register), "a bug in the handler"

    coordinator = Node("coordinator", "coordinator", handler=handler)
    async with coordinator:
        assert coordinator.task is not None
        reader, writer = await authenticated(coordinator.transport.port, "w1")
        writer.write(encode_frame(Batch("w1", [Heartbeat("w1", 1)])))
        await until(lambda: len(seen) == 1, "delivered")
        writer.write(struct.pack(">I", 3) + b"\xc1\xc1\xc1")  # a peer's garbage is not a handler error
        assert await closed_by_peer(reader)
        await until(lambda: coordinator.refused == {"undecodable": 1}, "refused")
        assert not coordinator.task.done()
        reader, writer = await authenticated(coordinator.transport.port, "w1")
        batch = Batch("w1", [Heartbeat("w1", 2), Register("w1", "h", 1), Heartbeat("w1", 3)])
        writer.write(encode_frame(batch) + encode_frame(Batch("w1", [Heartbeat("w1", 4)])))
        with pytest.raises(HandlerFailed, match="Register from w1") as failed:
            await asyncio.wait_for(asyncio.shield(coordinator.task), 30)
        assert isinstance(failed.value.__cause__, AssertionError)
        assert seen == [Heartbeat("w1", 1), Heartbeat("w1", 2), Register("w1", "h", 1)], "nothing after"
    assert any(r.levelno == logging.CRITICAL and r.exc_info for r in caplog.records)


async def test_a_bug_in_a_connection_task_ends_run_instead_of_the_loop_logging_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Not only a handler: anything a connection's task raises but the connection failing (a bug in
    the transport) ends run(), where the event loop's default handler would log it and all run on."""

    class Buggy(TcpTransport):
        def _adopt(self, link: Any, incarnation: str) -> None:
            raise KeyError("a bug while adopting a connection")

    node = Node("coordinator", "coordinator")
    node.transport = Buggy("coordinator", lambda src, msg: None, inbox="coordinator", secret=SECRET)
    async with node:
        assert node.task is not None
        await authenticated(node.transport.port, "w1")
        with pytest.raises(HandlerFailed, match="accepting a connection raised") as failed:
            await asyncio.wait_for(asyncio.shield(node.task), 30)
        assert isinstance(failed.value.__cause__, KeyError)
    assert any(r.levelno == logging.CRITICAL and r.exc_info for r in caplog.records)


@pytest.mark.services
def test_a_raising_handler_ends_the_worker_process(kafka: Any, tmp_path: Path) -> None:
    """A real ``styx worker``: the test plays its coordinator and sends a message that trips one of the
    worker's assertions (an epoch of a generation from the future). The process exits with
    EXIT_HANDLER_FAILED after logging CRITICAL with the traceback."""

    async def scenario() -> tuple[int, str]:
        got: asyncio.Queue[tuple[str, Message]] = asyncio.Queue()
        coordinator = TcpTransport(
            "coordinator", lambda src, msg: got.put_nowait((src, msg)), inbox="coordinator", secret=SECRET
        )
        await coordinator.start()
        env = {**os.environ, "STYX_CLUSTER_SECRET": SECRET, "STYX_LOG_LEVEL": "INFO"}
        log = tmp_path / "w1.log"
        args = ["worker", "--id", "w1", "--coordinator", f"127.0.0.1:{coordinator.port}", "--kafka"]
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                *STYX, *args, kafka.bootstrap, stdout=out, stderr=subprocess.STDOUT, env=env
            )
        try:
            while True:
                _, msg = await asyncio.wait_for(got.get(), 60)
                if isinstance(msg, Register):
                    break
            me = WorkerInfo("w1", 1, msg.host, msg.port)
            view = ClusterView(
                version=1,
                workers=[me],
                placement=[],
                graph_path=None,
                operators=[],
                kafka_bootstrap=None,
                ingress_topic="in",
                egress_topic="out",
                seqlog_topic="seq",
                gen=0,
            )
            coordinator.send("w1", view)
            coordinator.send(
                "w1", EpochStart(epoch=1, lc=0, replay=False, snapshot=False, gen=7)
            )  # generation 7 while the worker is in 0
            code = await asyncio.wait_for(proc.wait(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await coordinator.close()
        return code, log.read_text(errors="replace")

    code, text = asyncio.run(scenario())
    assert code == EXIT_HANDLER_FAILED, text[-3000:]
    assert "CRITICAL" in text and "from the future" in text and "Traceback" in text, text[-3000:]


# ---- a real coordinator process: memory and refusals, seen from outside -----------------------------------


def _rss_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


def _metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("styx_coordinator_connections") or line.startswith("styx_coordinator_inbound"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


@pytest.fixture
def coordinator_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    """A real ``styx coordinator`` with a 1 s frame timeout (nothing is deployed; no Kafka needed)."""
    port, metrics = free_port(), free_port()
    env = {
        **os.environ,
        "STYX_CLUSTER_SECRET": SECRET,
        "STYX_FRAME_TIMEOUT_S": "1",
        "STYX_METRICS_PORT": str(metrics),
        "STYX_LOG_LEVEL": "WARNING",
    }
    with (tmp_path / "coordinator.log").open("wb") as out:
        proc = subprocess.Popen(
            [*STYX, "coordinator", "--port", str(port), "--kafka", "127.0.0.1:1"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        yield proc, port, metrics
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_half_sent_16mib_frames_leave_a_coordinator_process_bounded(
    coordinator_process: tuple[subprocess.Popen[bytes], int, int],
) -> None:
    """An attack on a real coordinator: 20 unauthenticated connections announcing 16 MiB and
    20 authenticated ones each sending 15 MiB of an announced 16 MiB frame. The unauthenticated ones are
    refused at their header; the others are read at most MAX_INBOUND_BYTES at a time and closed by the
    frame timeout. The process's peak RSS grows by at most the budget plus read buffers (unbounded, it
    would grow by ~300 MB)."""
    proc, port, metrics_port = coordinator_process
    n = 20

    async def attack() -> None:
        address = f"127.0.0.1:{port}"
        while True:  # ready: it answers an authenticated status request
            try:
                await admin_request(address, StatusRequest(), 5.0, secret=SECRET)
                break
            except OSError:
                assert proc.poll() is None, "the coordinator exited"
                await asyncio.sleep(0.05)
        baseline.append(_rss_kib(proc.pid, "VmRSS"))
        loop = asyncio.get_running_loop()
        body = memoryview(b"\x5a" * (15 * MiB))
        header = struct.pack(">I", MAX_FRAME_BYTES)

        async def half_frame(authenticate: bool, i: int) -> None:
            if authenticate:
                reader, writer = await authenticated(port, f"w{i}")
            else:
                reader, writer = await raw(port)
            sock = writer.get_extra_info("socket").dup()
            sock.setblocking(False)
            try:
                await loop.sock_sendall(sock, header)
                for start in range(0, len(body), MiB):
                    await loop.sock_sendall(sock, body[start : start + MiB])
                await closed_by_peer(reader)  # by the frame timeout
            except ConnectionError:
                pass
            finally:
                sock.close()
                writer.close()

        await asyncio.gather(*(half_frame(auth, i) for auth in (False, True) for i in range(n)))

    baseline: list[int] = []
    asyncio.run(attack())
    refused = _metrics(metrics_port)
    peak_growth_kib = _rss_kib(proc.pid, "VmHWM") - baseline[0]
    assert proc.poll() is None, "the coordinator survived"
    assert refused['styx_coordinator_connections_refused_total{reason="unauthenticated"}'] == n
    assert refused['styx_coordinator_connections_refused_total{reason="frame_timeout"}'] == n
    assert refused["styx_coordinator_inbound_reserved_bytes"] == 0
    bound_kib = (MAX_INBOUND_BYTES * 9 // 8 + 2 * n * 512 * 1024 + 16 * MiB) // 1024
    print(f"peak RSS growth {peak_growth_kib / 1024:.0f} MiB (bound {bound_kib / 1024:.0f} MiB)")
    assert peak_growth_kib <= bound_kib, f"peak RSS grew by {peak_growth_kib} KiB (bound {bound_kib} KiB)"


# ---- a running cluster ------------------------------------------------------------------------------------


def _coordinator_metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {
        name: float(value)
        for name, _, value in (line.rpartition(" ") for line in text.splitlines())
        if name.startswith("styx_coordinator_connections") or name == "styx_coordinator_recoveries_total"
    }


@pytest.mark.services
def test_a_spoofed_worker_changes_nothing_in_a_running_cluster(local_cluster: ClusterFactory) -> None:
    """The issue's attack: one valid frame claiming to be worker w1, from an unrelated client, forced a
    cluster-wide recovery. Now it is refused and counted, as are a wrong secret and a frame of the wrong
    channel, and the cluster carries on as before (and its generated secret works for the SDK)."""
    stack = local_cluster(app="styx_benchmarks.bank:app")
    port = int(stack.coordinator.rpartition(":")[2])
    before = stack.status()
    metrics_url = stack.metrics_url("coordinator")

    async def attack() -> None:
        reader, writer = await raw(port)
        writer.write(register("w1"))  # a frame that, accepted, would force a recovery
        assert await closed_by_peer(reader)
        with pytest.raises(HandshakeFailed):
            await authenticated(port, "w1", secret="not-the-cluster-secret-0123")
        reader, writer = await authenticated(port, "intruder", secret=stack.secret)
        start = EpochStart(epoch=1, lc=0, replay=False, snapshot=False, gen=0)
        writer.write(encode_frame(Batch("intruder", [start])))
        assert await closed_by_peer(reader)

    asyncio.run(attack())
    refused = 'styx_coordinator_connections_refused_total{reason="%s"}'
    expected = {refused % "unauthenticated": 2.0, refused % "wrong_channel": 1.0}

    async def counted() -> None:
        await until(
            lambda: all(_coordinator_metrics(metrics_url).get(k) == v for k, v in expected.items()),
            "the coordinator counted the refusals",
        )

    asyncio.run(counted())
    after = stack.status()
    assert after["recoveries"] == before["recoveries"] == 0
    assert after["workers"] and [(w["node_id"], w["address"], w["partitions"]) for w in after["workers"]] == [
        (w["node_id"], w["address"], w["partitions"]) for w in before["workers"]
    ]
    assert after["failed_workers"] == [] and after["graph"] == before["graph"]

    async def transact() -> Any:
        async with await StyxClient.connect(stack.coordinator, timeout_s=60) as client:
            return await client.call("account", "spoof-check", "deposit", 5)

    assert asyncio.run(transact()) == 5
    assert stack.status()["recoveries"] == 0


@pytest.mark.services
def test_styx_up_generates_a_secret_the_cli_uses(tmp_path: Path) -> None:
    """``styx up`` with no secret in the environment makes one, hands it to its processes and leaves it
    (owner-only) in .styx/cluster.json for ``styx status/call`` run in the same directory."""
    env = {k: v for k, v in os.environ.items() if k != "STYX_CLUSTER_SECRET"}
    state = tmp_path / ".styx" / "cluster.json"
    with (tmp_path / "up.log").open("wb") as out:
        up = subprocess.Popen(
            [*STYX, "up", "--no-gateway", "--app", "styx_benchmarks.bank:app", "--data-dir", "data"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        async def deployed() -> None:
            await until(lambda: "cluster is up" in (tmp_path / "up.log").read_text(), "styx up", 120)

        asyncio.run(deployed())
        assert state.stat().st_mode & 0o777 == 0o600
        secret = json.loads(state.read_text())["env"]["STYX_CLUSTER_SECRET"]
        assert len(secret) >= 16

        def styx(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*STYX, *args],
                cwd=tmp_path,
                env={**env, **extra},
                capture_output=True,
                text=True,
                check=False,
            )

        status = styx("status", "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["graph"] == "styx_benchmarks.bank:app"
        call = styx("call", "account", "alice", "deposit", "7")
        assert call.returncode == 0 and json.loads(call.stdout)["result"] == 7, call.stderr
        wrong = styx("status", STYX_CLUSTER_SECRET="not-the-cluster-secret-0123")
        assert wrong.returncode == 2 and "cannot reach the coordinator" in wrong.stderr
        assert "STYX_CLUSTER_SECRET" in wrong.stderr and "Traceback" not in wrong.stderr
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
    assert up.returncode == 0 and not state.exists()
