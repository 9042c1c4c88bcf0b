"""The gateway's link to the cluster: the coordinator's status, polled, and the SDK client behind it.

:class:`ClusterLink` polls the coordinator every ``status_interval_s`` (the :data:`StatusSource`),
connects the backend (a :class:`~styx_client.sdk.StyxClient`, made by a :data:`BackendFactory`) once
a graph is deployed, and answers what depends on the cluster alone: readiness, whether a new invocation
can be taken (else 503) and whether its operator and function are deployed (else 404).
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from styx_client.gateway.config import GatewayConfig
from styx_client.gateway.models import ClusterSummary, OperatorInfo, Readiness
from styx_client.gateway.outcomes import Outcome, failure, retry_after
from styx_client.sdk import StyxClient
from styx_client.sdk.deployment import fetch_wait_of
from styx_client.sdk.push import worker_partitions
from styx_py.core.errors import ProtocolError, StyxError
from styx_py.core.limits import GATEWAY_UNREACHABLE_AFTER_POLLS
from styx_py.core.wire import Key, Reply, StatusRequest
from styx_py.io.admin import admin_request

__all__ = [
    "Backend",
    "BackendFactory",
    "ClusterInfo",
    "ClusterLink",
    "StatusSource",
    "connect_client",
    "coordinator_status",
]

log = logging.getLogger("styx.gateway")

_AVAILABLE_STATES = frozenset({"running", "idle"})

StatusSource = Callable[[], Awaitable[Mapping[str, Any]]]
"""Returns the coordinator's status body; injectable so tests can play a recovering cluster."""


class Backend(Protocol):
    """What the gateway needs of the SDK (:class:`~styx_client.sdk.StyxClient` is one)."""

    async def submit(
        self,
        operator: str,
        key: Key,
        function: str,
        *args: Any,
        request_id: str | None = None,
        timeout_s: float | None = None,
    ) -> Reply: ...

    async def close(self) -> None: ...

    def set_deployment(
        self, operators: Mapping[str, int], functions: Mapping[str, Collection[str]] | None = None
    ) -> None: ...


BackendFactory = Callable[[Mapping[str, Any], GatewayConfig], Awaitable[Backend]]


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """The gateway's latest view of the cluster, refreshed every ``status_interval_s``."""

    state: str
    """starting | running | idle | recovering | undeployed | unreachable (or a newer server state)"""
    graph: str | None = None
    operators: Mapping[str, int] = field(default_factory=dict)
    functions: Mapping[str, frozenset[str]] = field(default_factory=dict)
    reason: str = ""
    state_functions: Mapping[str, str] = field(default_factory=dict)
    """operator → the function the deployed graph says returns an entity's state (``/v1/state``)."""

    @classmethod
    def from_status(cls, body: Mapping[str, Any]) -> "ClusterInfo":
        """Parse a coordinator status body; a missing ``state`` means running (older coordinators)."""
        try:
            ops = body.get("operators") or []
            operators = {str(op["name"]): int(op["partitions"]) for op in ops}
            functions = {str(op["name"]): frozenset(str(f) for f in op.get("functions") or []) for op in ops}
            readers = {str(op["name"]): str(op["state_function"]) for op in ops if op.get("state_function")}
            graph = body.get("graph")
            state = str(body.get("state") or "running")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProtocolError(f"malformed coordinator status: {exc!r}") from exc
        if not graph or not operators:
            return cls("undeployed", None, {}, {}, "nothing is deployed")
        return cls(state, str(graph), operators, functions, state_functions=readers)

    @property
    def available(self) -> bool:
        return self.state in _AVAILABLE_STATES


def coordinator_status(
    address: str, timeout_s: float = 2.0, cluster_secret: str | None = None
) -> StatusSource:
    """The default :data:`StatusSource`: the coordinator's admin ``StatusRequest``, authenticated with
    ``cluster_secret`` (default: ``$STYX_CLUSTER_SECRET``)."""

    async def fetch() -> Mapping[str, Any]:
        reply = await admin_request(address, StatusRequest(), timeout_s=timeout_s, secret=cluster_secret)
        if not reply.ok:
            raise StyxError(f"coordinator at {address} refused the status request: {reply.error}")
        return reply.body

    return fetch


async def connect_client(status: Mapping[str, Any], config: GatewayConfig) -> Backend:
    """The default :data:`BackendFactory`: a started :class:`StyxClient` for the deployed graph."""
    info = ClusterInfo.from_status(status)
    bootstrap = status.get("kafka_bootstrap")
    if not bootstrap:
        raise StyxError(f"the coordinator at {config.coordinator} reports no kafka_bootstrap")
    wait = fetch_wait_of(status)
    as_the_cluster: dict[str, Any] = {} if wait is None else {"fetch_wait_ms": wait}  # its consumers' wait
    client = StyxClient(
        str(bootstrap),
        info.operators,
        ingress_topic=str(status.get("ingress_topic") or "styx-ingress"),
        egress_topic=str(status.get("egress_topic") or "styx-egress"),
        # The gateway bounds pending jobs itself; the client's bound is a backstop at the same size.
        max_pending=config.limits.max_pending,
        timeout_s=config.timing.connect_timeout_s,
        functions=info.functions,
        reply_partition=None if status.get("reply_routing", True) else -1,  # Config.reply_routing
        # Replies pushed by the workers (styx_client.sdk.push), found through the same coordinator.
        coordinator=config.coordinator,
        cluster_secret=config.cluster_secret,
        workers=worker_partitions(status),
        **as_the_cluster,
    )
    await client.start()
    return client


class ClusterLink:
    """The latest :class:`ClusterInfo` and the backend, kept current by :meth:`run`."""

    def __init__(
        self, config: GatewayConfig, status_source: StatusSource, backend_factory: BackendFactory
    ) -> None:
        self.config = config
        self.status_source = status_source
        self.backend_factory = backend_factory
        self.info = ClusterInfo("starting", reason="the coordinator has not answered yet")
        self.backend: Backend | None = None
        self.status: Mapping[str, Any] = {}
        """The coordinator's latest status body, as it answered it (``GET /v1/cluster``)."""
        self.on_status: Callable[[Mapping[str, Any]], None] = lambda status: None

    # ---- polling ----------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Poll the coordinator's status; connect the client once something is deployed."""
        failures = 0
        while True:
            failures = await self._poll(failures)
            await asyncio.sleep(self.config.timing.status_interval_s)

    async def _poll(self, failures: int) -> int:
        """One status poll; returns the number of consecutive failed polls after it."""
        try:
            status = await self.status_source()
            info = ClusterInfo.from_status(status)
        except (StyxError, OSError, TimeoutError, EOFError) as exc:
            failures += 1
            if failures >= GATEWAY_UNREACHABLE_AFTER_POLLS and self.info.state != "unreachable":
                log.warning("coordinator at %s unreachable: %r", self.config.coordinator, exc)
                self.info = replace(self.info, state="unreachable", reason=f"{exc!r}")
            return failures
        self.status = status
        self.on_status(status)
        if info.state != self.info.state:
            log.info("cluster state: %s", info.state)
        if (
            self.backend is not None
            and info.operators
            and (info.operators, info.functions)
            != (
                self.info.operators,
                self.info.functions,
            )
        ):
            # A code update added operators or functions: the client checks calls against them now.
            log.info("deployed graph changed to %s", info.graph)
            self.backend.set_deployment(info.operators, info.functions)
        self.info = info
        if self.backend is None and info.state != "undeployed":
            await self._connect(status)
        return 0

    async def _connect(self, status: Mapping[str, Any]) -> None:
        try:
            self.backend = await self.backend_factory(status, self.config)
        except StyxError as exc:
            # Retried at the next status poll; until then /readyz says why.
            log.warning("cannot connect the gateway's client yet: %s", exc)
            self.info = replace(self.info, reason=f"client not connected: {exc}")
        else:
            log.info("gateway client connected (%s)", ", ".join(sorted(self.info.operators)))

    async def close(self) -> None:
        """Close the backend, if one is connected."""
        backend, self.backend = self.backend, None
        if backend is not None:
            await backend.close()

    # ---- what depends on the cluster alone ---------------------------------------------------------------

    def readiness(self) -> Readiness:
        info = self.info
        if self.backend is None:
            reason = info.reason or "client not connected yet"
            return Readiness(ready=False, state=info.state, reason=reason)
        if not info.available:
            return Readiness(ready=False, state=info.state, reason=info.reason or None)
        return Readiness(ready=True, state=info.state)

    def unavailable(self, request_id: str | None) -> Outcome | None:
        """503 (with Retry-After) when a new invocation cannot be taken; None when it can."""
        info = self.info
        match info.state:
            case state if state in _AVAILABLE_STATES and self.backend is not None:
                return None
            case "recovering":
                code, message = "recovering", "the cluster is recovering from a failure; retry shortly"
            case "unreachable":
                code, message = "unavailable", f"the coordinator is unreachable ({info.reason})"
            case "undeployed":
                code, message = "not_deployed", "nothing is deployed on the cluster"
            case state if state in _AVAILABLE_STATES or state == "starting":
                code, message = "not_ready", f"the gateway is not connected yet: {info.reason or state}"
            case state:
                code, message = "unavailable", f"the cluster is {state!r}"
        headers = retry_after(self.config.timing.retry_after_s)
        return failure(503, code, message, request_id=request_id, headers=headers)

    def check_target(self, operator: str, function: str | None) -> Outcome | None:
        """404 for an operator (or, unless ``function`` is None, a function) that is not deployed."""
        functions = self.info.functions.get(operator)
        if functions is None:
            known = sorted(self.info.operators)
            return failure(404, "unknown_operator", f"unknown operator {operator!r}; known: {known}")
        if function is not None and function not in functions:
            return failure(
                404,
                "unknown_function",
                f"operator {operator!r} has no function {function!r}; known: {sorted(functions)}",
            )
        return None

    def state_function(self, operator: str) -> str | None:
        """What ``/v1/state`` runs for ``operator``: the gateway's ``--state-function`` override, else
        the function the deployed graph declares (or the only read-only one without arguments)."""
        return self.config.state_functions.get(operator) or self.info.state_functions.get(operator)

    def summary(self) -> ClusterSummary:
        info = self.info
        return ClusterSummary(
            state=info.state,
            ready=self.readiness().ready,
            graph=info.graph,
            operators=[
                OperatorInfo(
                    name=name,
                    partitions=partitions,
                    functions=sorted(info.functions.get(name, ())),
                    state_function=self.state_function(name),
                )
                for name, partitions in sorted(info.operators.items())
            ],
        )
