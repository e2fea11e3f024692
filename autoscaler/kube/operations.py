"""The autoscaler's only Kubernetes I/O: discovery, scale, status, events, leases, raw metric GETs.

Every request goes through `KubeHTTP.request` (an aiohttp session of our own, built from the
kubernetes_asyncio Configuration) with raw JSON dicts in and out: one request path, so failures
are mapped to `autoscaler.errors` in exactly one place, every request is timed in one histogram,
and no generated model meets a half-filled object (client-side validation) or a MicroTime (the
models drop the fraction when it is zero, which the API server rejects). kubernetes_asyncio
itself is used for loading the configuration and, through `open_watch_client`, by the informers.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import random
import ssl
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol, cast
from urllib.parse import urlencode

import aiohttp
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Histogram
from yarl import URL

from autoscaler.controller.leader import Lease, LeaseSpec
from autoscaler.errors import (
    AlreadyExists,
    BadRequest,
    Conflict,
    ConnectionFailed,
    Forbidden,
    Gone,
    Invalid,
    InvalidTargetReference,
    KindNotFound,
    KubeError,
    MethodNotAllowed,
    NoScaleSubresource,
    NotFound,
    ServerError,
    TargetNotFound,
    TooManyRequests,
    Unauthorized,
    UnexpectedResponse,
)
from metricscale import __version__
from metricscale.core.proxies import proxy_for

logger = logging.getLogger(__name__)

__all__ = [
    "AUTOSCALER_GROUP",
    "AUTOSCALER_PLURAL",
    "AUTOSCALER_VERSION",
    "REPORTING_CONTROLLER",
    "Configuration",
    "ErrorContext",
    "EventType",
    "KubeAPI",
    "KubeClient",
    "KubeHTTP",
    "KubeWrites",
    "ObjectReference",
    "ResourceMapping",
    "Response",
    "RetryPolicy",
    "Scale",
    "ScaleTargetRef",
    "error_from_api_exception",
    "error_from_response",
    "event_name",
    "format_micro_time",
    "load_configuration",
    "merge_patch",
    "open_kube_client",
    "open_kube_http",
    "open_watch_client",
    "parse_group_version",
    "parse_lease",
    "parse_micro_time",
    "render_event",
    "render_lease_spec",
]

AUTOSCALER_GROUP = "metricscale.dev"
AUTOSCALER_VERSION = "v1alpha1"
AUTOSCALER_PLURAL = "autoscalers"
REPORTING_CONTROLLER = "metricscale.dev/autoscaler"

# events.k8s.io/v1 validation: note at most 1 KiB (bytes of the Go string).
_NOTE_LIMIT_BYTES = 1024
# client-go caps the text of a non-Status error body it quotes.
_MAX_UNSTRUCTURED_BODY = 2048
# retry.DefaultRetry: Steps 5, Duration 10ms, Factor 1.0, Jitter 0.1.
_CONFLICT_RETRY_STEPS = 5
_CONFLICT_RETRY_DELAY = 0.010
_CONFLICT_RETRY_JITTER = 0.1
_MERGE_PATCH = "application/merge-patch+json"
_JSON = "application/json"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

EventType = Literal["Normal", "Warning"]


# --- Time --------------------------------------------------------------------------------------


def format_micro_time(moment: datetime) -> str:
    """A MicroTime string: RFC 3339 in UTC with exactly six fractional digits."""
    if moment.tzinfo is None:
        raise ValueError("MicroTime needs an aware datetime")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_micro_time(text: str) -> datetime:
    """Parse an RFC 3339 time (any fraction, Z or offset) into an aware UTC datetime."""
    parsed = datetime.fromisoformat(text.strip())
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def _optional_time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_micro_time(value)
    except ValueError:
        return None


# --- Values ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScaleTargetRef:
    """spec.scaleTargetRef: apiVersion, kind and name of the object to scale."""

    api_version: str
    kind: str
    name: str

    @classmethod
    def from_spec(cls, ref: Mapping[str, Any]) -> ScaleTargetRef:
        return cls(api_version=str(ref.get("apiVersion") or ""), kind=str(ref.get("kind") or ""),
                   name=str(ref.get("name") or ""))


@dataclass(frozen=True)
class ResourceMapping:
    """What a RESTMapper answers for a kind: the resource, its version and its scope."""

    group: str
    version: str
    resource: str
    kind: str
    namespaced: bool
    has_scale: bool = False

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> str:
        """`deployments.apps`, or `pods` in the core group (schema.GroupResource.String())."""
        return f"{self.resource}.{self.group}" if self.group else self.resource

    @property
    def gvr_string(self) -> str:
        """schema.GroupVersionResource.String(), as upstream quotes it in errors."""
        return f"{self.group}/{self.version}, Resource={self.resource}"

    def path(self, *, namespace: str | None, name: str | None = None,
             subresource: str | None = None) -> str:
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        parts = [prefix]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{namespace}")
        parts.append(self.resource)
        if name is not None:
            parts.append(name)
        if subresource is not None:
            parts.append(subresource)
        return "/".join(parts)


@dataclass(frozen=True)
class Scale:
    """An autoscaling/v1 Scale as read: replicas, the selector string, and its resourceVersion."""

    spec_replicas: int
    status_replicas: int
    selector: str
    resource_version: str
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Scale:
        spec = _mapping(obj.get("spec"))
        status = _mapping(obj.get("status"))
        metadata = _mapping(obj.get("metadata"))
        return cls(
            spec_replicas=_int(spec.get("replicas")),  # omitempty: absent means 0
            status_replicas=_int(status.get("replicas")),
            selector=str(status.get("selector") or ""),
            resource_version=str(metadata.get("resourceVersion") or ""),
            raw=obj,
        )


@dataclass(frozen=True)
class ObjectReference:
    """The object an Event is about (events.k8s.io/v1 `regarding`)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""
    resource_version: str = ""

    @classmethod
    def from_object(
        cls,
        obj: Mapping[str, Any],
        *,
        api_version: str = f"{AUTOSCALER_GROUP}/{AUTOSCALER_VERSION}",
        kind: str = "Autoscaler",
    ) -> ObjectReference:
        """A reference to an object as read from the API. List items of built-in kinds carry
        no apiVersion/kind, so pass them (e.g. "autoscaling/v2", "HorizontalPodAutoscaler")."""
        metadata = _mapping(obj.get("metadata"))
        return cls(
            api_version=str(obj.get("apiVersion") or api_version),
            kind=str(obj.get("kind") or kind),
            namespace=str(metadata.get("namespace") or ""),
            name=str(metadata.get("name") or ""),
            uid=str(metadata.get("uid") or ""),
            resource_version=str(metadata.get("resourceVersion") or ""),
        )

    def render(self) -> dict[str, str]:
        rendered = {"apiVersion": self.api_version, "kind": self.kind,
                    "namespace": self.namespace, "name": self.name}
        if self.uid:
            rendered["uid"] = self.uid
        if self.resource_version:
            rendered["resourceVersion"] = self.resource_version
        return rendered


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


def _int(value: object) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value
    return 0


# --- Errors: ApiException -> autoscaler.errors, once ----------------------------------------


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


def _retry_after_header(headers: Mapping[str, str]) -> float | None:
    value = headers.get("Retry-After")
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def error_from_response(
    status: int, *, headers: Mapping[str, str], body: str | bytes | None, verb: str,
    context: ErrorContext | None = None,
) -> KubeError:
    """Map one failed response to the typed hierarchy, keeping the server's Status message."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    text = body if isinstance(body, str) else ""
    retry_after = _retry_after_header(headers)
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
        details = _mapping(parsed.get("details"))
        seconds = details.get("retryAfterSeconds")
        if retry_after is None and isinstance(seconds, int) and seconds > 0:
            retry_after = float(seconds)
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
    return _typed_error(status, reason=reason, message=message, retry_after=retry_after)


def error_from_api_exception(
    exc: ApiException, *, verb: str, context: ErrorContext | None = None
) -> KubeError:
    """Map an ApiException (kubernetes_asyncio's, e.g. from a watch) like a failed response."""
    raw_headers = exc.headers
    return error_from_response(
        exc.status if isinstance(exc.status, int) else 0,
        headers=raw_headers if isinstance(raw_headers, Mapping) else {},
        body=exc.body if isinstance(exc.body, str | bytes) else None, verb=verb, context=context)


def _typed_error(status: int, *, reason: str, message: str,
                 retry_after: float | None) -> KubeError:
    if status == 429:
        return TooManyRequests(message, reason=reason, retry_after=retry_after)
    if status >= 500:
        return ServerError(message, status=status, reason=reason, retry_after=retry_after)
    if status == 409:
        if reason == "AlreadyExists":
            return AlreadyExists(message, status=status, reason=reason)
        return Conflict(message, status=status, reason=reason)
    by_status: dict[int, type[KubeError]] = {
        400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound,
        405: MethodNotAllowed, 410: Gone, 422: Invalid,
    }
    return by_status.get(status, KubeError)(message, status=status, reason=reason)


@dataclass(frozen=True)
class RetryPolicy:
    """Retries for 429, 5xx and connection errors: capped exponential backoff, equal jitter.

    A Retry-After (header or Status `retryAfterSeconds`) is waited exactly; one longer than
    `max_retry_after` is not waited at all: the error goes to the caller, who requeues.
    """

    attempts: int = 3
    initial: float = 0.1
    factor: float = 2.0
    cap: float = 2.0
    max_retry_after: float = 10.0

    def delay(self, error: KubeError, *, failures: int, jitter: float) -> float | None:
        """Seconds to wait before the next try after `failures` (>= 1) failures, or None."""
        if failures >= self.attempts:
            return None
        if not isinstance(error, TooManyRequests | ServerError | ConnectionFailed):
            return None
        retry_after = getattr(error, "retry_after", None)
        if isinstance(retry_after, float | int):
            if retry_after > self.max_retry_after:
                return None
            return float(retry_after)
        step = min(self.cap, self.initial * self.factor ** (failures - 1))
        return step / 2 + step / 2 * jitter


_NO_RETRY = RetryPolicy(attempts=1)


# --- Pure renderers ------------------------------------------------------------------------------


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns `old` into `new`: removed keys become null."""
    patch: dict[str, Any] = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if key in old and before == value:
            continue
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            patch[key] = merge_patch(before, value)
        else:
            patch[key] = copy.deepcopy(value)
    return patch


def _truncate_utf8(text: str, limit: int) -> str:
    encoded = text.encode("utf-8")
    if len(encoded) <= limit:
        return text
    return encoded[:limit].decode("utf-8", "ignore")


def _unix_nanos(moment: datetime) -> int:
    return ((moment - _EPOCH) // timedelta(microseconds=1)) * 1000


def render_event(
    *,
    regarding: ObjectReference,
    event_type: EventType,
    reason: str,
    note: str,
    action: str,
    now: datetime,
    reporting_instance: str,
    name: str | None = None,
) -> dict[str, Any]:
    """An events.k8s.io/v1 Event, named like client-go's events library names them
    (`<object>.<unix nanoseconds in hex>`) unless `name` is given."""
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": name or event_name(regarding.name, _unix_nanos(now)),
                     "namespace": regarding.namespace},
        "eventTime": format_micro_time(now),
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": reporting_instance,
        "action": action,
        "reason": reason,
        "type": event_type,
        "note": _truncate_utf8(note, _NOTE_LIMIT_BYTES),
        "regarding": regarding.render(),
    }


def event_name(object_name: str, unix_nanos: int) -> str:
    """client-go's Event name: `fmt.Sprintf("%v.%x", regarding.Name, t.UnixNano())`."""
    return f"{object_name}.{unix_nanos:x}"


def render_lease_spec(spec: LeaseSpec) -> dict[str, Any]:
    """Lease.spec on the wire, as client-go's LeaderElectionRecordToLeaseSpec fills it."""
    rendered: dict[str, Any] = {
        "holderIdentity": spec.holder_identity,
        "leaseDurationSeconds": spec.lease_duration_seconds,
        "leaseTransitions": spec.lease_transitions,
    }
    if spec.acquire_time is not None:
        rendered["acquireTime"] = format_micro_time(spec.acquire_time)
    if spec.renew_time is not None:
        rendered["renewTime"] = format_micro_time(spec.renew_time)
    return rendered


def parse_lease(obj: Mapping[str, Any]) -> Lease:
    """A Lease object from the API server as the elector's values."""
    spec = _mapping(obj.get("spec"))
    metadata = _mapping(obj.get("metadata"))
    return Lease(
        spec=LeaseSpec(
            holder_identity=str(spec.get("holderIdentity") or ""),
            lease_duration_seconds=_int(spec.get("leaseDurationSeconds")),
            acquire_time=_optional_time(spec.get("acquireTime")),
            renew_time=_optional_time(spec.get("renewTime")),
            lease_transitions=_int(spec.get("leaseTransitions")),
        ),
        resource_version=str(metadata.get("resourceVersion") or ""),
        raw=obj,
    )


def parse_group_version(api_version: str) -> tuple[str, str]:
    """schema.ParseGroupVersion: "apps/v1" -> ("apps", "v1"), "v1" -> ("", "v1")."""
    if not api_version or api_version == "/":
        return "", ""
    parts = api_version.split("/")
    if len(parts) == 1:
        return "", parts[0]
    if len(parts) == 2:
        return parts[0], parts[1]
    raise InvalidTargetReference(f"unexpected GroupVersion string: {api_version}")


# --- The HTTP path: one aiohttp session of our own ----------------------------------------------

def _ssl_context(configuration: Configuration) -> ssl.SSLContext:
    """The TLS client context kubernetes_asyncio's RESTClientObject builds, option for option."""
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, keyfile=configuration.key_file)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if configuration.disable_strict_ssl_verification:
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    return context


@dataclass(frozen=True)
class Response:
    """An API server's answer as the client reads it: status, headers, body bytes."""

    status: int
    headers: Mapping[str, str]
    body: bytes


class KubeHTTP:
    """Requests to the API server over one aiohttp session, built from a Configuration.

    Why not kubernetes_asyncio's ApiClient: its session has `trust_env=True`, so aiohttp asks a
    worker thread for the proxy and another for ~/.netrc on every request, and `call_api`
    rebuilds headers, auth and parameters through its serializer each time: a GET cost about
    three times the CPU of the same GET on a plain session (~300 against ~105 µs, measured).
    Here the proxy (kubeconfig `proxy-url`, else HTTP(S)_PROXY/NO_PROXY) is resolved once at
    start, the headers are rebuilt only when the token changes (the Configuration's refresh
    hook is still asked every request, so rotating service-account tokens and exec credentials
    keep working), and connections are kept alive and pooled (at least
    `connection_pool_maxsize`, default 100) across reconciles. TLS is exactly what
    RESTClientObject configures.
    """

    def __init__(self, configuration: Configuration, *, user_agent: str,
                 proxies: Mapping[str, str] | None = None,
                 request_timeout: float = 30.0) -> None:
        self._configuration = configuration
        self._timeout = aiohttp.ClientTimeout(total=request_timeout)
        self._host = str(configuration.host).rstrip("/")
        self._user_agent = user_agent
        self._server_hostname: str | None = configuration.tls_server_name or None
        proxy = proxy_for(URL(self._host), urllib.request.getproxies() if proxies is None
                          else proxies, configured=configuration.proxy,
                          configured_headers=configuration.proxy_headers)
        if proxy.ignored:
            logger.warning("not using the proxy set in the environment for %s: %s",
                           self._host, proxy.ignored)
        elif proxy.url is not None:
            logger.info("Kubernetes API requests go through the proxy %s", proxy.url)
        self.proxy = proxy
        self._request_options: dict[str, Any] = {}
        self._extra_headers: dict[str, str] = {}
        if proxy.url is not None:
            self._request_options["proxy"] = proxy.url
            # Proxy-Authorization goes on the CONNECT for https, on each request for http.
            if proxy.headers and URL(self._host).scheme == "https":
                self._request_options["proxy_headers"] = dict(proxy.headers)
            else:
                self._extra_headers.update(proxy.headers)
        if self._server_hostname:
            self._request_options["server_hostname"] = self._server_hostname
        self._session: aiohttp.ClientSession | None = None
        self._token: str | None = None
        self._headers: dict[str, dict[str, str]] = {}

    async def __aenter__(self) -> KubeHTTP:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def start(self) -> None:
        """Open the session (inside the running loop)."""
        if self._session is not None:
            return
        limit = max(int(self._configuration.connection_pool_maxsize or 0), 100)
        connector = aiohttp.TCPConnector(
            limit=limit, ssl=_ssl_context(self._configuration),
            # Longer than the default sync period, so a steady state reuses its connections.
            keepalive_timeout=60.0)
        self._session = aiohttp.ClientSession(connector=connector, trust_env=False,
                                              timeout=self._timeout)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _token_value(self) -> str | None:
        configuration = self._configuration
        if "BearerToken" not in configuration.api_key:
            return None
        # get_api_key_with_prefix runs the refresh hook (in-cluster: re-reads the projected
        # token once a minute), as kubernetes_asyncio does before every request.
        value = await configuration.get_api_key_with_prefix("BearerToken")
        return str(value) if value else None

    def _headers_for(self, content_type: str | None) -> dict[str, str]:
        headers = self._headers.get(content_type or "")
        if headers is None:
            headers = {"Accept": _JSON, "User-Agent": self._user_agent, **self._extra_headers}
            if self._token:
                headers["Authorization"] = self._token
            if content_type:
                headers["Content-Type"] = content_type
            self._headers[content_type or ""] = headers
        return headers

    async def request(self, verb: str, path: str, *, query: Sequence[tuple[str, str]] = (),
                      body: Any = None, content_type: str | None = None) -> Response:
        """One request; `path` is already escaped. Raises aiohttp.ClientError, TimeoutError or
        OSError when no response arrives; any status is returned, not raised."""
        if self._session is None:
            raise RuntimeError("KubeHTTP used before start() or after close()")
        token = await self._token_value()
        if token != self._token:
            self._token, self._headers = token, {}
        url = self._host + path
        if query:
            url += "?" + urlencode(query)  # url.Values.Encode's escaping (QueryEscape)
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        async with self._session.request(
                verb, URL(url, encoded=True), data=data,
                headers=self._headers_for(content_type if data is not None else None),
                **self._request_options) as response:
            payload = await response.read()
            return Response(response.status, response.headers, payload)


@asynccontextmanager
async def open_kube_http(configuration: Configuration, *, user_agent: str | None = None,
                         proxies: Mapping[str, str] | None = None,
                         request_timeout: float = 30.0) -> AsyncIterator[KubeHTTP]:
    """A KubeHTTP whose session lives exactly as long as the `async with`."""
    async with KubeHTTP(configuration, proxies=proxies, request_timeout=request_timeout,
                        user_agent=user_agent or _default_user_agent()) as http:
        yield http


def _default_user_agent() -> str:
    return f"metricscale-autoscaler/{__version__}"


@asynccontextmanager
async def open_watch_client(configuration: Configuration) -> AsyncIterator[ApiClient]:
    """kubernetes_asyncio's ApiClient for the informers (metricscale.kube.informer), which list and
    watch through it: a few long-lived requests, where its per-request costs do not matter."""
    async with ApiClient(configuration=configuration) as api:
        api.user_agent = _default_user_agent()
        yield api


# --- The protocol the controller sees ----------------------------------------------------------


class KubeWrites(Protocol):
    """The Kubernetes calls a reconcile makes (KubeClient has them all; tests may use a double)."""

    async def resolve_scale_target(self, ref: ScaleTargetRef) -> ResourceMapping: ...

    async def get_scale(self, target: ResourceMapping, *, namespace: str, name: str) -> Scale: ...

    async def update_scale(self, target: ResourceMapping, *, namespace: str, name: str,
                           scale: Scale, replicas: int) -> Scale: ...

    async def write_autoscaler_status(
        self, *, namespace: str, name: str, status: Mapping[str, Any],
        previous: Mapping[str, Any] | None, resource_version: str | None = None,
    ) -> Mapping[str, Any]: ...

    async def write_hpa_status(
        self, *, namespace: str, name: str, status: Mapping[str, Any],
        previous: Mapping[str, Any] | None, resource_version: str | None = None,
    ) -> Mapping[str, Any]: ...

    async def patch_hpa_annotations(
        self, *, namespace: str, name: str, annotations: Mapping[str, str | None],
    ) -> Mapping[str, Any]: ...

    async def create_event(
        self, *, regarding: ObjectReference, event_type: EventType, reason: str, note: str,
        now: datetime, action: str = "Scale",
    ) -> bool: ...


class KubeAPI(KubeWrites, Protocol):
    """Every Kubernetes call the autoscaler makes; tests may hand in an in-memory double."""

    async def resolve_kind(self, *, group: str, kind: str) -> list[ResourceMapping]: ...

    async def read_lease(self, *, namespace: str, name: str) -> Lease | None: ...

    async def create_lease(self, *, namespace: str, name: str, spec: LeaseSpec) -> Lease: ...

    async def replace_lease(self, lease: Lease, *, spec: LeaseSpec) -> Lease: ...

    async def get_json(self, path: str, *, query: Sequence[tuple[str, str]] = (),
                       operation: str, resource: str,
                       context: ErrorContext | None = None) -> Any: ...

    async def server_groups(self) -> list[Mapping[str, Any]]: ...


# --- The client ------------------------------------------------------------------------------


@dataclass
class _Discovery:
    """A cached view of /api, /apis and the APIResourceLists fetched so far."""

    groups: dict[str, list[str]] | None = None  # group -> versions, preferred first
    resources: dict[str, list[Mapping[str, Any]]] = field(default_factory=dict)
    kinds: dict[tuple[str, str], list[ResourceMapping]] = field(default_factory=dict)
    generation: int = 0
    fetched_at: float = 0.0


class KubeClient:
    """KubeAPI over a KubeHTTP (one session to the API server)."""

    def __init__(
        self,
        http: KubeHTTP,
        *,
        registry: CollectorRegistry,
        reporting_instance: str,
        retry: RetryPolicy | None = None,
        metrics_retry: RetryPolicy | None = None,
        discovery_ttl: float = 30.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        jitter: Callable[[], float] = random.random,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._http = http
        self._reporting_instance = reporting_instance
        self._retry = retry or RetryPolicy()
        # Metrics reads are not retried by default, as upstream's HPA does not: the next sync
        # period is the retry, and a down adapter must not keep every worker busy sleeping.
        self._metrics_retry = metrics_retry or RetryPolicy(attempts=1)
        self._sleep = sleep
        self._jitter = jitter
        self._discovery_ttl = discovery_ttl
        self._monotonic = monotonic
        self._discovery = _Discovery(fetched_at=monotonic())
        self._discovery_lock = asyncio.Lock()
        self._fetch_lock = asyncio.Lock()
        self._requests = 0
        # Event names must be unique: client-go takes the nanoseconds of its own clock, which
        # two events of one reconcile (one `now`) would share. Strictly increasing per client.
        self._last_event_nanos = 0
        self._latency = Histogram(
            "metricscale_autoscaler_api_request_duration_seconds",
            "Latency of the autoscaler's Kubernetes API requests, by call site, verb, resource "
            "and HTTP code (<error> when no response arrived).",
            ["operation", "verb", "resource", "code"],
            registry=registry,
        )
        self._latency_children: dict[tuple[str, str, str, str], Histogram] = {}

    def _observe(self, labels: tuple[str, str, str, str], seconds: float) -> None:
        # The children by label values, so a request does not look them up by name each time.
        child = self._latency_children.get(labels)
        if child is None:
            child = self._latency_children[labels] = self._latency.labels(*labels)
        child.observe(seconds)

    @property
    def request_count(self) -> int:
        """Requests sent so far (every attempt counts), for tests and benchmarks."""
        return self._requests

    # -- the one request path --

    async def _request(
        self,
        verb: str,
        path: str,
        *,
        operation: str,
        resource: str,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = _JSON,
        context: ErrorContext | None = None,
        retry: RetryPolicy | None = None,
    ) -> Any:
        policy = retry or self._retry
        failures = 0
        while True:
            self._requests += 1
            started = time.perf_counter()
            code = "<error>"
            try:
                response = await self._http.request(verb, path, query=query, body=body,
                                                    content_type=content_type)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                error: KubeError = ConnectionFailed(
                    f"{verb} {path}: {type(exc).__name__}: {exc}".rstrip(": "), status=0)
            else:
                code = str(response.status)
                if 200 <= response.status < 300:
                    return _decode(response.body)
                error = error_from_response(response.status, headers=response.headers,
                                            body=response.body, verb=verb, context=context)
            finally:
                self._observe((operation, verb, resource, code), time.perf_counter() - started)
            failures += 1
            delay = policy.delay(error, failures=failures, jitter=self._jitter())
            if delay is None:
                raise error
            logger.info("%s %s failed (%s), retry %d in %.3fs", verb, path, error, failures,
                        delay)
            await self._sleep(delay)

    async def get_json(
        self,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        operation: str,
        resource: str,
        context: ErrorContext | None = None,
    ) -> Any:
        """GET an already-escaped path through the API server and return the decoded JSON
        (used for the metrics APIs, so retried by the metrics policy)."""
        return await self._request("GET", path, operation=operation, resource=resource,
                                   query=query, context=context, retry=self._metrics_retry)

    # -- discovery (a RESTMapper in miniature) --

    async def server_groups(self) -> list[Mapping[str, Any]]:
        """GET /apis: the APIGroupList's groups (not cached; callers cache what they need)."""
        data = await self._request("GET", "/apis", operation="discovery", resource="apis")
        groups = _mapping(data).get("groups")
        return [_mapping(g) for g in groups] if isinstance(groups, list) else []

    def invalidate_discovery(self) -> None:
        """Forget everything discovery said; the next lookup asks again."""
        generation = self._discovery.generation + 1
        self._discovery = _Discovery(generation=generation, fetched_at=self._monotonic())

    async def _groups(self) -> dict[str, list[str]]:
        if self._monotonic() - self._discovery.fetched_at >= self._discovery_ttl:
            # kube-controller-manager resets its discovery RESTMapper every 30 s as well.
            self.invalidate_discovery()
        cached = self._discovery.groups
        if cached is not None:
            return cached
        async with self._fetch_lock:  # concurrent workers wait for one fetch, not make five
            if self._discovery.groups is not None:
                return self._discovery.groups
            return await self._fetch_groups()

    async def _fetch_groups(self) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        core = _mapping(await self._request("GET", "/api", operation="discovery",
                                            resource="api"))
        core_versions = core.get("versions")
        groups[""] = [str(v) for v in core_versions] if isinstance(core_versions, list) else []
        for group in await self.server_groups():
            name = str(group.get("name") or "")
            versions = [str(_mapping(v).get("version") or "") for v in
                        (group.get("versions") or []) if isinstance(v, Mapping)]
            preferred = str(_mapping(group.get("preferredVersion")).get("version") or "")
            if preferred in versions:
                versions.remove(preferred)
                versions.insert(0, preferred)
            groups[name] = [v for v in versions if v]
        self._discovery.groups = groups
        return groups

    async def _resource_list(self, group: str, version: str) -> list[Mapping[str, Any]]:
        group_version = f"{group}/{version}" if group else version
        cached = self._discovery.resources.get(group_version)
        if cached is not None:
            return cached
        async with self._fetch_lock:
            cached = self._discovery.resources.get(group_version)
            if cached is not None:
                return cached
            return await self._fetch_resource_list(group, version)

    async def _fetch_resource_list(self, group: str, version: str) -> list[Mapping[str, Any]]:
        group_version = f"{group}/{version}" if group else version
        path = f"/apis/{group}/{version}" if group else f"/api/{version}"
        try:
            data = await self._request("GET", path, operation="discovery", resource="apis")
        except NotFound:
            data = {}
        resources = _mapping(data).get("resources")
        listed = [_mapping(r) for r in resources] if isinstance(resources, list) else []
        self._discovery.resources[group_version] = listed
        return listed

    async def _lookup_kind(self, group: str, kind: str) -> list[ResourceMapping]:
        groups = await self._groups()
        discovery = self._discovery
        known = discovery.kinds.get((group, kind))
        if known is not None:
            return known  # every reconcile asks; discovery changes every 30 s at most
        mappings: list[ResourceMapping] = []
        for version in groups.get(group, []):
            listed = await self._resource_list(group, version)
            names = {str(r.get("name") or "") for r in listed}
            for entry in listed:
                name = str(entry.get("name") or "")
                if "/" in name or entry.get("kind") != kind:
                    continue
                mappings.append(ResourceMapping(
                    group=group, version=version, resource=name, kind=kind,
                    namespaced=bool(entry.get("namespaced")),
                    has_scale=f"{name}/scale" in names))
                break
        discovery.kinds[(group, kind)] = mappings
        return mappings

    async def _lookup_with_refresh(
        self, group: str, kind: str, found: Callable[[list[ResourceMapping]], bool]
    ) -> list[ResourceMapping]:
        generation = self._discovery.generation
        mappings = await self._lookup_kind(group, kind)
        if found(mappings):
            return mappings
        async with self._discovery_lock:
            # One refresh per miss wave: whoever got the lock first refreshed for everyone.
            if self._discovery.generation == generation:
                self.invalidate_discovery()
            return await self._lookup_kind(group, kind)

    async def resolve_kind(self, *, group: str, kind: str) -> list[ResourceMapping]:
        """All mappings of group/kind, preferred version first; refreshes discovery on a miss."""
        mappings = await self._lookup_with_refresh(group, kind, bool)
        if not mappings:
            raise KindNotFound(f"no matches for kind {json.dumps(kind)} in group "
                               f"{json.dumps(group)}")
        return mappings

    async def resolve_scale_target(self, ref: ScaleTargetRef) -> ResourceMapping:
        """The resource serving scaleTargetRef's scale subresource (its apiVersion's group only).

        Raises InvalidTargetReference, KindNotFound (upstream's NoKindMatchError text), or
        NoScaleSubresource (the text of client-go's discovery scale-kind resolver).
        """
        group, _ = parse_group_version(ref.api_version)
        mappings = await self._lookup_with_refresh(
            group, ref.kind, lambda found: any(m.has_scale for m in found))
        if not mappings:
            raise KindNotFound(f"no matches for kind {json.dumps(ref.kind)} in group "
                               f"{json.dumps(group)}")
        for mapping in mappings:
            if mapping.has_scale:
                return mapping
        raise NoScaleSubresource(f"could not find scale subresource for "
                                 f"{mappings[0].gvr_string} in discovery information")

    # -- scale --

    async def get_scale(self, target: ResourceMapping, *, namespace: str, name: str) -> Scale:
        """GET the scale subresource; a 404 is TargetNotFound with the server's message."""
        try:
            data = await self._request(
                "GET", target.path(namespace=namespace, name=name, subresource="scale"),
                operation="get_scale", resource=f"{target.group_resource}/scale",
                context=ErrorContext(target.group, target.resource, name))
        except NotFound as exc:
            raise TargetNotFound(exc.message, status=exc.status, reason=exc.reason) from exc
        return _scale(data)

    async def update_scale(
        self, target: ResourceMapping, *, namespace: str, name: str, scale: Scale, replicas: int
    ) -> Scale:
        """Set spec.replicas as the HPA does: PUT with the read resourceVersion; after any
        failed PUT re-read the scale; retry only conflicts (retry.DefaultRetry: 5 tries, 10ms,
        jitter 0.1). Returns the Scale the server stored."""
        current = scale
        path = target.path(namespace=namespace, name=name, subresource="scale")
        context = ErrorContext(target.group, target.resource, name)
        for step in range(1, _CONFLICT_RETRY_STEPS + 1):
            body: dict[str, Any] = copy.deepcopy(dict(current.raw)) if current.raw else {
                "apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {"name": name, "namespace": namespace,
                             "resourceVersion": current.resource_version}}
            body.setdefault("spec", {})["replicas"] = replicas
            try:
                data = await self._request("PUT", path, operation="update_scale",
                                           resource=f"{target.group_resource}/scale",
                                           body=body, context=context)
                return _scale(data)
            except KubeError as update_error:
                try:
                    current = await self.get_scale(target, namespace=namespace, name=name)
                except KubeError as read_error:
                    logger.warning("%s/%s: error getting latest scale during conflict retry: %s",
                                   namespace, name, read_error)
                if not isinstance(update_error, Conflict) or step == _CONFLICT_RETRY_STEPS:
                    raise
            delay = _CONFLICT_RETRY_DELAY * (1 + _CONFLICT_RETRY_JITTER * self._jitter())
            await self._sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    # -- status --

    async def _write_status(
        self, path: str, *, operation: str, resource: str, status: Mapping[str, Any],
        previous: Mapping[str, Any] | None, resource_version: str | None,
        context: ErrorContext,
    ) -> Mapping[str, Any]:
        patch: dict[str, Any] = {"status": merge_patch(previous or {}, status)}
        if resource_version:
            # A precondition: the server answers 409 if the object moved on.
            patch["metadata"] = {"resourceVersion": resource_version}
        data = await self._request("PATCH", path, operation=operation, resource=resource,
                                   body=patch, content_type=_MERGE_PATCH, context=context)
        return _mapping(data)

    async def write_autoscaler_status(
        self, *, namespace: str, name: str, status: Mapping[str, Any],
        previous: Mapping[str, Any] | None, resource_version: str | None = None,
    ) -> Mapping[str, Any]:
        """Replace an Autoscaler's status (merge patch on /status; `previous` is the status
        read with the object, so fields it had and `status` lacks are removed)."""
        path = (f"/apis/{AUTOSCALER_GROUP}/{AUTOSCALER_VERSION}/namespaces/{namespace}/"
                f"{AUTOSCALER_PLURAL}/{name}/status")
        return await self._write_status(
            path, operation="write_status", resource=f"{AUTOSCALER_PLURAL}.{AUTOSCALER_GROUP}",
            status=status, previous=previous, resource_version=resource_version,
            context=ErrorContext(AUTOSCALER_GROUP, AUTOSCALER_PLURAL, name))

    async def write_hpa_status(
        self, *, namespace: str, name: str, status: Mapping[str, Any],
        previous: Mapping[str, Any] | None, resource_version: str | None = None,
    ) -> Mapping[str, Any]:
        """Replace an autoscaling/v2 HorizontalPodAutoscaler's status (merge patch on /status)."""
        path = (f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/"
                f"{name}/status")
        return await self._write_status(
            path, operation="write_status", resource="horizontalpodautoscalers.autoscaling",
            status=status, previous=previous, resource_version=resource_version,
            context=ErrorContext("autoscaling", "horizontalpodautoscalers", name))

    async def patch_hpa_annotations(
        self, *, namespace: str, name: str, annotations: Mapping[str, str | None],
    ) -> Mapping[str, Any]:
        """Merge-patch metadata.annotations of an autoscaling/v2 HorizontalPodAutoscaler (a
        None value removes the annotation); other annotations are left as they are. This is
        where a native HPA keeps the history an Autoscaler keeps in its status."""
        path = f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/{name}"
        data = await self._request(
            "PATCH", path, operation="patch_annotations",
            resource="horizontalpodautoscalers.autoscaling",
            body={"metadata": {"annotations": dict(annotations)}}, content_type=_MERGE_PATCH,
            context=ErrorContext("autoscaling", "horizontalpodautoscalers", name))
        return _object(data, "HorizontalPodAutoscaler")

    # -- events --

    async def create_event(
        self,
        *,
        regarding: ObjectReference,
        event_type: EventType,
        reason: str,
        note: str,
        now: datetime,
        action: str = "Scale",
    ) -> bool:
        """Post an events.k8s.io/v1 Event; best effort: failures are logged, never raised.

        Returns whether the server accepted it. One attempt only: an event is not worth
        holding a reconcile for.
        """
        nanos = max(_unix_nanos(now), self._last_event_nanos + 1)
        self._last_event_nanos = nanos
        body = render_event(regarding=regarding, event_type=event_type, reason=reason,
                            note=note, action=action, now=now,
                            reporting_instance=self._reporting_instance,
                            name=event_name(regarding.name, nanos))
        path = f"/apis/events.k8s.io/v1/namespaces/{regarding.namespace}/events"
        context = ErrorContext("events.k8s.io", "events")
        try:
            try:
                await self._request("POST", path, operation="create_event",
                                    resource="events.events.k8s.io", body=body,
                                    retry=_NO_RETRY, context=context)
            except AlreadyExists:
                # Another process (a restarted replica) named one in the same nanosecond:
                # let the server pick a free name.
                metadata = body["metadata"]
                metadata["generateName"] = f"{regarding.name}."
                del metadata["name"]
                await self._request("POST", path, operation="create_event",
                                    resource="events.events.k8s.io", body=body,
                                    retry=_NO_RETRY, context=context)
        except Exception as exc:
            logger.warning("%s/%s: event %s not recorded: %s", regarding.namespace,
                           regarding.name, reason, exc)
            return False
        return True

    # -- leases --

    def _lease_path(self, namespace: str, name: str | None = None) -> str:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        return f"{path}/{name}" if name is not None else path

    async def read_lease(self, *, namespace: str, name: str) -> Lease | None:
        """The Lease, or None when it does not exist."""
        try:
            data = await self._request(
                "GET", self._lease_path(namespace, name), operation="read_lease",
                resource="leases.coordination.k8s.io",
                context=ErrorContext("coordination.k8s.io", "leases", name))
        except NotFound:
            return None
        return parse_lease(_object(data, "Lease"))

    async def create_lease(self, *, namespace: str, name: str, spec: LeaseSpec) -> Lease:
        """Create the Lease; AlreadyExists (a Conflict) when another replica was first."""
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": namespace},
                "spec": render_lease_spec(spec)}
        data = await self._request(
            "POST", self._lease_path(namespace), operation="create_lease",
            resource="leases.coordination.k8s.io", body=body,
            context=ErrorContext("coordination.k8s.io", "leases", name))
        return parse_lease(_object(data, "Lease"))

    async def replace_lease(self, lease: Lease, *, spec: LeaseSpec) -> Lease:
        """PUT the lease back with a new spec and the resourceVersion it was read with
        (Conflict on 409); the rest of the object (labels, annotations) is kept."""
        body = copy.deepcopy(dict(lease.raw))
        metadata = body.setdefault("metadata", {})
        metadata["resourceVersion"] = lease.resource_version
        body.setdefault("apiVersion", "coordination.k8s.io/v1")
        body.setdefault("kind", "Lease")
        body["spec"] = render_lease_spec(spec)
        namespace, name = str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
        data = await self._request(
            "PUT", self._lease_path(namespace, name), operation="replace_lease",
            resource="leases.coordination.k8s.io", body=body,
            context=ErrorContext("coordination.k8s.io", "leases", name))
        return parse_lease(_object(data, "Lease"))


def _decode(body: bytes) -> Any:
    """A success body: its JSON, or the text when it is not JSON (callers then refuse it)."""
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")


def _object(data: object, kind: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise UnexpectedResponse(f"expected a {kind} object, got {type(data).__name__}")
    return cast(Mapping[str, Any], data)


def _scale(data: object) -> Scale:
    return Scale.from_object(_object(data, "Scale"))


# --- Configuration and lifecycle ---------------------------------------------------------------


async def load_configuration(*, kubeconfig: str | None = None,
                             context: str | None = None) -> Configuration:
    """An explicit Configuration: from a kubeconfig file when given, else in-cluster."""
    configuration = Configuration()
    if kubeconfig:
        await kube_config.load_kube_config(config_file=kubeconfig, context=context,
                                           client_configuration=configuration)
    else:
        kube_config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration)
    return configuration


@asynccontextmanager
async def open_kube_client(
    configuration: Configuration,
    *,
    registry: CollectorRegistry,
    reporting_instance: str,
    retry: RetryPolicy | None = None,
    metrics_retry: RetryPolicy | None = None,
    request_timeout: float = 30.0,
) -> AsyncIterator[KubeClient]:
    """A KubeClient whose aiohttp session lives exactly as long as the `async with`."""
    async with open_kube_http(configuration, request_timeout=request_timeout) as http:
        yield KubeClient(http, registry=registry, reporting_instance=reporting_instance,
                         retry=retry, metrics_retry=metrics_retry)
