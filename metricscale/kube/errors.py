"""The one Kubernetes error hierarchy and the one status mapper, shared by both programs.

Every failed answer of the API server (an HTTP status, a watch `ERROR` event) and every request
that got no answer becomes one of these classes here, once. `str(err)` is what client-go's
`StatusError.Error()` would print: the `Status` message when the server sent one, otherwise
client-go's generic text for the code. Messages name resources and paths, never credentials.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from metricscale.core.errors import ConfigError

__all__ = [
    "MAX_RETRY_AFTER_SECONDS",
    "AlreadyExists",
    "BadRequest",
    "Conflict",
    "ConnectionFailed",
    "ErrorContext",
    "Forbidden",
    "Gone",
    "Invalid",
    "InvalidGroupVersion",
    "KindNotFound",
    "KubeConfigError",
    "KubeError",
    "KubeUnavailable",
    "MethodNotAllowed",
    "NoScaleSubresource",
    "NotFound",
    "ResourceMappingError",
    "ServerError",
    "TooManyRequests",
    "Unauthorized",
    "UnexpectedResponse",
    "UnknownResource",
    "error_from_response",
    "error_from_status",
    "parse_retry_after",
    "typed_error",
]

# A Retry-After beyond this is read as this: a confused proxy must not park a client for hours.
MAX_RETRY_AFTER_SECONDS = 300.0
# client-go caps the text of a non-Status error body it quotes.
_MAX_UNSTRUCTURED_BODY = 2048


class KubeError(Exception):
    """A request to the Kubernetes API server failed; `str(err)` is safe to show.

    `status` is the HTTP code (0 when no response arrived), `reason` the `Status.reason` (or
    client-go's reason for the code), `retry_after` the seconds the server asked us to wait
    (header or `Status.details.retryAfterSeconds`), if it did.
    """

    def __init__(self, message: str, *, status: int = 0, reason: str = "",
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason
        self.retry_after = retry_after

    def describe(self) -> str:
        """`<code> <reason>: <message>` for logs and diagnostics (`str()` is the message)."""
        head = " ".join(part for part in (str(self.status or ""), self.reason) if part)
        return f"{head}: {self.message}" if head else self.message


class KubeConfigError(KubeError, ConfigError):
    """No usable connection settings: a bad kubeconfig, or not running in a cluster."""

    heading = ""


class BadRequest(KubeError):
    """400: the request itself is wrong (for example a selector the server cannot parse)."""


class Unauthorized(KubeError):
    """401: the credentials are missing or were rejected."""


class Forbidden(KubeError):
    """403: RBAC does not allow this request."""


class NotFound(KubeError):
    """404: the object, or the route, does not exist."""


class MethodNotAllowed(KubeError):
    """405: the resource does not support this verb."""


class Conflict(KubeError):
    """409: the resourceVersion we sent is stale (or, on create, see AlreadyExists)."""


class AlreadyExists(Conflict):
    """409 on create: an object with that name exists already."""


class Gone(KubeError):
    """410: the resourceVersion (or continue token) is older than the server's history."""


class Invalid(KubeError):
    """422: the server's validation rejected the object we sent."""


class KubeUnavailable(KubeError):
    """The Kubernetes API cannot answer now; the same request may succeed later."""


class TooManyRequests(KubeUnavailable):
    """429: API priority and fairness (or a proxy) asked us to slow down."""


class ServerError(KubeUnavailable):
    """5xx: the server (or an aggregated API behind it) failed."""


class ConnectionFailed(KubeUnavailable):
    """No HTTP response: connection refused or reset, TLS failure, or a client-side timeout."""


class UnexpectedResponse(KubeError):
    """A 2xx response whose body is not what the Kubernetes API sends for that request."""


# --- What discovery (a RESTMapper) cannot map ----------------------------------------------------


class ResourceMappingError(KubeError):
    """Discovery cannot turn a group, kind or resource into something the cluster serves."""


class InvalidGroupVersion(ResourceMappingError):
    """An apiVersion that does not parse (upstream: schema.ParseGroupVersion)."""


class KindNotFound(ResourceMappingError):
    """Discovery knows no resource of that kind in that group (upstream: NoKindMatchError)."""


class NoScaleSubresource(ResourceMappingError):
    """The resource exists but serves no `scale` subresource."""


class UnknownResource(ResourceMappingError):
    """The cluster serves no such resource, also after a refresh of discovery."""


# --- Mapping answers to the hierarchy ------------------------------------------------------------


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header: the API server only sends delta-seconds.

    Anything else (a date, a word, a negative number, NaN, infinity) is no Retry-After at all,
    and a value beyond MAX_RETRY_AFTER_SECONDS is read as that.
    """
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return min(seconds, MAX_RETRY_AFTER_SECONDS)


@dataclass(frozen=True)
class ErrorContext:
    """What client-go appends to a generic error: `(get pods.custom.metrics.k8s.io *)`."""

    group: str = ""
    resource: str = ""
    name: str = ""

    def suffix(self, verb: str) -> str:
        if not self.resource:
            return ""
        qualified = f"{self.resource}.{self.group}" if self.group else self.resource
        if self.name:
            return f" ({verb.lower()} {qualified} {self.name})"
        return f" ({verb.lower()} {qualified})"


def _mapping(value: object) -> Mapping[str, Any]:
    return cast(Mapping[str, Any], value) if isinstance(value, Mapping) else {}


def _generic_message(status: int, server_message: str) -> tuple[str, str]:
    """client-go's NewGenericServerResponse: (reason, message) for a body that is not a Status."""
    table = {
        400: ("BadRequest", "the server rejected our request for an unknown reason"),
        401: ("Unauthorized", "the server has asked for the client to provide credentials"),
        403: ("Forbidden", server_message),
        404: ("NotFound", "the server could not find the requested resource"),
        405: ("MethodNotAllowed",
              "the server does not allow this method on the requested resource"),
        409: ("Conflict", "the server reported a conflict"),
        422: ("Invalid", "the server rejected our request due to an error in our request"),
        429: ("TooManyRequests",
              "the server has received too many requests and has asked us to try again later"),
        503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
        504: ("Timeout", "the server was unable to return a response in the time allotted, "
                         "but may still be processing the request"),
    }
    if status in table:
        return table[status]
    if status >= 500:
        return ("InternalError",
                f"an error on the server ({json.dumps(server_message)}) has prevented the request "
                "from succeeding")
    return ("", f"the server responded with the status code {status} but did not return more "
                "information")


def _status_retry_after(status: Mapping[str, Any]) -> float | None:
    seconds = _mapping(status.get("details")).get("retryAfterSeconds")
    if isinstance(seconds, int) and not isinstance(seconds, bool) and seconds > 0:
        return min(float(seconds), MAX_RETRY_AFTER_SECONDS)
    return None


def error_from_response(
    status: int, *, headers: Mapping[str, str], body: str | bytes | None, verb: str,
    context: ErrorContext | None = None,
) -> KubeError:
    """One failed response as the typed hierarchy, keeping the server's Status message."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    text = body if isinstance(body, str) else ""
    retry_after = parse_retry_after(headers.get("Retry-After"))
    parsed: object = None
    if text:
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
    reason = ""
    message = ""
    if isinstance(parsed, Mapping) and parsed.get("kind") == "Status":
        reason = str(parsed.get("reason") or "")
        message = str(parsed.get("message") or "")
        code = parsed.get("code")
        if isinstance(code, int) and not isinstance(code, bool) and code:
            status = code
        if retry_after is None:
            retry_after = _status_retry_after(parsed)
    if not message:
        content_type = headers.get("Content-Type", "")
        server_message = "unknown"
        if text and content_type.startswith("text/"):
            server_message = text[:_MAX_UNSTRUCTURED_BODY].strip()
        generic_reason, message = _generic_message(status, server_message)
        reason = reason or generic_reason
        if status == 409 and verb.upper() == "POST":
            reason = "AlreadyExists"
        message += (context or ErrorContext()).suffix(verb)
    return typed_error(status, reason=reason, message=message, retry_after=retry_after)


def error_from_status(status: object, *, http_status: int | None = None) -> KubeError:
    """A `Status` object that arrived in a watch stream (an `ERROR` event, or a bare line)."""
    obj = _mapping(status)
    code = obj.get("code")
    if not isinstance(code, int) or isinstance(code, bool) or not code:
        code = http_status or 500
    reason = str(obj.get("reason") or "")
    message = str(obj.get("message") or "")
    if not message:
        generic_reason, message = _generic_message(code, "unknown")
        reason = reason or generic_reason
    return typed_error(code, reason=reason, message=message,
                       retry_after=_status_retry_after(obj))


def typed_error(status: int, *, reason: str, message: str,
                retry_after: float | None = None) -> KubeError:
    """The class for a status code (and, for 409, the reason)."""
    if status == 429:
        return TooManyRequests(message, status=status, reason=reason, retry_after=retry_after)
    if status >= 500:
        return ServerError(message, status=status, reason=reason, retry_after=retry_after)
    if status == 409 and reason == "AlreadyExists":
        return AlreadyExists(message, status=status, reason=reason, retry_after=retry_after)
    by_status: dict[int, type[KubeError]] = {
        400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound,
        405: MethodNotAllowed, 409: Conflict, 410: Gone, 422: Invalid,
    }
    return by_status.get(status, KubeError)(message, status=status, reason=reason,
                                            retry_after=retry_after)
