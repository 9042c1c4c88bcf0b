"""The handshake that opens every connection to a coordinator or worker port: proof of the cluster secret.

Both sides prove they know the secret before either handles a frame of the other::

    acceptor -> dialer    Challenge(nonce_a)                            sent at once on accept
    dialer   -> acceptor  Hello(node_id, incarnation, nonce_d, mac_d)
    acceptor -> dialer    Welcome(mac_a)

    mac_d = HMAC(secret, "dial",   nonce_a, nonce_d, node_id, incarnation)
    mac_a = HMAC(secret, "accept", nonce_a, nonce_d, node_id, incarnation)

HMAC-SHA256 over the msgpack encoding of those fields (unambiguous), compared with
:func:`hmac.compare_digest`. Fresh random nonces on both sides make a recorded handshake useless on
another connection; the role label keeps one side's proof from being replayed as the other's. The
dialer's node id and incarnation are bound into the proof, so the identity a connection claims is the
one it authenticated (the transport then refuses frames whose ``src`` differs).

The handshake authenticates; it does not encrypt: with TLS files configured, it runs inside mutual
TLS (:mod:`styx_py.io.tls`, docs/deploy.md#security). A connection that fails it is closed without an answer.
An empty secret is allowed only on loopback (:func:`require_secret`): any local process can join then.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import os
import secrets
import struct
from typing import Annotated, Any, TypeVar

import msgspec

from styx_py.core.errors import ConfigError
from styx_py.core.limits import MAX_HANDSHAKE_BYTES

__all__ = [
    "SECRET_ENV",
    "Challenge",
    "HandshakeFailed",
    "Hello",
    "Refused",
    "Welcome",
    "accept_handshake",
    "client_secret",
    "dial_handshake",
    "is_loopback",
    "require_secret",
]

SECRET_ENV = "STYX_CLUSTER_SECRET"
VERSION = 1
NONCE_BYTES = 16
MAC_BYTES = 32  # SHA-256

Nonce = Annotated[bytes, msgspec.Meta(min_length=NONCE_BYTES, max_length=NONCE_BYTES)]
Mac = Annotated[bytes, msgspec.Meta(min_length=MAC_BYTES, max_length=MAC_BYTES)]


class Challenge(msgspec.Struct, array_like=True, frozen=True):
    version: int
    nonce: Nonce


class Hello(msgspec.Struct, array_like=True, frozen=True):
    node_id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    incarnation: Annotated[str, msgspec.Meta(max_length=64)]
    nonce: Nonce
    mac: Mac


class Welcome(msgspec.Struct, array_like=True, frozen=True):
    mac: Mac


class Refused(Exception):
    """A peer broke the protocol (before or after authenticating): its connection is closed and counted.

    ``reason`` is the label of ``styx_*_connections_refused_total``.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class HandshakeFailed(ConnectionError):
    """The peer we dialed did not authenticate us, or could not prove it knows the secret."""


_HEADER = struct.Struct(">I")
_encoder = msgspec.msgpack.Encoder()
S = TypeVar("S", Challenge, Hello, Welcome)
_decoders: dict[type[Any], msgspec.msgpack.Decoder[Any]] = {
    t: msgspec.msgpack.Decoder(t) for t in (Challenge, Hello, Welcome)
}


def _mac(key: bytes, role: str, challenge: bytes, nonce: bytes, node_id: str, incarnation: str) -> bytes:
    signed = _encoder.encode(("styx-py", VERSION, role, challenge, nonce, node_id, incarnation))
    return hmac.new(key, signed, hashlib.sha256).digest()


def _frame(msg: Challenge | Hello | Welcome) -> bytes:
    payload = _encoder.encode(msg)
    return _HEADER.pack(len(payload)) + payload


async def _read(reader: asyncio.StreamReader, kind: type[S], reason: str) -> S:
    """One handshake frame of ``kind``; anything else (too long, undecodable) is :class:`Refused`."""
    (n,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    if n > MAX_HANDSHAKE_BYTES:
        raise Refused(reason, f"a {n}-byte frame where a {kind.__name__} (<= {MAX_HANDSHAKE_BYTES}) belongs")
    try:
        msg: S = _decoders[kind].decode(await reader.readexactly(n))
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise Refused(reason, f"not a {kind.__name__}: {exc}") from exc
    return msg


async def accept_handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: bytes) -> Hello:
    """The acceptor's side: the dialer's authenticated :class:`Hello`, or :class:`Refused`.

    The caller bounds it in time; bytes the dialer sends after its Hello stay in ``reader``.
    """
    challenge = secrets.token_bytes(NONCE_BYTES)
    writer.write(_frame(Challenge(VERSION, challenge)))
    hello = await _read(reader, Hello, "unauthenticated")
    expected = _mac(key, "dial", challenge, hello.nonce, hello.node_id, hello.incarnation)
    if not hmac.compare_digest(expected, hello.mac):
        raise Refused("unauthenticated", f"wrong proof of the cluster secret from {hello.node_id!r}")
    mac = _mac(key, "accept", challenge, hello.nonce, hello.node_id, hello.incarnation)
    writer.write(_frame(Welcome(mac)))
    return hello


async def dial_handshake(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    key: bytes,
    node_id: str,
    incarnation: str,
) -> None:
    """The dialer's side; raises :class:`HandshakeFailed` unless both sides proved the secret.

    The caller bounds it in time.
    """
    try:
        challenge = await _read(reader, Challenge, "unauthenticated")
        if challenge.version != VERSION:
            raise HandshakeFailed(f"the peer speaks handshake version {challenge.version}, not {VERSION}")
        nonce = secrets.token_bytes(NONCE_BYTES)
        mac = _mac(key, "dial", challenge.nonce, nonce, node_id, incarnation)
        writer.write(_frame(Hello(node_id, incarnation, nonce, mac)))
        welcome = await _read(reader, Welcome, "unauthenticated")
    except asyncio.IncompleteReadError as exc:
        raise HandshakeFailed(
            f"the peer closed the connection during the handshake: is {SECRET_ENV} the cluster's "
            "(and STYX_TLS_* set, if its ports require TLS)?"
        ) from exc
    except Refused as exc:
        raise HandshakeFailed(f"the peer is not a styx-py node of this cluster ({exc})") from exc
    expected = _mac(key, "accept", challenge.nonce, nonce, node_id, incarnation)
    if not hmac.compare_digest(expected, welcome.mac):
        raise HandshakeFailed(f"the peer does not know the cluster secret ({SECRET_ENV})")


# ---- the secret --------------------------------------------------------------------------------------


def require_secret(secret: str, host: str, who: str) -> None:
    """Fail fast (naming the setting) when ``who`` would listen on ``host`` beyond loopback with no secret."""
    if not secret and not is_loopback(host):
        raise ConfigError(
            f"{who}: cluster_secret ({SECRET_ENV}) is required when listening on the non-loopback "
            f"address {host!r}: every node and admin client of the cluster must share it"
        )


def client_secret(secret: str | None) -> str:
    """An admin client's secret: ``secret`` when given, else ``$STYX_CLUSTER_SECRET``, else empty
    (which only a loopback-only cluster without a secret accepts). Read when the client connects."""
    return secret if secret is not None else os.environ.get(SECRET_ENV, "")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
