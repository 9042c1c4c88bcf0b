"""What the coordinator says is deployed: the operators, functions, Kafka address and topics a client
needs (:meth:`StyxClient.connect <styx_client.sdk.StyxClient.connect>`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from styx_py.core.errors import ConfigError, ProtocolError, StyxError, Unavailable
from styx_py.core.limits import MIN_FETCH_WAIT_MS
from styx_py.core.wire import StatusRequest
from styx_py.io.admin import admin_request
from styx_py.io.clusterfile import default_coordinator, default_secret

__all__ = [
    "client_arguments",
    "connect_arguments",
    "coordinator_status",
    "fetch_wait_of",
    "worker_partitions",
]


async def coordinator_status(
    coordinator: str, timeout_s: float, cluster_secret: str | None = None
) -> Mapping[str, Any]:
    """The status body of the coordinator at ``host:port`` (``cluster_secret``: see StyxClient.connect)."""
    try:
        reply = await admin_request(coordinator, StatusRequest(), timeout_s=timeout_s, secret=cluster_secret)
    except (OSError, TimeoutError) as exc:
        raise Unavailable(f"cannot reach the coordinator at {coordinator}: {exc}") from exc
    if not reply.ok:
        raise StyxError(f"coordinator at {coordinator} refused the status request: {reply.error}")
    return reply.body


def client_arguments(
    coordinator: str, body: Mapping[str, Any], kw: dict[str, Any]
) -> tuple[str, dict[str, int]]:
    """The bootstrap address and the operators from a coordinator's status ``body``.

    Also fills the topics, functions, reply partition (when the cluster turns routing off) and fetch
    wait into the client's keyword arguments ``kw`` unless given there; a ``bootstrap`` in ``kw``
    overrides (and leaves) it.
    """
    ops = body.get("operators") or []
    if not ops:
        raise StyxError(f"nothing is deployed on the coordinator at {coordinator}: deploy a graph first")
    bootstrap = kw.pop("bootstrap", None) or body.get("kafka_bootstrap")
    if not bootstrap:
        raise ConfigError(
            f"the coordinator at {coordinator} reports no kafka_bootstrap; pass bootstrap=HOST:PORT"
        )
    try:
        operators = {str(op["name"]): int(op["partitions"]) for op in ops}
        functions = {str(op["name"]): [str(f) for f in op.get("functions") or []] for op in ops}
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed operator list in the coordinator's status: {ops!r}") from exc
    for topic in ("ingress_topic", "egress_topic"):
        if topic not in kw and body.get(topic):
            kw[topic] = str(body[topic])
    kw.setdefault("functions", functions)
    if body.get("reply_routing") is False:  # the cluster's broker needs replies spread (Config.reply_routing)
        kw.setdefault("reply_partition", -1)
    wait = fetch_wait_of(body)
    if wait is not None:
        kw.setdefault("fetch_wait_ms", wait)
    return str(bootstrap), operators


def fetch_wait_of(body: Mapping[str, Any]) -> int | None:
    """The fetch wait a coordinator's status gives its consumers (``Config.kafka_fetch_wait_ms``: it suits
    the cluster's broker), if it names one a client accepts; None from a coordinator that predates it."""
    wait = body.get("kafka_fetch_wait_ms")
    return wait if type(wait) is int and wait >= MIN_FETCH_WAIT_MS else None


async def connect_arguments(
    coordinator: str | None, cluster_secret: str | None, kw: dict[str, Any]
) -> tuple[str, dict[str, int]]:
    """:meth:`StyxClient.connect <styx_client.sdk.StyxClient.connect>`'s look at the coordinator: the
    bootstrap address and the operators, the rest filled into the keyword arguments ``kw``."""
    coordinator = coordinator or default_coordinator()
    if not coordinator:
        raise ConfigError("no coordinator: pass its host:port, set STYX_COORDINATOR or run 'styx up' here")
    if cluster_secret is None:
        cluster_secret = default_secret(coordinator)
    body = await coordinator_status(coordinator, float(kw.get("timeout_s", 30.0)), cluster_secret)
    bootstrap, operators = client_arguments(coordinator, body, kw)
    kw.setdefault("coordinator", coordinator)
    kw.setdefault("cluster_secret", cluster_secret)
    kw.setdefault("workers", worker_partitions(body))
    return bootstrap, operators


def worker_partitions(status: Mapping[str, Any]) -> dict[str, list[int]]:
    """The ``host:port`` of every worker in a coordinator's status body, with the partitions it owns."""
    rows = status.get("workers") or []
    return {
        str(row["address"]): [int(p) for p in row.get("partitions") or []]
        for row in rows
        if isinstance(row, Mapping) and row.get("address")
    }
