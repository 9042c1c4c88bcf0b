"""Mutual TLS on the internal ports, under the HMAC handshake: encrypted links between nodes that share
the cluster's CA, and refused (and counted) peers without TLS, with a certificate of another CA, or with
the right certificate but not the cluster secret.

Real TCP on loopback, throwaway certificates made with ``openssl`` (:mod:`tests.tls_certs`). Timeouts
run on the :class:`~tests.test_transport_security.ManualClock`. A real cluster in TLS is in
``tests/test_tls_cluster.py``.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from pathlib import Path
from typing import Any

import pytest

from styx_py.core.config import load_config
from styx_py.core.errors import ConfigError
from styx_py.core.security import tls_files
from styx_py.core.wire import AdminReply, Heartbeat, Message, StatusRequest
from styx_py.io.admin import admin_request
from styx_py.io.handshake import HandshakeFailed
from styx_py.io.links import TransportLimits
from styx_py.io.tls import Tls, TlsServer
from tests.test_transport_security import (
    SECRET,
    ManualClock,
    Node,
    authenticated,
    closed_by_peer,
    raw,
    register,
    until,
)
from tests.tls_certs import SERVER_NAME, Authority, Identity


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Identity]:
    """Identities of the cluster's CA (coordinator, w1, admin, one named for another cluster) and of a
    rogue CA (a peer that trusts the cluster's CA but whose own certificate it did not sign)."""
    base = tmp_path_factory.mktemp("pki")
    cluster, rogue = Authority(base / "cluster", "cluster-ca"), Authority(base / "rogue", "rogue-ca")
    ids = {who: cluster.issue(who) for who in ("coordinator", "w1", "admin")}
    ids["misnamed"] = cluster.issue("misnamed", server_name="other-cluster.test")
    forged = rogue.issue("forged")
    ids["forged"] = Identity(forged.cert, forged.key, cluster.cert)
    return ids


def tls(identity: Identity, server_name: str = SERVER_NAME) -> Tls:
    files = tls_files(str(identity.cert), str(identity.key), str(identity.ca), server_name)
    assert files is not None
    return Tls(files)


def tls_node(name: str, inbox: str, identity: Identity, **kw: object) -> Node:
    node = Node(name, inbox, **kw)  # type: ignore[arg-type]
    node.transport.tls = tls(identity)
    return node


async def test_tls_nodes_talk_both_ways_encrypted(pki: dict[str, Identity]) -> None:
    async with (
        tls_node("coordinator", "coordinator", pki["coordinator"]) as coordinator,
        tls_node("w1", "worker", pki["w1"]) as worker,
    ):
        worker.transport.set_address("coordinator", "127.0.0.1", coordinator.transport.port)
        worker.transport.send("coordinator", Heartbeat("w1", 3))
        await until(lambda: coordinator.got == [("w1", Heartbeat("w1", 3))], "the coordinator hears w1")
        coordinator.transport.send("w1", Heartbeat("coordinator", 4))
        await until(lambda: worker.got == [("coordinator", Heartbeat("coordinator", 4))], "w1 hears back")
        for node, peer in ((coordinator, "w1"), (worker, "coordinator")):
            tls_object = node.transport.writers[peer].writer.get_extra_info("ssl_object")
            assert isinstance(tls_object, ssl.SSLObject) and tls_object.version() in ("TLSv1.2", "TLSv1.3")
            subject = dict(x[0] for x in tls_object.getpeercert()["subject"])
            assert subject["commonName"] == peer  # each side verified the other's certificate
        assert not coordinator.refused and not worker.refused


async def test_a_plain_peer_is_refused_by_a_tls_port(pki: dict[str, Identity]) -> None:
    clock = ManualClock()
    async with tls_node("coordinator", "coordinator", pki["coordinator"], clock=clock) as coordinator:
        port = coordinator.transport.port
        # A plain node with the right secret waits for a challenge that never comes in plain text ...
        dialing = asyncio.ensure_future(authenticated(port, "w1"))
        server = coordinator.transport.server
        assert isinstance(server, TlsServer)
        await until(lambda: len(server.handshaking) == 1, "the plain dialer is accepted")
        clock.advance(TransportLimits().handshake_timeout_s + 0.1)
        with pytest.raises(HandshakeFailed):
            await dialing
        # ... and plain bytes where a TLS ClientHello belongs are refused at once.
        reader, writer = await raw(port)
        writer.write(register("w1"))
        assert await closed_by_peer(reader)
        await until(lambda: coordinator.refused == {"handshake_timeout": 1, "tls": 1}, "both counted")
        assert coordinator.got == [] and coordinator.transport.links == {}


async def test_a_tls_node_does_not_talk_to_a_plain_port(pki: dict[str, Identity]) -> None:
    async with Node("coordinator", "coordinator") as plain, tls_node("w1", "worker", pki["w1"]) as worker:
        worker.transport.set_address("coordinator", "127.0.0.1", plain.transport.port)
        worker.transport.send("coordinator", Heartbeat("w1", 1))
        await until(lambda: plain.refused == {"unauthenticated": 1}, "its ClientHello is no Hello")
        await until(lambda: not worker.transport.dialing, "the dial gave up")
        assert plain.got == [] and "coordinator" not in worker.transport.writers


async def test_a_certificate_the_cluster_ca_did_not_sign_is_refused(pki: dict[str, Identity]) -> None:
    async with tls_node("coordinator", "coordinator", pki["coordinator"]) as coordinator:
        address = f"127.0.0.1:{coordinator.transport.port}"
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await admin_request(address, StatusRequest(), 10.0, secret=SECRET, tls=tls(pki["forged"]))
        await until(lambda: coordinator.refused == {"tls": 1}, "the forged certificate is counted")
        # The other way round: a node of the cluster does not trust a port with a forged certificate.
        async with tls_node("intruder", "coordinator", pki["forged"]) as intruder:
            with pytest.raises(ssl.SSLCertVerificationError):
                await admin_request(
                    f"127.0.0.1:{intruder.transport.port}", StatusRequest(), 10.0, secret=SECRET,
                    tls=tls(pki["admin"]),
                )  # fmt: skip
        assert coordinator.got == []


async def test_the_server_name_is_checked_and_the_secret_still_is(pki: dict[str, Identity]) -> None:
    def answer(src: str, msg: Message) -> None:
        coordinator.transport.send(src, AdminReply(True, "", {"hello": src}))

    coordinator = tls_node("coordinator", "coordinator", pki["misnamed"], handler=answer)
    async with coordinator:
        address = f"127.0.0.1:{coordinator.transport.port}"
        with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
            await admin_request(address, StatusRequest(), 10.0, secret=SECRET, tls=tls(pki["admin"]))
        unnamed = tls(pki["admin"], server_name="")  # the CA is checked, the name is not
        reply = await admin_request(address, StatusRequest(), 10.0, secret=SECRET, tls=unnamed)
        assert reply.ok and reply.body["hello"].startswith("admin-")
        with pytest.raises(HandshakeFailed, match="STYX_CLUSTER_SECRET"):
            await admin_request(address, StatusRequest(), 10.0, secret="not-the-cluster-secret", tls=unnamed)
        await until(lambda: coordinator.refused.get("unauthenticated") == 1, "the wrong secret is counted")


def test_rotated_files_make_new_contexts(pki: dict[str, Identity], tmp_path: Path) -> None:
    identity = Identity(tmp_path / "node.pem", tmp_path / "node.key", pki["w1"].ca)
    identity.cert.write_bytes(pki["w1"].cert.read_bytes())
    identity.key.write_bytes(pki["w1"].key.read_bytes())
    node = tls(identity)
    first = node.server()
    assert node.server() is first and node.client() is node.client()
    identity.cert.write_bytes(pki["coordinator"].cert.read_bytes())
    identity.key.write_bytes(pki["coordinator"].key.read_bytes())
    os.utime(identity.cert, ns=(1, 1))  # a different stamp however fast the rewrite was
    assert node.server() is not first
    second = node.server()
    identity.key.write_bytes(pki["w1"].key.read_bytes())  # half rotated: the key no longer matches
    os.utime(identity.key, ns=(2, 2))
    assert node.server() is second  # the contexts in use stay (and the error is logged) ...
    identity.cert.write_bytes(pki["w1"].cert.read_bytes())
    os.utime(identity.cert, ns=(3, 3))
    assert node.server() is not second  # ... until the files match again
    identity.key.write_bytes(b"not a key")
    with pytest.raises(ConfigError, match="STYX_TLS_KEY_FILE"):
        tls(identity)  # at start-up, a bad file is an error naming it


def test_tls_settings_are_all_or_nothing() -> None:
    with pytest.raises(ConfigError, match="STYX_TLS_KEY_FILE, STYX_TLS_CA_FILE not set"):
        load_config(env={"STYX_TLS_CERT_FILE": "/c.pem"})
    with pytest.raises(ConfigError, match="STYX_TLS_SERVER_NAME is set but TLS is not"):
        load_config(env={"STYX_TLS_SERVER_NAME": SERVER_NAME})
    with pytest.raises(ConfigError, match=r"cannot read the TLS file ./nowhere\.pem."):
        Tls(tls_files("/nowhere.pem", "/nowhere.key", "/nowhere-ca.pem") or pytest.fail("no files"))
    files = load_config(env={"STYX_TLS_CERT_FILE": "c", "STYX_TLS_KEY_FILE": "k", "STYX_TLS_CA_FILE": "a"})
    assert files.internal_tls() == tls_files("c", "k", "a") and load_config(env={}).internal_tls() is None


@pytest.mark.parametrize(
    "case",
    [test_tls_nodes_talk_both_ways_encrypted, test_a_certificate_the_cluster_ca_did_not_sign_is_refused],
)
def test_the_same_on_uvloop(pki: dict[str, Identity], case: Any) -> None:
    """The processes run uvloop, which reads an accepted connection at once (a TLS layer started on it
    later missed the ClientHello)."""
    uvloop = pytest.importorskip("uvloop")
    uvloop.run(case(pki))
