"""TLS contexts built from :mod:`styx_py.core.security`'s files: the internal ports' and Kafka's.

:class:`Tls` holds one process's contexts for the internal ports: a server one that requires and
verifies the peer's certificate, and a client one that presents this process's certificate and verifies
the node it dials. Both are TLS 1.2 or later and are rebuilt when one of the files changes (a rotated
certificate is used by the next connection without a restart; connections already open keep theirs).

:func:`kafka_options` is the one place that turns a :class:`~styx_py.core.security.KafkaSecurity` into
aiokafka keyword arguments: every ``AIOKafkaProducer``, ``AIOKafkaConsumer`` and
``AIOKafkaAdminClient`` of the product gets them (``tests/test_kafka_security.py`` checks that none is
built without them).

:class:`TlsServer` accepts a coordinator's or worker's TLS connections, :func:`open_connection` dials
one (with or without TLS): the one path of every dialer (nodes, admin clients, the SDK's worker links).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from styx_py.core.errors import ConfigError
from styx_py.core.ports import Clock
from styx_py.core.security import KafkaSecurity, TlsFiles, tls_from_env

__all__ = ["Tls", "TlsServer", "client_tls", "kafka_options", "open_connection", "start_server"]

log = logging.getLogger("styx.transport")
ACCEPT_RETRY_S = 0.1


def _stamp(files: tuple[str, ...]) -> tuple[tuple[int, int], ...]:
    stamps = []
    for path in files:
        try:
            st = os.stat(path)
        except OSError as exc:
            raise ConfigError(f"cannot read the TLS file {path!r}: {exc.strerror}") from exc
        stamps.append((st.st_mtime_ns, st.st_size))
    return tuple(stamps)


class Tls:
    """One process's mutual-TLS contexts for the internal ports."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._paths = (files.cert_file, files.key_file, files.ca_file)
        self._stamp: tuple[tuple[int, int], ...] = ()
        self._server: ssl.SSLContext | None = None
        self._client: ssl.SSLContext | None = None
        self._contexts()  # a missing or bad file fails at start-up, naming it

    @property
    def server_name(self) -> str | None:
        return self.files.server_name or None

    def server(self) -> ssl.SSLContext:
        return self._contexts()[0]

    def client(self) -> ssl.SSLContext:
        return self._contexts()[1]

    def _contexts(self) -> tuple[ssl.SSLContext, ssl.SSLContext]:
        """The contexts, rebuilt when a file changed. Files being rotated may not match for a moment
        (a new certificate, the old key): then the contexts in use stay, and the next call tries
        again; only the first build, at start-up, fails."""
        try:
            stamp = _stamp(self._paths)
            if stamp != self._stamp or self._server is None or self._client is None:
                server = self._context(ssl.Purpose.CLIENT_AUTH)
                self._client = self._context(ssl.Purpose.SERVER_AUTH)
                self._server, self._stamp = server, stamp
        except ConfigError as exc:
            if self._server is None or self._client is None:
                raise
            log.error("keeping the TLS files in use: %s", exc)
        return self._server, self._client

    def _context(self, purpose: ssl.Purpose) -> ssl.SSLContext:
        f = self.files
        try:
            ctx = ssl.create_default_context(purpose, cafile=f.ca_file)
            ctx.load_cert_chain(f.cert_file, f.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"cannot load the TLS files (STYX_TLS_CERT_FILE={f.cert_file!r}, STYX_TLS_KEY_FILE="
                f"{f.key_file!r}, STYX_TLS_CA_FILE={f.ca_file!r}): {exc}"
            ) from exc
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.verify_mode = ssl.CERT_REQUIRED  # mutual: a server requires the client's certificate too
        if purpose is ssl.Purpose.SERVER_AUTH:
            ctx.check_hostname = bool(f.server_name)
        return ctx


def client_tls(tls: Tls | None = None) -> Tls | None:
    """An admin client's TLS: ``tls`` when given, else from ``STYX_TLS_*`` (None: plain TCP)."""
    if tls is not None:
        return tls
    files = tls_from_env()
    return None if files is None else Tls(files)


def kafka_options(security: KafkaSecurity) -> dict[str, Any]:
    """aiokafka keyword arguments for ``security`` (nothing but the protocol for PLAINTEXT)."""
    options: dict[str, Any] = {"security_protocol": security.security_protocol}
    if security.uses_ssl:
        try:
            ctx = ssl.create_default_context(cafile=security.ssl_ca_file or None)
            if security.ssl_cert_file:
                ctx.load_cert_chain(security.ssl_cert_file, security.ssl_key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load the Kafka TLS files (STYX_KAFKA_SSL_*): {exc}") from exc
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        options["ssl_context"] = ctx
    if security.uses_sasl:
        options["sasl_mechanism"] = security.sasl_mechanism
        options["sasl_plain_username"] = security.sasl_username
        options["sasl_plain_password"] = security.sasl_password
    return options


async def open_connection(
    host: str, port: int, tls: Tls | None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to a coordinator or worker port: TLS with this process's certificate when ``tls``
    (the caller bounds it in time, the TLS handshake included)."""
    if tls is None:
        return await asyncio.open_connection(host, port)
    return await asyncio.open_connection(
        host, port, ssl=tls.client(), server_hostname=tls.server_name or host
    )


Accepted = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
Refuse = Callable[[str, str, str], None]  # (reason, address, detail)
# Runs a connection's coroutine as a task of the transport (what it raises ends the process).
Spawn = Callable[[Coroutine[Any, Any, None], str], "asyncio.Task[None]"]


class TlsServer:
    """A listening socket whose connections are TLS from their first byte, handed on as streams once
    the mutual handshake succeeded; a failed or overdue handshake is refused through ``refuse``
    (reason ``tls`` or ``handshake_timeout``). ``asyncio.start_server`` with ``ssl=`` would drop those
    failures silently, and ``StreamWriter.start_tls`` on an accepted stream loses a ClientHello that
    arrives before it is called (uvloop reads at once)."""

    def __init__(
        self,
        sock: socket.socket,
        tls: Tls,
        accepted: Accepted,
        refuse: Refuse,
        *,
        spawn: Spawn,
        clock: Clock,
        timeout_s: float,
        limit: int,
    ) -> None:
        self.sockets = [sock]
        self.spawn = spawn
        self.tls = tls
        self.accepted = accepted
        self.refuse = refuse
        self.clock = clock
        self.timeout_s = timeout_s
        self.limit = limit  # handshakes in progress at once
        self.handshaking: set[asyncio.Task[None]] = set()
        self.task = spawn(self._accept_loop(), "accepting TLS connections")

    def close(self) -> None:
        self.task.cancel()
        for task in list(self.handshaking):
            task.cancel()
        self.sockets[0].close()

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        listening = self.sockets[0]
        while True:
            try:
                conn, peer = await loop.sock_accept(listening)
            except OSError as exc:  # out of file descriptors, say: the next accept may work
                log.error("accepting a TLS connection failed: %s", exc)
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            address = f"{peer[0]}:{peer[1]}"
            if len(self.handshaking) >= self.limit:
                self.refuse("too_many_connections", address, f"{len(self.handshaking)} TLS handshakes open")
                conn.close()
                continue
            task = self.spawn(self._handshake(conn, address), f"the TLS handshake of {address}")
            self.handshaking.add(task)
            task.add_done_callback(self.handshaking.discard)

    async def _handshake(self, conn: socket.socket, address: str) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        try:
            async with self.clock.timeout(self.timeout_s):
                transport, _ = await loop.connect_accepted_socket(
                    # the clock's timeout is the one that counts; asyncio's is only a backstop
                    lambda: protocol,
                    conn,
                    ssl=self.tls.server(),
                    ssl_handshake_timeout=2 * self.timeout_s + 1,
                )
        except ssl.SSLError as exc:
            self.refuse("tls", address, f"no TLS, or a certificate the CA did not sign: {exc}")
            conn.close()
            return
        except (TimeoutError, ConnectionAbortedError):  # the handshake timeout: asyncio's, or ours
            self.refuse("handshake_timeout", address, "no TLS handshake in time")
            conn.close()
            return
        except OSError:
            conn.close()  # went away during the handshake
            return
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        task = asyncio.current_task()
        assert task is not None
        self.handshaking.discard(task)  # the connection is the transport's now (its own limit)
        await self.accepted(reader, writer)


async def start_server(
    accepted: Accepted,
    host: str,
    port: int,
    tls: Tls | None,
    refuse: Refuse,
    *,
    spawn: Spawn,
    clock: Clock,
    timeout_s: float,
    limit: int,
) -> asyncio.Server | TlsServer:
    """The server of a coordinator or worker port: ``asyncio.start_server``, or with ``tls`` a
    :class:`TlsServer` (handshakes bounded by ``timeout_s`` and ``limit``)."""
    if tls is None:
        return await asyncio.start_server(accepted, host, port)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # an IPv6 literal, else IPv4 or a name
    sock = socket.create_server((host, port), family=family)
    sock.setblocking(False)
    return TlsServer(sock, tls, accepted, refuse, spawn=spawn, clock=clock, timeout_s=timeout_s, limit=limit)
