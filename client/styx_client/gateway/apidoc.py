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

__all__ = ["API_DESCRIPTION", "ASSETS_PATH", "add_doc_routes"]

ASSETS_PATH = "/docs-assets"
_ASSETS_DIR = Path(fastapi_offline.__file__).parent / "static"

API_DESCRIPTION = """
A call names an **operator** (a partitioned set of entities), an entity **key**, one of the
operator's **functions** and its **arguments**. The function runs as one serializable transaction,
which may call functions of other entities, and commits all it did or nothing.

```
curl --json '{"operator":"account","key":"alice","function":"deposit","args":[50]}' \\
     -H 'Idempotency-Key: pay-42' http://127.0.0.1:8080/v1/invocations
```

- **Replies**: 200 committed, 409 the function raised `Abort`, 422 it failed. `?wait=false` answers
  202 with a `Location` to `GET` (`?wait_s=` long-polls). Any gateway replica answers for any request
  id, and every replica and retry returns the same bytes (this gateway's timing is in
  `Server-Timing`).
- **Idempotency**: the `Idempotency-Key` (or body `request_id`) is the request id the cluster sees;
  it runs at most once, and a retry on any replica gets the first answer.
- **Bodies** are strict JSON, sent as `Content-Type: application/json` (`curl --json`) or without a
  content type; another declared type is 415.
- **Errors** are `{"error": {"status", "code", "message", "request_id", "reply", "errors"}}`; switch
  on `code` (every code, its status and meaning: the `ErrorDetail` schema).
- **State**: `GET /v1/state/{operator}/{key}` runs the operator's state function as a read-only
  transaction.
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
