"""The API's own documentation: the OpenAPI description, and Swagger UI and Redoc served offline.

``/docs`` (Swagger UI) and ``/redoc`` (Redoc) load their scripts and styles from the gateway itself
(``/docs-assets/``: the files the ``fastapi-offline`` package ships), never from a CDN, so they work on
a machine without internet access and leak no visit to a third party.
"""

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

from styx_py.client.gateway.codes import error_table

__all__ = ["API_DESCRIPTION", "ASSETS_PATH", "add_doc_routes"]

ASSETS_PATH = "/docs-assets"
_ASSETS_DIR = Path(fastapi_offline.__file__).parent / "static"

API_DESCRIPTION = f"""
Run serializable transactions on a styx-py cluster over HTTP. A call names an
**operator** (a partitioned set of entities), an entity **key**, a **function** of the operator and its
**arguments**; the function runs as one transaction that may call functions of other entities, and
either commits everything it did or nothing.

```
curl --json '{{"operator":"account","key":"alice","function":"deposit","args":[50]}}' \\
     -H 'Idempotency-Key: pay-42' http://127.0.0.1:8080/v1/invocations
```

**Replies.** `POST /v1/invocations` waits for the reply (`timeout_s`) and answers 200 (committed), 409
(the function raised `Abort`) or 422 (it failed). With `?wait=false` it answers 202 at once with a
`Location`; `GET` it (`?wait_s=` long-polls). Any gateway replica answers for any request id: a reply is
looked up in the cluster when this replica does not have it. The body of a reply depends on the
cluster's reply alone, so every replica and every retry returns the same bytes; this gateway's submit →
reply time is in the `Server-Timing` header.

**Idempotency.** Send an `Idempotency-Key` header (or a body `request_id`): it is the request id the
cluster sees, and a request id runs at most once in the cluster. A retry with the same key, on any
replica, gets the identical answer; a retry while the first is running waits for it. Reusing a key for
a different request is 422 `idempotency_key_reused` (detected by the replica that ran it; the cluster
itself answers a resent id with its first reply). Replies are remembered per partition (the latest
ones) and by each replica for `idempotency_ttl_s`.

**Bodies** are JSON: send `Content-Type: application/json` (`curl --json`) or no content type; another
declared type is 415. Strict JSON: no `NaN`/`Infinity`.

**Errors** have one shape, `{{"error": {{"status", "code", "message", "request_id", "reply", "errors"}}}}`;
programs switch on `code`:

{error_table()}

**State.** `GET /v1/state/{{operator}}/{{key}}` runs the operator's state function (declared in the
app with `@op.function(state=True)`, or its only read-only function without arguments) as a
read-only transaction: the value is serializable with every other transaction.
""".strip()


def add_doc_routes(app: FastAPI) -> None:
    """``/docs``, ``/redoc`` and their assets (create ``app`` with ``docs_url=None, redoc_url=None``)."""
    app.mount(ASSETS_PATH, StaticFiles(directory=_ASSETS_DIR), name="docs-assets")
    title, openapi_url = app.title, app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{title}: Swagger UI",
            swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_PATH}/favicon.png",
            # No validator badge: it would send the document to an online validator.
            swagger_ui_parameters={"validatorUrl": None, "displayOperationId": True},
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{title}: Redoc",
            redoc_js_url=f"{ASSETS_PATH}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS_PATH}/favicon.png",
            with_google_fonts=False,
        )
