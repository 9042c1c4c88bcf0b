"""Per-client reply routing on real services: each SDK client reads only its own egress partition.

Three clients run bank transfers at once against a local cluster (Tansu, a coordinator, two worker
processes). Each names its own reply partition, so none reads a reply of another: no foreign reply is
delivered to any of them, and every reply on the egress log lies in the partition its request named.
Before routing, every client read every egress partition and skipped the others' replies: in this
workload each client received all 1 000 replies of the two others; with routing, none.
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import TopicPartition  # type: ignore[import-untyped]

from styx_client import StyxClient
from styx_py.core.wire import reply_decoder
from styx_py.io.kafka_logs import read_to_end
from styx_py.stack.local import LocalStack
from tests.service_fixtures import ClusterFactory
from tests.test_integration import read_until

pytestmark = pytest.mark.services

ACCOUNTS = 200
TRANSFERS = 300  # per client
PARTITIONS = 4  # the bank app's: the egress topic has as many


@pytest.fixture
def stack(local_cluster: ClusterFactory) -> LocalStack:
    # As docker-compose and Kubernetes run it on Apache Kafka: routing on, a longer fetch wait.
    return local_cluster(
        app="styx_benchmarks.bank:app", settings={"reply_routing": "true", "kafka_fetch_wait_ms": "100"}
    )


async def _transfers(client: StyxClient, first: int) -> list[str]:
    """Deposits into this client's own accounts, then transfers among them; the request ids."""
    mine = [f"c{first}-{i}" for i in range(ACCOUNTS)]
    rids = [f"c{first}-dep-{i}" for i in range(ACCOUNTS)] + [f"c{first}-tx-{i}" for i in range(TRANSFERS)]
    await asyncio.gather(
        *(
            client.call("account", key, "deposit", 10, request_id=rid)
            for key, rid in zip(mine, rids, strict=False)
        )
    )
    replies = await asyncio.gather(
        *(
            client.submit(
                "account", mine[i % ACCOUNTS], "transfer", mine[(i * 7 + 1) % ACCOUNTS], 1, request_id=rid
            )
            for i, rid in enumerate(rids[ACCOUNTS:])
        )
    )
    assert all(r.status in ("committed", "aborted") for r in replies), [
        r for r in replies if r.status == "failed"
    ]
    return rids


async def test_three_clients_on_distinct_partitions_read_no_foreign_reply(stack: LocalStack) -> None:
    clients = [
        await StyxClient.connect(stack.coordinator, timeout_s=120, reply_partition=p) for p in range(3)
    ]
    # Clients that connect through the coordinator wait per fetch as the cluster's consumers do.
    assert [c.fetch_wait_ms for c in clients] == [100] * 3
    try:
        sent = await asyncio.gather(*(_transfers(c, i) for i, c in enumerate(clients)))
        for i, c in enumerate(clients):
            assert c.reply_partition == i
            assert c.stats.replied == ACCOUNTS + TRANSFERS
            # The point of routing: nothing of another client's reached this one.
            assert (c.stats.foreign_ignored, c.stats.unmatched_ignored) == (0, 0), c.stats
    finally:
        for c in clients:
            await c.close()

    # On the egress log itself: every reply of client i is on partition i, and only there (read until
    # every one is there: read_until).
    topic = stack.env["STYX_EGRESS_TOPIC"]
    wanted = {rid for rids in sent for rid in rids}
    records = await read_until(
        lambda: read_to_end(stack.kafka, {TopicPartition(topic, p): 0 for p in range(PARTITIONS)}),
        lambda recs: wanted <= {reply_decoder.decode(r.value).request_id for r in recs},
    )
    where: dict[str, set[int]] = {}
    for r in records:
        where.setdefault(reply_decoder.decode(r.value).request_id, set()).add(r.partition)
    for i, rids in enumerate(sent):
        assert all(where.get(rid) == {i} for rid in rids), {rid: where.get(rid) for rid in rids[:5]}
