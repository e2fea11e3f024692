"""The autoscaler's typed Kubernetes operations: scale, status, events, leases, kinds, metric reads.

Every call goes through the shared request path (`metricscale.kube.requests`): raw JSON dicts in
and out, failures mapped once to `metricscale.kube.errors`, retries by one policy, and every
attempt timed in one histogram by call site. Kinds are resolved against the shared discovery
client's snapshot, as kube-controller-manager's RESTMapper does.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol, cast

from prometheus_client import CollectorRegistry, Histogram

from autoscaler.decision.leadership import Lease, LeaseSpec
from autoscaler.model.fields import ModelError
from autoscaler.model.pods import Scale, parse_scale
from metricscale import __version__
from metricscale.kube.config import Configuration
from metricscale.kube.discovery import (
    DiscoverySnapshot,
    ResourceDiscovery,
    ResourceMapping,
    parse_group_version,
)
from metricscale.kube.errors import (
    AlreadyExists,
    Conflict,
    ErrorContext,
    KindNotFound,
    KubeError,
    NoScaleSubresource,
    NotFound,
    UnexpectedResponse,
)
from metricscale.kube.http import KubeHTTP, open_kube_http
from metricscale.kube.requests import Attempt, KubeRequests
from metricscale.kube.retry import NO_RETRY, RetryPolicy

logger = logging.getLogger(__name__)

__all__ = [
    "AUTOSCALER_GROUP",
    "AUTOSCALER_PLURAL",
    "AUTOSCALER_VERSION",
    "REPORTING_CONTROLLER",
    "USER_AGENT",
    "EventType",
    "KubeAPI",
    "KubeClient",
    "KubeWrites",
    "ObjectReference",
    "ScaleTargetRef",
    "TargetNotFound",
    "event_name",
    "format_micro_time",
    "merge_patch",
    "open_kube_client",
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
# retry.DefaultRetry: Steps 5, Duration 10ms, Factor 1.0, Jitter 0.1.
_CONFLICT_RETRY_STEPS = 5
_CONFLICT_RETRY_DELAY = 0.010
_CONFLICT_RETRY_JITTER = 0.1
_MERGE_PATCH = "application/merge-patch+json"
USER_AGENT = f"metricscale-autoscaler/{__version__}"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

EventType = Literal["Normal", "Warning"]

# An Event repeated within this long of its last occurrence counts on as a series of the same
# Event (events.k8s.io/v1 `series`), as client-go's events library folds them (its finishTime).
EVENT_SERIES_WINDOW = timedelta(minutes=6)


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


class TargetNotFound(NotFound):
    """404 on a scale subresource: the scale target named by scaleTargetRef does not exist."""


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


def _mapping(value: object) -> Mapping[str, Any]:
    return cast(Mapping[str, Any], value) if isinstance(value, Mapping) else {}


def _int(value: object) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value
    return 0


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
        annotations={str(key): str(value)
                     for key, value in _mapping(metadata.get("annotations")).items()},
    )


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

    async def create_lease(self, *, namespace: str, name: str, spec: LeaseSpec,
                           annotations: Mapping[str, str] | None = None) -> Lease: ...

    async def replace_lease(self, lease: Lease, *, spec: LeaseSpec,
                            annotations: Mapping[str, str] | None = None) -> Lease: ...

    async def get_json(self, path: str, *, query: Sequence[tuple[str, str]] = (),
                       operation: str, resource: str,
                       context: ErrorContext | None = None) -> Any: ...

    async def server_groups(self) -> list[Mapping[str, Any]]: ...


# --- The client ------------------------------------------------------------------------------


@dataclass
class _EventSeries:
    """An Event the client posted, and how often it has occurred so far."""

    namespace: str
    name: str
    count: int
    last: datetime



class KubeClient:
    """KubeAPI over the shared request path (one KubeHTTP session to the API server)."""

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
        self._reporting_instance = reporting_instance
        # Metrics reads are not retried by default, as upstream's HPA does not: the next sync
        # period is the retry, and a down adapter must not keep every worker busy sleeping.
        self._metrics_retry = metrics_retry or NO_RETRY
        self._sleep = sleep
        self._jitter = jitter
        self._requests = KubeRequests(http, retry=retry or RetryPolicy(), observe=self._observe,
                                      sleep=sleep, jitter=jitter)
        # kube-controller-manager resets its discovery RESTMapper every 30 s as well.
        self._discovery_ttl = discovery_ttl
        self._discovery = ResourceDiscovery(self._requests, clock=monotonic)
        self._discovery_lock = asyncio.Lock()
        # Event names must be unique: client-go takes the nanoseconds of its own clock, which
        # two events of one reconcile (one `now`) would share. Strictly increasing per client.
        self._last_event_nanos = 0
        # The Events posted lately, by what makes a repeat the same Event (upstream's HPA
        # controller folds repeats the same way: same object, type, reason and message).
        self._event_series: dict[tuple[str, ...], _EventSeries] = {}
        self._latency = Histogram(
            "metricscale_autoscaler_api_request_duration_seconds",
            "Latency of the autoscaler's Kubernetes API requests, by call site, verb, resource "
            "and HTTP code (<error> when no response arrived).",
            ["operation", "verb", "resource", "code"],
            registry=registry,
        )
        self._latency_children: dict[tuple[str, str, str, str], Histogram] = {}

    def _observe(self, attempt: Attempt) -> None:
        # The children by label values, so a request does not look them up by name each time.
        labels = (attempt.operation, attempt.verb, attempt.resource, attempt.code)
        child = self._latency_children.get(labels)
        if child is None:
            child = self._latency_children[labels] = self._latency.labels(*labels)
        child.observe(attempt.seconds)

    @property
    def request_count(self) -> int:
        """Requests sent so far (every attempt counts), for tests and benchmarks."""
        return self._requests.count

    async def _request(self, verb: str, path: str, **options: Any) -> Any:
        return await self._requests.call(verb, path, **options)

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

    # -- discovery (the shared client's snapshot, read as a RESTMapper) --

    async def server_groups(self) -> list[Mapping[str, Any]]:
        """GET /apis: the APIGroupList's groups (not cached; callers cache what they need)."""
        return await self._discovery.fetch_group_list()

    async def _lookup_with_refresh(
        self, group: str, kind: str, found: Callable[[list[ResourceMapping]], bool]
    ) -> list[ResourceMapping]:
        snapshot: DiscoverySnapshot = await self._discovery.snapshot_within(self._discovery_ttl)
        generation = self._discovery.generation
        mappings = snapshot.kind_mappings(group, kind)
        if found(mappings):
            return mappings
        async with self._discovery_lock:
            # One refresh per miss wave: whoever got the lock first refreshed for everyone.
            if self._discovery.generation == generation:
                await self._discovery.refresh()
            snapshot = await self._discovery.snapshot_within(self._discovery_ttl)
            return snapshot.kind_mappings(group, kind)

    async def resolve_kind(self, *, group: str, kind: str) -> list[ResourceMapping]:
        """All mappings of group/kind, preferred version first; refreshes discovery on a miss."""
        mappings = await self._lookup_with_refresh(group, kind, bool)
        if not mappings:
            raise KindNotFound(f"no matches for kind {json.dumps(kind)} in group "
                               f"{json.dumps(group)}")
        return mappings

    async def resolve_scale_target(self, ref: ScaleTargetRef) -> ResourceMapping:
        """The resource serving scaleTargetRef's scale subresource (its apiVersion's group only).

        Raises InvalidGroupVersion, KindNotFound (upstream's NoKindMatchError text), or
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
        return _scale(data, namespace=namespace, name=name)

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
                return _scale(data, namespace=namespace, name=name)
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

        The same Event again (the same object, type, reason, action and note) within
        EVENT_SERIES_WINDOW of its last occurrence is not a new object: the first one's
        `series` counts it (count and lastObservedTime, one PATCH), as client-go's events
        library and upstream's HPA controller fold repeats; a failure repeated at every sync
        stays one Event. Returns whether the server accepted it. One attempt only: an event is
        not worth holding a reconcile for.
        """
        key = (regarding.api_version, regarding.kind, regarding.namespace, regarding.name,
               regarding.uid, event_type, reason, action, note)
        self._forget_finished_series(now)
        series = self._event_series.get(key)
        if series is not None:
            counted = await self._count_in_series(series, regarding=regarding, reason=reason,
                                                  now=now)
            if counted is not None:
                return counted
            del self._event_series[key]  # the Event is gone (deleted, or its TTL): a new one
        name = await self._post_event(regarding=regarding, event_type=event_type,
                                      reason=reason, note=note, now=now, action=action)
        if name is None:
            return False
        if name:  # (a server that answers without the name: nothing to count on)
            self._event_series[key] = _EventSeries(namespace=regarding.namespace, name=name,
                                                   count=1, last=now)
        return True

    def _forget_finished_series(self, now: datetime) -> None:
        finished = [key for key, series in self._event_series.items()
                    if now - series.last > EVENT_SERIES_WINDOW]
        for key in finished:
            del self._event_series[key]

    async def _count_in_series(self, series: _EventSeries, *, regarding: ObjectReference,
                               reason: str, now: datetime) -> bool | None:
        """Counts one more occurrence on the series' Event: True when stored, False when the
        PATCH failed, None when the Event no longer exists."""
        path = f"/apis/events.k8s.io/v1/namespaces/{series.namespace}/events/{series.name}"
        body = {"series": {"count": series.count + 1,
                           "lastObservedTime": format_micro_time(now)}}
        try:
            await self._request("PATCH", path, operation="patch_event",
                                resource="events.events.k8s.io", body=body,
                                content_type=_MERGE_PATCH, retry=NO_RETRY,
                                context=ErrorContext("events.k8s.io", "events", series.name))
        except NotFound:
            return None
        except Exception as exc:
            logger.warning("%s/%s: event %s not counted: %s", regarding.namespace,
                           regarding.name, reason, exc)
            return False
        series.count += 1
        series.last = now
        return True

    async def _post_event(self, *, regarding: ObjectReference, event_type: EventType,
                          reason: str, note: str, now: datetime, action: str) -> str | None:
        """POSTs a new Event: its name ("" if the answer has none), None if not stored."""
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
                data = await self._request("POST", path, operation="create_event",
                                           resource="events.events.k8s.io", body=body,
                                           retry=NO_RETRY, context=context)
            except AlreadyExists:
                # Another process (a restarted replica) named one in the same nanosecond:
                # let the server pick a free name (a prefix may end in '-', not in '.').
                metadata = body["metadata"]
                metadata["generateName"] = f"{regarding.name}-"
                del metadata["name"]
                data = await self._request("POST", path, operation="create_event",
                                           resource="events.events.k8s.io", body=body,
                                           retry=NO_RETRY, context=context)
        except Exception as exc:
            logger.warning("%s/%s: event %s not recorded: %s", regarding.namespace,
                           regarding.name, reason, exc)
            return None
        stored = _mapping(_mapping(data).get("metadata")).get("name")
        return str(stored or body["metadata"].get("name") or "")

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

    async def create_lease(self, *, namespace: str, name: str, spec: LeaseSpec,
                           annotations: Mapping[str, str] | None = None) -> Lease:
        """Create the Lease (with these annotations); AlreadyExists (a Conflict) when another
        replica was first."""
        metadata: dict[str, Any] = {"name": name, "namespace": namespace}
        if annotations:
            metadata["annotations"] = dict(annotations)
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": metadata, "spec": render_lease_spec(spec)}
        data = await self._request(
            "POST", self._lease_path(namespace), operation="create_lease",
            resource="leases.coordination.k8s.io", body=body,
            context=ErrorContext("coordination.k8s.io", "leases", name))
        return parse_lease(_object(data, "Lease"))

    async def replace_lease(self, lease: Lease, *, spec: LeaseSpec,
                            annotations: Mapping[str, str] | None = None) -> Lease:
        """PUT the lease back with a new spec and the resourceVersion it was read with
        (Conflict on 409); the rest of the object (labels, annotations) is kept, and the given
        annotations are set."""
        body = copy.deepcopy(dict(lease.raw))
        metadata = body.setdefault("metadata", {})
        metadata["resourceVersion"] = lease.resource_version
        if annotations:
            metadata["annotations"] = {**(metadata.get("annotations") or {}), **annotations}
        body.setdefault("apiVersion", "coordination.k8s.io/v1")
        body.setdefault("kind", "Lease")
        body["spec"] = render_lease_spec(spec)
        namespace, name = str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
        data = await self._request(
            "PUT", self._lease_path(namespace, name), operation="replace_lease",
            resource="leases.coordination.k8s.io", body=body,
            context=ErrorContext("coordination.k8s.io", "leases", name))
        return parse_lease(_object(data, "Lease"))

    # -- config maps (shadow mode publishes what explain reads in one) --

    def _configmap_path(self, namespace: str, name: str | None = None) -> str:
        path = f"/api/v1/namespaces/{namespace}/configmaps"
        return f"{path}/{name}" if name is not None else path

    async def read_configmap(self, *, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The ConfigMap, or None when it does not exist."""
        try:
            data = await self._request(
                "GET", self._configmap_path(namespace, name), operation="read_configmap",
                resource="configmaps", context=ErrorContext("", "configmaps", name))
        except NotFound:
            return None
        return _object(data, "ConfigMap")

    async def create_configmap(self, *, namespace: str, name: str, data: Mapping[str, str],
                               labels: Mapping[str, str] | None = None) -> Mapping[str, Any]:
        """Create the ConfigMap; AlreadyExists when someone was first."""
        metadata: dict[str, Any] = {"name": name, "namespace": namespace}
        if labels:
            metadata["labels"] = dict(labels)
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
                "data": dict(data)}
        created = await self._request(
            "POST", self._configmap_path(namespace), operation="create_configmap",
            resource="configmaps", body=body, context=ErrorContext("", "configmaps", name))
        return _object(created, "ConfigMap")

    async def replace_configmap(self, configmap: Mapping[str, Any], *,
                                data: Mapping[str, str]) -> Mapping[str, Any]:
        """PUT the ConfigMap back with new data and the resourceVersion it was read with
        (Conflict on 409); its metadata is kept."""
        body = copy.deepcopy(dict(configmap))
        body.setdefault("apiVersion", "v1")
        body.setdefault("kind", "ConfigMap")
        body["data"] = dict(data)
        body.pop("binaryData", None)
        metadata = _mapping(body.get("metadata"))
        namespace, name = str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
        replaced = await self._request(
            "PUT", self._configmap_path(namespace, name), operation="replace_configmap",
            resource="configmaps", body=body, context=ErrorContext("", "configmaps", name))
        return _object(replaced, "ConfigMap")


def _object(data: object, kind: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise UnexpectedResponse(f"expected a {kind} object, got {type(data).__name__}")
    return cast(Mapping[str, Any], data)


def _scale(data: object, *, namespace: str, name: str) -> Scale:
    """The Scale the server answered, as the decision reads it (of the object asked for)."""
    try:
        scale = parse_scale(_object(data, "Scale"))
    except ModelError as err:
        raise UnexpectedResponse(f"a Scale the autoscaler cannot read: {err}") from None
    if not isinstance(scale, Scale):
        raise UnexpectedResponse("a Scale the autoscaler cannot read")
    return replace(scale, name=name, namespace=namespace)


# --- Configuration and lifecycle ---------------------------------------------------------------


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
    async with open_kube_http(configuration, request_timeout=request_timeout,
                              user_agent=USER_AGENT) as http:
        yield KubeClient(http, registry=registry, reporting_instance=reporting_instance,
                         retry=retry, metrics_retry=metrics_retry)
