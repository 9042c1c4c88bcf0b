"""The web console: static pages served by the gateway, and the one data route only they need.

``/console`` is one HTML page with its script and style under ``/console-assets/`` (files shipped in
this package: no CDN, no other host, works offline). The page holds no data, so it is served without
the token; everything it shows comes from the ``/v1`` API with the token the user gives it (see
``console/console.js``): ``GET /v1/cluster`` (below) for the cluster view, ``GET /v1/invocations`` and
``/v1/invocations/{id}/view`` for invocations, ``GET /v1/state/{operator}/{key}`` for entities.

``GET /v1/cluster`` is the coordinator status the gateway last polled, as it answered it, with the
gateway's summary and the recent history of :mod:`.history` (rates and epoch latency over the last
minutes).
"""

# No ``from __future__ import annotations``: FastAPI reads the route signatures at run time.
from pathlib import Path
from typing import Annotated, Any, Protocol

from fastapi import Depends, FastAPI
from fastapi.security import HTTPBearer
from pydantic import BaseModel, Field
from starlette.responses import FileResponse, Response
from starlette.staticfiles import StaticFiles

from styx_client.gateway.cluster import ClusterLink
from styx_client.gateway.history import ClusterHistory
from styx_client.gateway.jobs import Jobs
from styx_client.gateway.metrics import GatewayMetrics
from styx_client.gateway.models import ClusterSummary, ErrorBody
from styx_client.gateway.outcomes import ok, respond
from styx_client.gateway.recent import RecentInvocations

__all__ = ["CONSOLE_ASSETS", "CONSOLE_DIR", "CONSOLE_PATH", "ClusterView", "add_console_routes"]

CONSOLE_PATH = "/console"
CONSOLE_ASSETS = "/console-assets"
CONSOLE_DIR = Path(__file__).parent / "console"


class GatewayCounts(BaseModel):
    pending: int = Field(description="invocations this gateway is waiting on")
    recent: int = Field(description="invocations in its recent window now")
    window: int = Field(description="the window's size (max_recent_invocations)")


class ClusterView(BaseModel):
    summary: ClusterSummary
    status: dict[str, Any] = Field(
        description="the coordinator's status body, as last polled (the keys `styx status` shows)"
    )
    history: list[dict[str, Any]] = Field(
        description="samples, oldest first: t, epoch, epochs_per_s, committed_per_s, aborted_per_s, "
        "epoch_ms (mean epoch latency), workers, state"
    )
    gateway: GatewayCounts


class Consoled(Protocol):
    metrics: GatewayMetrics
    link: ClusterLink
    jobs: Jobs
    recent: RecentInvocations
    history: ClusterHistory


def add_console_routes(app: FastAPI, gateway: Consoled, bearer: HTTPBearer) -> None:
    link, metrics = gateway.link, gateway.metrics
    app.mount(CONSOLE_ASSETS, StaticFiles(directory=CONSOLE_DIR), name="console-assets")

    @app.get(CONSOLE_PATH, include_in_schema=False)
    async def console() -> FileResponse:
        return FileResponse(CONSOLE_DIR / "index.html", media_type="text/html")

    @app.get(
        "/v1/cluster",
        response_model=ClusterView,
        responses={s: {"model": ErrorBody} for s in (401, 429)},
        summary="The cluster's status and its recent history (what the console shows)",
        operation_id="getCluster",
        tags=["admin"],
    )
    async def get_cluster(_auth: Annotated[Any, Depends(bearer)] = None) -> Response:
        view = ClusterView(
            summary=link.summary(),
            status=dict(link.status),
            history=gateway.history.as_list(),
            gateway=GatewayCounts(
                pending=len(gateway.jobs), recent=len(gateway.recent), window=gateway.recent.max_entries
            ),
        )
        return respond(ok(view), metrics)
