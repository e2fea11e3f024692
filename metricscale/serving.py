"""The aiohttp runner both programs serve with: errors raised before routing answer a Status.

aiohttp answers what its HTTP parser rejects (a request line over 8,190 bytes, too many or too
long headers, a bad `Content-Length`, `CONNECT`…) from `RequestHandler.handle_error` with a
plain-text 400 that repeats up to ~100 bytes of the request. Here the same statuses come back
as a Kubernetes `Status` naming only the status, so no request bytes are echoed. aiohttp
offers no hook for this, hence the two small subclasses; `handle_error` is still called by
aiohttp for its logging and its "response already started" check.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

__all__ = ["StatusAppRunner", "parse_error_body"]

# metav1.StatusReason for the statuses aiohttp answers itself.
_REASONS = {400: "BadRequest", 413: "RequestEntityTooLarge", 431: "BadRequest",
            500: "InternalError", 504: "Timeout"}


def parse_error_body(status: int) -> dict[str, Any]:
    """The `metav1.Status` for a status aiohttp answers itself: the status, nothing of the
    request."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    reason = _REASONS.get(status, "BadRequest" if 400 <= status < 500 else "InternalError")
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": f"{status} {phrase}", "reason": reason, "code": status}


def _error_response(status: int) -> web.Response:
    response = web.Response(status=status, body=json.dumps(parse_error_body(status)).encode(),
                            content_type="application/json")
    response.force_close()
    return response


class _StatusRequestHandler(RequestHandler):
    def handle_error(self, request: BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs; raises if already sent
        return _error_response(status)


class _StatusServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _StatusRequestHandler(self, loop=self._loop, **self._kwargs)


class StatusAppRunner(web.AppRunner):
    """`web.AppRunner` whose connections answer aiohttp's own errors with a `Status`."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        return _StatusServer(server.request_handler, request_factory=server.request_factory,
                             handler_cancellation=server.handler_cancellation,
                             loop=server._loop, **server._kwargs)
