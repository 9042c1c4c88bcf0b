"""Pytest plugin: real local services (SeaweedFS S3, Tansu Kafka) as fixtures.

Load with ``pytest_plugins = ["tests.service_fixtures"]`` in ``tests/conftest.py`` (or
``-p tests.service_fixtures``). Services are started lazily, only by tests that ask for them,
so unit-test runs pay nothing. The S3 server and the in-memory broker are shared by the whole
session because starting them costs ~1.2 s and ~0.1 s; durable brokers are per test because
tests restart or kill them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

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
