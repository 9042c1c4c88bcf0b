"""Real round trips through the local services started by ``styx_py.stack.services`` (no mocks).

These pin the behaviour the rest of styx relies on: S3 objects and acknowledged Kafka records
are readable, and stay readable across restarts (and crashes) of the service that stores them.
"""

from __future__ import annotations

import asyncio
import io
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from styx_py.stack.local import LocalStack
from styx_py.stack.services import (
    S3Config,
    SeaweedS3,
    ServiceError,
    TansuBroker,
    create_topics,
    free_port,
    minio_client,
)
from tests.service_fixtures import DurableKafkaFactory

pytestmark = [pytest.mark.services, pytest.mark.timeout(120)]


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def _put(config: S3Config, bucket: str, key: str, data: bytes) -> None:
    minio_client(config).put_object(bucket, key, io.BytesIO(data), len(data))


def _get(config: S3Config, bucket: str, key: str) -> bytes:
    response = minio_client(config).get_object(bucket, key)
    try:
        return response.read()
    finally:
        response.close()
        response.release_conn()


async def _produce(bootstrap: str, topic: str, value: bytes, headers: list[tuple[str, bytes]]) -> int:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        meta = await producer.send_and_wait(topic, value, key=b"k", headers=headers)
        return int(meta.offset)
    finally:
        await producer.stop()


async def _read_from_start(bootstrap: str, topic: str, count: int) -> tuple[list[bytes | None], int]:
    """Read ``count`` records from offset 0 of partition 0; return values and the high watermark.

    Manual assign (a group join takes ~5 s on Tansu), a short fetch wait (0 never returns data
    and a waiting fetch is not answered early), and ``highwater()`` rather than
    ``end_offsets()``, which is wrong on Tansu.
    """
    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=10)
    await consumer.start()
    try:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        values: list[bytes | None] = []
        async with asyncio.timeout(20):
            while len(values) < count:
                batches = await consumer.getmany(tp, timeout_ms=1000)
                values.extend(record.value for record in batches.get(tp, []))
        highwater = consumer.highwater(tp)
        assert highwater is not None
        return values, highwater
    finally:
        await consumer.stop()


def test_free_port_reserves_the_grpc_neighbour() -> None:
    ports = {free_port(also_plus_10000=True) for _ in range(20)}
    assert len(ports) == 20
    assert not ports & {p + 10000 for p in ports}
    assert all(p + 10000 <= 65535 for p in ports)


def test_s3_put_get_round_trip(s3: SeaweedS3) -> None:
    key = _unique("roundtrip/obj")
    data = uuid.uuid4().bytes * 1000
    _put(s3.config, "styx-snapshots", key, data)
    assert _get(s3.config, "styx-snapshots", key) == data
    listed = [o.object_name for o in minio_client(s3.config).list_objects("styx-snapshots", prefix=key)]
    assert listed == [key]


def test_s3_rejects_wrong_credentials(s3: SeaweedS3) -> None:
    from minio.error import S3Error

    wrong = S3Config(s3.config.endpoint, s3.config.access_key, "not-the-secret")
    with pytest.raises(S3Error):
        _put(wrong, "styx-snapshots", _unique("denied"), b"x")


async def test_the_s3_blob_store_deletes_many_keys_in_few_requests_and_keeps_the_rest(s3: SeaweedS3) -> None:
    """Retention (styx_coordinator.snapshots) deletes a compaction's old objects with S3's multi-object
    delete, up to 1 000 keys a request, not a request per key; missing keys are no error."""
    from minio.error import S3Error

    from styx_py.core.errors import BackendError
    from styx_py.io.s3 import MinioBlobStore

    store = MinioBlobStore(minio_client(s3.config), "styx-snapshots")
    prefix = _unique("retain")
    keys = [f"{prefix}/{i:05d}" for i in range(1_003)]
    await asyncio.gather(*(store.put(k, b"x") for k in keys))
    trace = io.StringIO()
    store.client.trace_on(trace)  # minio writes every HTTP request it sends here
    await store.delete([*keys[:1_001], f"{prefix}/missing"])
    store.client.trace_off()
    assert trace.getvalue().count("START-HTTP") == 2, "1 002 keys: two requests of up to 1 000"
    assert await store.list(prefix) == keys[1_001:]
    await store.delete([])
    assert await store.list(prefix) == keys[1_001:]
    wrong_keys = S3Config(s3.config.endpoint, s3.access_key, "not-it")
    wrong = MinioBlobStore(minio_client(wrong_keys), "styx-snapshots")
    with pytest.raises(BackendError) as refused:  # the blob store port's operating error (an OSError)
        await wrong.delete(keys[1_001:])
    assert isinstance(refused.value, OSError) and isinstance(refused.value.__cause__, S3Error)
    assert await store.list(prefix) == keys[1_001:]


@pytest.mark.parametrize("hard", [False, True], ids=["sigterm", "sigkill"])
def test_seaweed_keeps_objects_across_restart(s3: SeaweedS3, hard: bool) -> None:
    key = _unique("durable/obj")
    data = b"survives " + key.encode()
    endpoint = s3.config.endpoint
    _put(s3.config, "styx-snapshots", key, data)
    s3.restart(hard=hard)
    assert s3.config.endpoint == endpoint  # same ports: existing configs stay valid
    assert _get(s3.config, "styx-snapshots", key) == data
    # Auth must survive the restart too (SeaweedFS drops env-provided keys on restart).
    assert _get(S3Config(endpoint, s3.access_key, s3.secret_key), "styx-snapshots", key) == data


@pytest.mark.asyncio
async def test_memory_broker_produce_consume(kafka: TansuBroker) -> None:
    topic = _unique("mem")
    await create_topics(kafka.bootstrap, {topic: 2})
    await create_topics(kafka.bootstrap, {topic: 2})  # idempotent
    offset = await _produce(kafka.bootstrap, topic, b"hello", [("h", b"v")])
    assert offset == 0
    values, highwater = await _read_from_start(kafka.bootstrap, topic, 1)
    assert values == [b"hello"]
    assert highwater == 1


@pytest.mark.asyncio
@pytest.mark.parametrize("hard", [False, True], ids=["sigterm", "sigkill"])
async def test_durable_broker_keeps_acked_record_across_restart(
    durable_kafka: DurableKafkaFactory, hard: bool
) -> None:
    broker = durable_kafka()
    bootstrap = broker.bootstrap
    topic = _unique("durable")
    await create_topics(bootstrap, {topic: 1})
    await _produce(bootstrap, topic, b"first", [])
    await _produce(bootstrap, topic, b"second", [])

    # Called from inside a running loop on purpose: readiness runs in its own thread.
    broker.restart(hard=hard)
    assert broker.bootstrap == bootstrap

    values, highwater = await _read_from_start(bootstrap, topic, 2)
    assert values == [b"first", b"second"]
    assert highwater == 2
    # And it still accepts writes after the restart.
    assert await _produce(bootstrap, topic, b"third", []) == 2


def test_memory_broker_restart_keeps_port_and_loses_data() -> None:
    with TansuBroker("memory") as broker:
        bootstrap = broker.bootstrap
        topic = _unique("volatile")
        asyncio.run(create_topics(bootstrap, {topic: 1}))
        asyncio.run(_produce(bootstrap, topic, b"gone", []))
        broker.restart()
        assert broker.bootstrap == bootstrap
        # The topic is gone with the memory store: creating it again succeeds.
        asyncio.run(create_topics(bootstrap, {topic: 1}))
    assert not broker.running
    broker.stop()  # idempotent


class _BrokenTansu(TansuBroker):
    """A real Tansu process that exits at start-up (unsupported storage URL)."""

    def _command(self) -> list[str]:
        cmd = super()._command()
        cmd[cmd.index("--storage-engine") + 1] = "bogus://nowhere/"
        return cmd


def test_early_exit_is_reported_at_once_with_log_tail() -> None:
    """A process that dies during start-up is reported as such, with its log (a start that waited for
    the deadline would report a timeout instead)."""
    broker = _BrokenTansu("memory")
    with pytest.raises(ServiceError, match=r"(?s)exited with code 1.*UnsupportedStorageUrl"):
        broker.start(timeout_s=600)
    assert not broker.running
    broker.stop()


def test_port_taken_by_another_server_is_refused(kafka: TansuBroker) -> None:
    """Readiness probes a port; if another server holds it, start() must not report ready."""
    squatter = TansuBroker("memory")
    squatter._port = int(kafka.bootstrap.rsplit(":", 1)[1])
    with pytest.raises(ServiceError, match="already in use"):
        squatter.start(timeout_s=5)
    assert not squatter.running
    squatter.stop()


class _NeverReady(LocalStack):
    """A local cluster whose processes start, and whose wait for them then fails."""

    started: dict[str, Any]

    def _wait_registered(self, timeout_s: float) -> None:
        self.started = dict(self.procs)
        raise ServiceError("workers did not register (made to fail)")


def test_a_cluster_that_fails_to_start_stops_what_it_started(kafka: TansuBroker, tmp_path: Path) -> None:
    # Called directly (styx up, the benchmarks) and as a context manager, whose __exit__ does not run
    # when __enter__ raises.
    for how in ("start", "with"):
        env = {"STYX_INGRESS_TOPIC": f"in-{uuid.uuid4().hex[:8]}", "STYX_LOG_LEVEL": "WARNING"}
        stack = _NeverReady(tmp_path / how, workers=2, kafka=kafka.bootstrap, env=env)
        with pytest.raises(ServiceError, match="made to fail"):
            if how == "start":
                stack.start()
            else:
                with stack:
                    pytest.fail("the stack started")
        assert sorted(stack.started) == ["coordinator", "w1", "w2"], how
        left = [name for name, proc in stack.started.items() if proc.poll() is None]
        assert not left, f"{how}: left running: {left}"


def test_seaweed_leaves_no_socket_files_behind(tmp_path: Path) -> None:
    """SeaweedFS makes Unix sockets in /tmp named by its ports; stopped, the instance removes its own
    and keeps its log files in its data directory."""
    import glob

    def ours(ports: list[int]) -> list[str]:
        return [p for port in ports for p in glob.glob(f"/tmp/seaweedfs-*-{port}.sock")]

    service = SeaweedS3(tmp_path / "s3", buckets=["styx-sockets"])
    with service:
        ports = service._listen_ports()
        assert ours(ports), "no socket of this instance in /tmp: the test tests nothing"
    assert ours(ports) == []
    assert list((tmp_path / "s3" / "tmp").glob("weed*")), "its log files are not in its data directory"
