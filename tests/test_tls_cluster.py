"""A real cluster (coordinator and two worker processes) with mutual TLS on every internal port: it
serves transfers that cross workers, through the SDK (its admin and pushed-reply links in TLS too);
a plain peer and a peer whose certificate the cluster's CA did not sign are refused, on the
coordinator's port and on a worker's, and counted."""

from __future__ import annotations

import asyncio
import ssl
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from styx_client.sdk import StyxClient
from styx_py.core.security import tls_files
from styx_py.core.wire import StatusRequest
from styx_py.io.admin import admin_request
from styx_py.io.handshake import HandshakeFailed
from styx_py.io.tls import Tls
from tests.service_fixtures import ClusterFactory
from tests.test_transport_security import _coordinator_metrics, closed_by_peer, raw, register, until
from tests.tls_certs import Authority, Identity

REFUSED = 'styx_coordinator_connections_refused_total{reason="%s"}'


def _tls(identity: Identity) -> Tls:
    files = tls_files(str(identity.cert), str(identity.key), str(identity.ca))
    assert files is not None
    return Tls(files)


@pytest.mark.services
def test_a_tls_cluster_serves_and_refuses_plain_and_forged_peers(
    local_cluster: ClusterFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster_ca, rogue_ca = Authority(tmp_path / "ca", "cluster-ca"), Authority(tmp_path / "rogue", "rogue-ca")
    node, admin = cluster_ca.issue("node"), cluster_ca.issue("admin")
    forged_files = rogue_ca.issue("forged")
    forged = Identity(forged_files.cert, forged_files.key, cluster_ca.cert)  # trusts the cluster, unsigned
    for name, value in admin.env().items():  # this process is the cluster's admin client (SDK, status)
        monkeypatch.setenv(name, value)
    settings = {k.removeprefix("STYX_").lower(): v for k, v in node.env().items()}
    stack = local_cluster(app="styx_benchmarks.bank:app", settings=settings)
    port = int(stack.coordinator.rpartition(":")[2])
    metrics_url = stack.metrics_url("coordinator")

    async def transact() -> list[Any]:
        async with await StyxClient.connect(stack.coordinator, timeout_s=60) as client:
            await client.call("account", "tls-a", "deposit", 100)
            results = [await client.call("account", "tls-a", "transfer", f"tls-{k}", 10) for k in "bcdefgh"]
            # The SDK's links to the workers' ports (pushed replies and requests) are up: in TLS, as
            # those ports take nothing else.
            await until(lambda: client._transport.pushes_healthy, "the SDK subscribed on every worker")
            return [*results, await client.call("account", "tls-h", "balance")]

    results = asyncio.run(transact())
    assert results[-1] == 10 and len(results) == 8, results
    status = stack.status()
    assert len(status["workers"]) == 2 and status["recoveries"] == 0
    worker_address = status["workers"][0]["address"]

    async def attack() -> None:
        for address in (stack.coordinator, worker_address):
            with pytest.raises((ssl.SSLError, ConnectionError)):  # a certificate of another CA
                await admin_request(address, StatusRequest(), 10.0, secret=stack.secret, tls=_tls(forged))
        # A plain styx client with the right secret: no TLS, so no challenge; the port closes it after
        # its handshake timeout.
        for name in admin.env():
            monkeypatch.delenv(name)
        with pytest.raises(HandshakeFailed, match="STYX_TLS_"):
            await admin_request(stack.coordinator, StatusRequest(), 30.0, secret=stack.secret)
        reader, writer = await raw(port)
        writer.write(register("w1"))  # plain bytes where TLS belongs
        assert await closed_by_peer(reader)

    asyncio.run(attack())
    expected = {REFUSED % "tls": 2.0, REFUSED % "handshake_timeout": 1.0}

    async def counted() -> None:
        await until(
            lambda: all(_coordinator_metrics(metrics_url).get(k) == v for k, v in expected.items()),
            f"the coordinator counted the refusals: {_coordinator_metrics(metrics_url)}",
        )

    asyncio.run(counted())
    worker_metrics = stack.metrics_url(status["workers"][0]["node_id"])
    with urllib.request.urlopen(worker_metrics, timeout=5) as response:
        text = response.read().decode()
    assert 'styx_worker_connections_refused_total{reason="tls"} 1.0' in text
    for name, value in admin.env().items():
        monkeypatch.setenv(name, value)
    assert stack.status()["recoveries"] == 0
