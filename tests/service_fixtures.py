"""Pytest plugin: real local services (SeaweedFS S3, Tansu Kafka) and a SparkSession as fixtures.

Load with ``pytest_plugins = ["tests.service_fixtures"]`` in ``tests/conftest.py`` (or
``-p tests.service_fixtures``). Services are started lazily, only by tests that ask for them,
so unit-test runs pay nothing. The S3 server and the in-memory broker are shared by the whole
session because starting them costs ~1.2 s and ~0.1 s; durable brokers are per test because
tests restart or kill them. The SparkSession (``spark``) is shared by the session too: each new one
costs 6-9 s.
"""

from __future__ import annotations

import contextlib
import itertools
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from styx_py.stack.local import LocalStack
from styx_py.stack.services import SeaweedS3, TansuBroker

S3_BUCKETS = ["styx-snapshots", "tansu"]
TANSU_BUCKET = "tansu"


def pytest_configure(config: pytest.Config) -> None:
    # Also registered in pyproject.toml; repeated here so the plugin works on its own.
    config.addinivalue_line(
        "markers", "services: needs the real local services (SeaweedFS, Tansu) started by fixtures"
    )


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """A running SeaweedFS with buckets ``styx-snapshots`` and ``tansu``, for the whole session.

    Tests may ``restart()`` it (same ports, same data); they must leave it running.
    """
    service = SeaweedS3(tmp_path_factory.mktemp("seaweedfs"), buckets=S3_BUCKETS)
    with service:
        yield service


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    """A running Tansu broker with memory storage, shared by the session.

    Topics outlive the test that made them: use unique topic names.
    """
    broker = TansuBroker("memory", log_path=tmp_path_factory.mktemp("tansu-memory") / "tansu.log")
    with broker:
        yield broker


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession (``local[2]``, 1 GiB) for every test that asks: a new one costs 6-9 s."""
    pytest.importorskip("pyspark")
    from styx_py.audit.job import spark_session

    session = spark_session("styx-tests", driver_memory="1g")
    yield session
    session.stop()


DurableKafkaFactory = Callable[..., TansuBroker]


@pytest.fixture
def durable_kafka(s3: SeaweedS3, tmp_path: Path) -> Iterator[DurableKafkaFactory]:
    """Factory: ``durable_kafka(bucket="tansu")`` starts a Tansu broker on the ``s3`` service.

    Every broker it made is stopped at teardown. The bucket keeps its data across tests, so
    use unique topic names; do not run two brokers on one bucket at the same time.
    """
    brokers: list[TansuBroker] = []

    def make(bucket: str = TANSU_BUCKET) -> TansuBroker:
        broker = TansuBroker(s3.config, bucket=bucket, log_path=tmp_path / f"tansu-{len(brokers)}.log")
        brokers.append(broker)
        return broker.start()

    yield make
    for broker in brokers:
        broker.stop()


# ---- a local cluster (coordinator + worker processes) on the session's services --------------------------


def cluster_env(**settings: str) -> dict[str, str]:
    """``STYX_*`` variables of a cluster with Kafka topics and a snapshot bucket of its own (the broker
    and S3 server are shared by the session), plus ``settings`` by setting name
    (``snapshot_interval_s="0.5"``). Reply routing is off, as ``styx up`` runs it on its own Tansu
    (stack/local.py: with several workers producing to one egress partition, a client reading its
    tail missed about one reply in 4 000): tests of routing itself turn it on."""
    suffix = uuid.uuid4().hex[:8]
    env = {
        "STYX_INGRESS_TOPIC": f"ingress-{suffix}",
        "STYX_EGRESS_TOPIC": f"egress-{suffix}",
        "STYX_SEQLOG_TOPIC": f"seqlog-{suffix}",
        "STYX_CHANGELOG_TOPIC": f"changelog-{suffix}",
        "STYX_SNAPSHOT_BUCKET": f"snap-{suffix}",
        "STYX_LOG_LEVEL": "WARNING",
        "STYX_REPLY_ROUTING": "false",
    }
    env.update({f"STYX_{name.upper()}": value for name, value in settings.items()})
    return env


@contextlib.contextmanager
def start_cluster(
    path: Path,
    kafka: TansuBroker,
    *,
    s3: SeaweedS3 | None = None,
    app: str | None = None,
    workers: int = 2,
    settings: Mapping[str, str] | None = None,
    **options: Any,
) -> Iterator[LocalStack]:
    """A coordinator and ``workers`` worker processes on ``kafka`` (and on ``s3`` for snapshots, if
    given) with topics of their own, ``app`` deployed if given; stopped on exit. ``options`` go to
    :class:`~styx_py.stack.local.LocalStack` (``gateway=True``, ``gateway_args=[...]``)."""
    env = cluster_env(**(settings or {}))
    cfg = None if s3 is None else s3.config
    with LocalStack(path, workers=workers, kafka=kafka.bootstrap, s3=cfg, env=env, **options) as stack:
        if app is not None:
            stack.deploy(app)
        yield stack


ClusterFactory = Callable[..., LocalStack]


@pytest.fixture
def local_cluster(kafka: TansuBroker, tmp_path: Path) -> Iterator[ClusterFactory]:
    """Factory: ``local_cluster(app=..., s3=..., settings={...}, gateway=True)`` starts a cluster with
    :func:`start_cluster` on the session's Tansu; every cluster it made is stopped at teardown."""
    numbers = itertools.count()
    with contextlib.ExitStack() as clusters:

        def make(**kw: Any) -> LocalStack:
            return clusters.enter_context(start_cluster(tmp_path / f"cluster-{next(numbers)}", kafka, **kw))

        yield make


def record_produces(sink: Any, monkeypatch: Any) -> list[set[str]]:
    """The topics of each produce request ``sink``'s producer sends from now on, in order."""
    produced: list[set[str]] = []
    send = sink.producer.client.send

    async def recording_send(node_id: int, request: Any, *args: Any, **kwargs: Any) -> Any:
        if type(request).__name__ == "ProduceRequest":
            produced.append({topic for topic, _ in request._topics})
        return await send(node_id, request, *args, **kwargs)

    monkeypatch.setattr(sink.producer.client, "send", recording_send)
    return produced
