"""Request bodies parsed as strict JSON (RFC 8259): what FastAPI's parser lets through that is not JSON.

FastAPI parses bodies with :func:`json.loads`, which accepts ``NaN``, ``Infinity`` and ``-Infinity``
as numbers and raises RecursionError (or ValueError for an integer of more than 4 300 digits) on
input it cannot handle. :class:`StrictJsonRoute` makes every route parse with :func:`strict_json`
instead, which raises :class:`json.JSONDecodeError` for all of them, with a message saying why:
FastAPI turns that into the gateway's 400 ``malformed_json``.
"""

import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from styx_py.core.limits import MAX_ARG_DEPTH

__all__ = ["StrictJsonRoute", "strict_json"]

# A JSON string, or one of the constants json.loads accepts as numbers (only the latter is captured).
_CONSTANT = re.compile(r'"(?:[^"\\]|\\.)*"|(-?Infinity|NaN)')


class _NotANumber(Exception):
    pass


def _not_a_number(constant: str) -> Any:
    raise _NotANumber(constant)


def strict_json(body: bytes) -> Any:
    """``body`` as JSON; :class:`json.JSONDecodeError` for anything RFC 8259 does not call JSON, and for
    nesting too deep to parse (the arguments may nest only ``MAX_ARG_DEPTH`` levels anyway)."""
    try:
        return json.loads(body, parse_constant=_not_a_number)
    except json.JSONDecodeError:
        raise
    except _NotANumber as exc:
        text = body.decode("utf-8", "replace")
        pos = next((m.start(1) for m in _CONSTANT.finditer(text) if m[1]), 0)
        raise json.JSONDecodeError(f"{exc.args[0]} is not a JSON number", text, pos) from None
    except RecursionError:
        message = f"nested too deep to parse (arguments may nest {MAX_ARG_DEPTH} levels)"
        raise json.JSONDecodeError(message, "", 0) from None
    except ValueError as exc:  # e.g. an integer of more than 4 300 digits
        raise json.JSONDecodeError(str(exc), "", 0) from None


class _StrictJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = strict_json(await self.body())
        return self._json


class StrictJsonRoute(APIRoute):
    """A route whose JSON body is parsed by :func:`strict_json`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(_StrictJsonRequest(request.scope, request.receive))

        return strict
