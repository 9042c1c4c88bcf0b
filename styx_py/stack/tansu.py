"""A Kafka-protocol broker on a developer machine: Tansu as a managed subprocess, in memory or on S3.

Its readiness probe (a CreateTopics) needs asyncio (aiokafka); it runs in a private thread with its
own event loop, so :meth:`TansuBroker.start` is safe to call from inside a running event loop too
(it blocks that loop while waiting).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Literal, Self, TypeVar

# aiokafka ships no type information; the extra code keeps this line clean whether or not
# the project's mypy config already ignores the missing stubs.
from aiokafka.errors import (  # type: ignore[import-untyped,unused-ignore]
    KafkaError,
)

from styx_py.io.kafka_admin import create_topics
from styx_py.stack.binaries import tansu_binary
from styx_py.stack.errors import ServiceError
from styx_py.stack.net import preferred_port
from styx_py.stack.process import SERVICE_START_TIMEOUT_S, ManagedProcess, poll_until
from styx_py.stack.seaweed import S3_TRANSIENT, S3Config, ensure_buckets, minio_client

__all__ = ["TansuBroker"]

_T = TypeVar("_T")

_READINESS_TOPIC = "styx-readiness-probe"


class TansuBroker(ManagedProcess):
    """A Tansu Kafka-protocol broker on 127.0.0.1, in memory or on S3 storage.

    Memory storage loses everything on restart (fast, for most tests). S3 storage keeps every
    acknowledged record and committed offset across restarts and crashes; the bucket is
    created if missing, because Tansu opens its port without it and then never becomes ready.
    ``restart()`` keeps the port so clients can reconnect to the same bootstrap address.
    """

    name = "tansu"

    def __init__(
        self,
        storage: Literal["memory"] | S3Config = "memory",
        bucket: str = "tansu",
        log_path: Path | None = None,
        port: int | None = None,
    ) -> None:
        """``port``: the port to use when it is free, else a free one (:attr:`port_taken` then says
        so); None: a free one."""
        super().__init__(log_path)
        if not isinstance(storage, S3Config) and storage != "memory":
            raise ValueError(f"storage must be 'memory' or an S3Config, not {storage!r}")
        self.storage = storage
        self.bucket = bucket
        self._port: int | None = None
        self.port = port
        self.port_taken = False

    @property
    def bootstrap(self) -> str:
        """``host:port`` for ``bootstrap_servers``; valid once started, kept across restarts."""
        if self._port is None:
            raise ServiceError("TansuBroker not started yet: no port chosen")
        return f"127.0.0.1:{self._port}"

    def _listen_ports(self) -> list[int]:
        assert self._port is not None
        return [self._port]

    def _command(self) -> list[str]:
        url = f"tcp://{self.bootstrap}"
        engine = "memory://tansu/" if self.storage == "memory" else f"s3://{self.bucket}/"
        return [
            tansu_binary(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            engine,
        ]

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        # Tansu reads its options from these too; make sure only our flags count.
        for name in ("LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE", "CLUSTER_ID"):
            env.pop(name, None)
        env.setdefault("RUST_LOG", "warn")
        if isinstance(self.storage, S3Config):
            env.update(
                AWS_ENDPOINT=self.storage.url,
                AWS_ALLOW_HTTP="false" if self.storage.secure else "true",
                AWS_ACCESS_KEY_ID=self.storage.access_key,
                AWS_SECRET_ACCESS_KEY=self.storage.secret_key,
                AWS_DEFAULT_REGION=self.storage.region,
                AWS_REGION=self.storage.region,
            )
        return env

    def _ensure_bucket(self, deadline: float) -> None:
        assert isinstance(self.storage, S3Config)
        storage = self.storage
        client = minio_client(storage, fail_fast=True)
        poll_until(
            lambda: ensure_buckets(client, [self.bucket]),
            deadline=deadline,
            transient=S3_TRANSIENT,
            check_alive=lambda: None,
            on_timeout=lambda err: ServiceError(
                f"S3 storage for Tansu at {storage.endpoint} unusable (bucket {self.bucket!r}): {err!r}"
            ),
        )

    def _wait_ready(self, deadline: float) -> None:
        transient: tuple[type[BaseException], ...] = (KafkaError, OSError, asyncio.TimeoutError)
        bootstrap = self.bootstrap

        async def probe() -> None:
            remaining_ms = max(500, int((deadline - time.monotonic()) * 1000))
            await asyncio.wait_for(
                create_topics(bootstrap, {_READINESS_TOPIC: 1}, request_timeout_ms=min(remaining_ms, 5000)),
                timeout=min(remaining_ms, 5000) / 1000,
            )

        def attempt() -> None:
            _run_coroutine_sync(probe)

        poll_until(
            attempt,
            deadline=deadline,
            transient=transient,
            check_alive=self._check_alive,
            on_timeout=lambda err: self._timeout_error("Kafka CreateTopics", err),
        )

    def start(self, timeout_s: float = SERVICE_START_TIMEOUT_S) -> Self:
        """Launch the broker and return once it answers CreateTopics successfully."""
        if self._port is None:
            self._port, self.port_taken = preferred_port(self.port)
        if isinstance(self.storage, S3Config):
            self._ensure_bucket(time.monotonic() + timeout_s)
        self._launch(timeout_s)
        return self


def _run_coroutine_sync(factory: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """Run ``asyncio.run(factory())`` in a fresh worker thread and wait for its result.

    A worker thread has no running loop, so this works whether or not the caller is itself
    inside an event loop (pytest-asyncio tests, ``styx up`` in an async main).
    """
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()
