"""HTTP gateway: submit transactions to a styx-py cluster over HTTP (FastAPI on uvicorn).

The HTTP API (routes, status codes and error codes, idempotency, memory bounds) is documented in
``app.py`` and served at ``/openapi.json`` and ``/docs``. The modules, in the order a request meets
them:

=================  ==================================================================================
``server.py``      :class:`Gateway` (wires the parts, serves them with uvicorn, owns the task group)
``guard.py``       ASGI guard: in-flight bound, bearer token, pending bound, body size, metrics
``app.py``         the FastAPI app: routes, validation, error handlers
``strict_json.py`` bodies parsed as strict JSON (no ``NaN``/``Infinity``; nesting too deep is an error)
``invocations.py`` what the routes do: cached reply | join the pending job | start a job
``replies.py``     the idempotency table (final replies by request id)
``jobs.py``        pending jobs, each a task submitting through the SDK client
``cluster.py``     the coordinator's status, polled; the SDK client; readiness and availability
``outcomes.py``    HTTP answers: error bodies and the mapping of cluster replies to statuses
``models.py``      pydantic models (the OpenAPI schema) stating the core's limits on names, ids and keys
``config.py``      :class:`GatewayConfig` and its parts: :class:`GatewayLimits`, :class:`GatewayTiming`
``metrics.py``     Prometheus metrics (``GET /metrics``)
``recent.py``      the window of recent invocations; ``listing.py`` its routes (``GET /v1/invocations``)
``console.py``     the web console (``/console``, files in ``console/``) and ``GET /v1/cluster``
``history.py``     the cluster's recent rates and epoch latency, from the status polls
=================  ==================================================================================
"""

from styx_client.gateway.app import build_app
from styx_client.gateway.cluster import (
    Backend,
    BackendFactory,
    ClusterInfo,
    StatusSource,
    connect_client,
    coordinator_status,
)
from styx_client.gateway.config import GatewayConfig, GatewayLimits, GatewayTiming
from styx_client.gateway.jobs import GatewayStats
from styx_client.gateway.outcomes import Outcome, reply_outcome
from styx_client.gateway.replies import ReplyCache
from styx_client.gateway.server import Gateway, bind_socket, build_gateway, serve_gateway
from styx_py.core.errors import Unavailable

__all__ = [
    "Backend",
    "BackendFactory",
    "ClusterInfo",
    "Gateway",
    "GatewayConfig",
    "GatewayLimits",
    "GatewayStats",
    "GatewayTiming",
    "Outcome",
    "ReplyCache",
    "StatusSource",
    "Unavailable",
    "bind_socket",
    "build_app",
    "build_gateway",
    "connect_client",
    "coordinator_status",
    "reply_outcome",
    "serve_gateway",
]
