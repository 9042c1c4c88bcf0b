"""TLS contexts built from :mod:`styx_py.core.security`'s files: the internal ports' and Kafka's.

:class:`Tls` holds one process's contexts for the internal ports: a server one that requires and
verifies the peer's certificate, and a client one that presents this process's certificate and verifies
the node it dials. Both are TLS 1.2 or later and are rebuilt when one of the files changes (a rotated
certificate is used by the next connection without a restart; connections already open keep theirs).

:func:`kafka_options` is the one place that turns a :class:`~styx_py.core.security.KafkaSecurity` into
aiokafka keyword arguments: every ``AIOKafkaProducer``, ``AIOKafkaConsumer`` and
``AIOKafkaAdminClient`` of the product gets them (``tests/test_tls.py`` checks that none is built
without them).
"""

from __future__ import annotations

import asyncio
import os
import ssl
from typing import Any

from styx_py.core.errors import ConfigError
from styx_py.core.security import KafkaSecurity, TlsFiles, tls_from_env

__all__ = ["Tls", "accept_tls", "client_tls", "kafka_options", "open_connection"]


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
        stamp = _stamp(self._paths)
        if stamp != self._stamp or self._server is None or self._client is None:
            self._server = self._context(ssl.Purpose.CLIENT_AUTH)
            self._client = self._context(ssl.Purpose.SERVER_AUTH)
            self._stamp = stamp
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


async def accept_tls(writer: asyncio.StreamWriter, tls: Tls) -> None:
    """The acceptor's TLS handshake on a connection just accepted (before the HMAC handshake); raises
    :class:`ssl.SSLError` for a peer that does not speak TLS or whose certificate the CA did not sign.
    The caller bounds it in time."""
    await writer.start_tls(tls.server())
