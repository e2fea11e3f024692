"""The autoscaler's exception hierarchy: API failures (mapped once), scale targets, metrics."""

from __future__ import annotations


class AutoscalerError(Exception):
    """Base of every error the autoscaler raises on purpose; `str(err)` is safe to show."""


# --- Kubernetes API failures (mapped once, in autoscaler.kube.operations) ---


class KubeError(AutoscalerError):
    """A request to the Kubernetes API server failed.

    `str(err)` is what client-go's `StatusError.Error()` would print: the `Status` message when the
    server sent one, otherwise client-go's generic text for the code. `status` is the HTTP code
    (0 when no response arrived), `reason` the `Status.reason` (or client-go's reason for the code).
    """

    def __init__(self, message: str, *, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason


class BadRequest(KubeError):
    """400: the request itself is wrong (for example a selector the server cannot parse)."""


class Unauthorized(KubeError):
    """401: the credentials are missing or were rejected."""


class Forbidden(KubeError):
    """403: RBAC does not allow this request."""


class NotFound(KubeError):
    """404: the object, or the route, does not exist."""


class TargetNotFound(NotFound):
    """404 on a scale subresource: the scale target named by scaleTargetRef does not exist."""


class MethodNotAllowed(KubeError):
    """405: the resource does not support this verb."""


class Conflict(KubeError):
    """409: the resourceVersion we sent is stale (or, on create, see AlreadyExists)."""


class AlreadyExists(Conflict):
    """409 on create: an object with that name exists already."""


class Gone(KubeError):
    """410: the resourceVersion is too old (watch history compacted)."""


class Invalid(KubeError):
    """422: the server's validation rejected the object we sent."""


class TooManyRequests(KubeError):
    """429: API priority and fairness (or a proxy) asked us to slow down."""

    def __init__(
        self, message: str, *, status: int = 429, reason: str = "", retry_after: float | None = None
    ) -> None:
        super().__init__(message, status=status, reason=reason)
        self.retry_after = retry_after


class ServerError(KubeError):
    """5xx: the server (or an aggregated API behind it) failed; worth retrying."""

    def __init__(
        self, message: str, *, status: int = 500, reason: str = "", retry_after: float | None = None
    ) -> None:
        super().__init__(message, status=status, reason=reason)
        self.retry_after = retry_after


class ConnectionFailed(KubeError):
    """No HTTP response: connection refused or reset, TLS failure, or a client-side timeout."""


class UnexpectedResponse(KubeError):
    """A 2xx response whose body is not the object we asked for."""


# --- Scale target resolution (discovery, the RESTMapper's job upstream) ---


class ScaleTargetError(AutoscalerError):
    """scaleTargetRef cannot be turned into a scale subresource."""


class InvalidTargetReference(ScaleTargetError):
    """scaleTargetRef.apiVersion does not parse (upstream: schema.ParseGroupVersion)."""


class KindNotFound(ScaleTargetError):
    """Discovery knows no resource of that kind in that group (upstream: NoKindMatchError)."""


class NoScaleSubresource(ScaleTargetError):
    """The resource exists but serves no `scale` subresource."""


# --- Metrics APIs ---


class MetricsError(AutoscalerError):
    """A metrics API request failed; `str(err)` is upstream's text, ready for events and conditions.

    `api` is "resource", "custom" or "external"; `cause` is the underlying API error, if any.
    """

    def __init__(self, message: str, *, api: str, cause: Exception | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.api = api
        self.cause = cause


# --- Leader election ---


class NotLeader(AutoscalerError):
    """This replica does not hold the leader lease (or its renew deadline passed): no writes."""
