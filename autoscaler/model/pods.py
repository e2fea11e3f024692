"""The scale target as a decision sees it: its Scale and its pods."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from autoscaler.model.fields import (
    ModelError,
    Quantity,
    kind_name,
    read_int,
    read_list,
    read_object,
    read_optional_object,
    read_resource_list,
    read_str,
    read_string_map,
)
from autoscaler.model.times import (
    GO_ZERO_TIME,
    read_optional_time,
)
from metricscale.core.selectors import (
    Selector,
)

__all__ = [
    "Container",
    "ControllerRef",
    "Pod",
    "PodReadyCondition",
    "Scale",
    "ScaleError",
    "parse_controller_ref",
    "parse_pod",
    "parse_pods",
    "parse_scale",
    "pods_matching",
]


@dataclass(frozen=True)
class Scale:
    """The target's autoscaling/v1 Scale: spec.replicas, status.replicas, status.selector, and
    the resourceVersion (and whole object) a write of spec.replicas goes back with."""

    spec_replicas: int
    status_replicas: int = 0
    selector: str = ""
    name: str = ""
    namespace: str = ""
    resource_version: str = ""
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class ScaleError:
    """Reading the scale subresource failed (upstream: FailedGetScale); text as the API said."""

    message: str


def parse_scale(raw: Any, path: str = "scale") -> Scale | ScaleError:
    obj = read_object(raw, path)
    if "error" in obj:
        return ScaleError(message=read_str(obj, "error", path, required=True))
    meta = read_object(obj.get("metadata") or {}, f"{path}.metadata")
    spec = read_object(obj.get("spec") or {}, f"{path}.spec")
    status = read_object(obj.get("status") or {}, f"{path}.status")
    return Scale(
        spec_replicas=read_int(spec, "replicas", f"{path}.spec") or 0,
        status_replicas=read_int(status, "replicas", f"{path}.status") or 0,
        selector=read_str(status, "selector", f"{path}.status"),
        name=read_str(meta, "name", f"{path}.metadata"),
        namespace=read_str(meta, "namespace", f"{path}.metadata"),
        resource_version=read_str(meta, "resourceVersion", f"{path}.metadata"),
        raw=obj,
    )


@dataclass(frozen=True)
class Container:
    name: str
    requests: Mapping[str, Quantity]
    restartable: bool = False  # an init container with restartPolicy Always (a sidecar)


@dataclass(frozen=True)
class PodReadyCondition:
    status: str
    last_transition_time: datetime


@dataclass(frozen=True)
class ControllerRef:
    """The ownerReference with `controller: true` (metav1.GetControllerOf)."""

    kind: str
    name: str
    uid: str = ""


def parse_controller_ref(meta: Mapping[str, Any], path: str) -> ControllerRef | None:
    for i, item in enumerate(read_list(meta, "ownerReferences", path) or []):
        where = f"{path}.ownerReferences[{i}]"
        ref = read_object(item, where)
        if ref.get("controller") is True:
            return ControllerRef(kind=read_str(ref, "kind", where),
                                 name=read_str(ref, "name", where),
                                 uid=read_str(ref, "uid", where))
    return None


@dataclass(frozen=True)
class Pod:
    """A v1 Pod, reduced to what the HPA looks at (requests summed once, at parse time)."""

    name: str
    namespace: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    phase: str = ""
    deletion_timestamp: datetime | None = None
    start_time: datetime | None = None
    ready: PodReadyCondition | None = None
    containers: tuple[Container, ...] = ()
    init_containers: tuple[Container, ...] = ()
    pod_requests: Mapping[str, Quantity] | None = None  # spec.resources.requests
    overhead: Mapping[str, Quantity] | None = None
    controller: ControllerRef | None = None  # KEP-5325's OwnerReferences strategy reads it
    # Derived: sum of MilliValue() over containers and sidecars per resource, and for a
    # resource some of those containers lack, the first container that lacks it.
    request_totals: Mapping[str, int] = field(init=False, compare=False, repr=False)
    request_missing: Mapping[str, str] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        counted = [*self.containers, *(c for c in self.init_containers if c.restartable)]
        totals: dict[str, int] = {}
        missing: dict[str, str] = {}
        names: set[str] = set()
        for container in counted:
            names.update(container.requests)
        for resource in names:
            total = 0
            for container in counted:
                quantity = container.requests.get(resource)
                if quantity is None:
                    missing[resource] = container.name
                    break
                total += quantity.milli
            else:
                totals[resource] = total
        object.__setattr__(self, "request_totals", totals)
        object.__setattr__(self, "request_missing", missing)

    @property
    def counted_containers(self) -> tuple[Container, ...]:
        """Regular containers, then restartable init containers: whose requests count."""
        return (*self.containers, *(c for c in self.init_containers if c.restartable))


def _parse_container(raw: Any, path: str, *, init: bool) -> Container:
    obj = read_object(raw, path)
    resources = read_object(obj.get("resources") or {}, f"{path}.resources")
    return Container(
        name=read_str(obj, "name", path),
        requests=read_resource_list(resources, "requests", f"{path}.resources"),
        restartable=init and obj.get("restartPolicy") == "Always",
    )


def parse_pod(raw: Any, path: str) -> Pod:
    obj = read_object(raw, path)
    meta = read_object(obj.get("metadata") or {}, f"{path}.metadata")
    spec = read_object(obj.get("spec") or {}, f"{path}.spec")
    status = read_object(obj.get("status") or {}, f"{path}.status")
    ready = None
    for i, item in enumerate(read_list(status, "conditions", f"{path}.status") or []):
        where = f"{path}.status.conditions[{i}]"
        cond = read_object(item, where)
        if cond.get("type") == "Ready":  # podutil.GetPodCondition: the first one
            transition = read_optional_time(cond, "lastTransitionTime", where)
            ready = PodReadyCondition(status=read_str(cond, "status", where),
                                      last_transition_time=transition or GO_ZERO_TIME)
            break
    pod_resources = read_optional_object(spec, "resources", f"{path}.spec")
    pod_requests = None
    if pod_resources is not None and pod_resources.get("requests") is not None:
        pod_requests = read_resource_list(pod_resources, "requests", f"{path}.spec.resources")
    overhead = (read_resource_list(spec, "overhead", f"{path}.spec")
                if spec.get("overhead") is not None else None)
    return Pod(
        name=read_str(meta, "name", f"{path}.metadata", required=True),
        namespace=read_str(meta, "namespace", f"{path}.metadata"),
        labels=read_string_map(meta, "labels", f"{path}.metadata"),
        phase=read_str(status, "phase", f"{path}.status"),
        deletion_timestamp=read_optional_time(meta, "deletionTimestamp", f"{path}.metadata"),
        start_time=read_optional_time(status, "startTime", f"{path}.status"),
        ready=ready,
        containers=tuple(
            _parse_container(c, f"{path}.spec.containers[{i}]", init=False)
            for i, c in enumerate(read_list(spec, "containers", f"{path}.spec") or [])),
        init_containers=tuple(
            _parse_container(c, f"{path}.spec.initContainers[{i}]", init=True)
            for i, c in enumerate(read_list(spec, "initContainers", f"{path}.spec") or [])),
        pod_requests=pod_requests,
        overhead=overhead,
        controller=parse_controller_ref(meta, f"{path}.metadata"),
    )


def parse_pods(raw: Any, path: str = "pods") -> tuple[Pod, ...]:
    """A v1 PodList, or a plain list of Pods."""
    if isinstance(raw, Mapping):
        items = read_list(raw, "items", path)
        base = f"{path}.items"
        if items is None:
            items = []
    elif isinstance(raw, list | tuple):
        items, base = list(raw), path
    else:
        raise ModelError(path, f"must be a PodList or a list of Pods, not {kind_name(raw)}")
    return tuple(parse_pod(item, f"{base}[{i}]") for i, item in enumerate(items))


def pods_matching(pods: Iterable[Pod], selector: Selector, namespace: str) -> list[Pod]:
    """The pods a lister would return for this namespace and selector."""
    exact = selector.exact_labels()
    listed = []
    for pod in pods:
        if namespace and pod.namespace and pod.namespace != namespace:
            continue
        labels = pod.labels
        if exact is not None:
            for key, value in exact:
                if labels.get(key) != value:
                    break
            else:
                listed.append(pod)
        elif selector.matches(labels):
            listed.append(pod)
    return listed
