"""The resource types the fake serves: built-in kinds, CRD kinds, and version conversions.

Conversions join versions that share one storage: autoscaling/v1<->v2 HPAs and core<->
events.k8s.io Events.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from testbed.fakes.kube_errors import GroupKind, GroupResource
from testbed.fakes.kube_schema import StructuralSchema

JSONDict = dict[str, Any]

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
NO_COLLECTION_DELETE = ("create", "delete", "get", "list", "patch", "update", "watch")
SUBRESOURCE_VERBS = ("get", "patch", "update")


@dataclass(frozen=True)
class ScaleSpec:
    """Where a kind keeps the numbers of its `scale` subresource (CRD `subresources.scale`)."""

    spec_replicas_path: str = ".spec.replicas"
    status_replicas_path: str = ".status.replicas"
    # None: no selector; for built-ins `spec.selector` is a LabelSelector object, for CRDs the
    # path names a string already in selector form.
    label_selector_path: str | None = None
    selector_is_object: bool = False


@dataclass(frozen=True)
class VersionInfo:
    status: bool
    scale: ScaleSpec | None
    schema: StructuralSchema | None = None  # CRDs only; built-ins use the OpenAPI definitions
    # A CRD version's additionalPrinterColumns (what its Table shows besides the name).
    printer_columns: tuple[Mapping[str, Any], ...] = ()


Converter = Callable[[JSONDict, str], JSONDict]


def _set_api_version(group: str) -> Converter:
    def convert(obj: JSONDict, version: str) -> JSONDict:
        out = copy.deepcopy(obj)
        api_version = f"{group}/{version}" if group else version
        return {"apiVersion": api_version, **{k: v for k, v in out.items()
                                               if k != "apiVersion"}}
    return convert


@dataclass(frozen=True)
class ResourceType:
    group: str
    resource: str
    kind: str
    singular: str
    namespaced: bool
    versions: Mapping[str, VersionInfo]  # served versions, preferred first
    verbs: tuple[str, ...] = ALL_VERBS
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    builtin: bool = True
    # Storage shared by several group/resources (Events) is keyed by this one.
    storage: GroupResource | None = None
    # "none" | "spec" | "spec+annotations" | "all" (all but metadata and, with status, status)
    generation: str = "none"
    return_deleted_object: bool = False
    field_labels: tuple[str, ...] = ()
    # Field labels whose value lives elsewhere in the stored object: (label, stored path).
    field_label_paths: tuple[tuple[str, str], ...] = ()
    virtual: bool = False  # create-only reviews, never stored
    to_version: Converter | None = None
    from_version: Converter | None = None
    list_kind: str = ""

    @property
    def group_resource(self) -> GroupResource:
        return GroupResource(self.group, self.resource)

    @property
    def group_kind(self) -> GroupKind:
        return GroupKind(self.group, self.kind)

    @property
    def storage_key(self) -> GroupResource:
        return self.storage or self.group_resource

    @property
    def preferred_version(self) -> str:
        return next(iter(self.versions))

    def api_version(self, version: str) -> str:
        return f"{self.group}/{version}" if self.group else version

    def has_status(self, version: str) -> bool:
        return self.versions[version].status

    def scale(self, version: str) -> ScaleSpec | None:
        return self.versions[version].scale

    def convert_to(self, stored: JSONDict, version: str) -> JSONDict:
        """The stored object as the client of `version` sees it."""
        converter = self.to_version or _set_api_version(self.group)
        out = converter(stored, version)
        out.setdefault("kind", self.kind)
        out["kind"] = self.kind
        return out

    def convert_from(self, obj: JSONDict, version: str) -> JSONDict:
        """An object of `version` in the storage form."""
        converter = self.from_version or _set_api_version(self.group)
        return converter(obj, version)


def _builtin(group: str, resource: str, kind: str, *, namespaced: bool,
             versions: Iterable[str] = ("v1",), status: bool = False,
             scale: ScaleSpec | None = None, **kwargs: Any) -> ResourceType:
    info = VersionInfo(status=status, scale=scale)
    return ResourceType(group=group, resource=resource, kind=kind, singular=kind.lower(),
                        namespaced=namespaced, versions={v: info for v in versions}, **kwargs)


# --- Conversions -------------------------------------------------------------------------------

_EVENT_FIELDS = {  # events.k8s.io/v1 name -> core/v1 name
    "regarding": "involvedObject",
    "note": "message",
    "reportingController": "reportingComponent",
    "deprecatedSource": "source",
    "deprecatedFirstTimestamp": "firstTimestamp",
    "deprecatedLastTimestamp": "lastTimestamp",
    "deprecatedCount": "count",
}


def _events_to_version(stored: JSONDict, version: str) -> JSONDict:
    out: JSONDict = {"apiVersion": f"events.k8s.io/{version}"}
    reverse = {core: new for new, core in _EVENT_FIELDS.items()}
    for key, value in stored.items():
        if key == "apiVersion":
            continue
        out[reverse.get(key, key)] = copy.deepcopy(value)
    return out


def _events_from_version(obj: JSONDict, version: str) -> JSONDict:
    out: JSONDict = {"apiVersion": "v1"}
    for key, value in obj.items():
        if key == "apiVersion":
            continue
        out[_EVENT_FIELDS.get(key, key)] = copy.deepcopy(value)
    return out


_HPA_ANNOTATIONS = {
    "metrics": "autoscaling.alpha.kubernetes.io/metrics",
    "currentMetrics": "autoscaling.alpha.kubernetes.io/current-metrics",
    "conditions": "autoscaling.alpha.kubernetes.io/conditions",
    "behavior": "autoscaling.alpha.kubernetes.io/behavior",
}


def _is_cpu_utilization(metric: Any, *, target: bool) -> bool:
    if not isinstance(metric, dict) or metric.get("type") != "Resource":
        return False
    resource = metric.get("resource") or {}
    part = resource.get("target" if target else "current") or {}
    if resource.get("name") != "cpu":
        return False
    return "averageUtilization" in part and (not target or part.get("type") == "Utilization")


def _hpa_to_version(stored: JSONDict, version: str) -> JSONDict:
    """autoscaling/v2 (storage) -> v1, keeping what v1 cannot say in annotations, as upstream."""
    if version == "v2":
        return _set_api_version("autoscaling")(stored, version)
    obj = copy.deepcopy(stored)
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    metadata = obj.setdefault("metadata", {})
    annotations = dict(metadata.get("annotations") or {})
    metrics = spec.get("metrics") or []
    cpu = next((m for m in metrics if _is_cpu_utilization(m, target=True)), None)
    others = [m for m in metrics if m is not cpu]
    v1_spec: JSONDict = {k: spec[k] for k in ("scaleTargetRef", "minReplicas", "maxReplicas")
                         if k in spec}
    if cpu is not None:
        v1_spec["targetCPUUtilizationPercentage"] = cpu["resource"]["target"]["averageUtilization"]
    if others:
        annotations[_HPA_ANNOTATIONS["metrics"]] = json.dumps(others, separators=(",", ":"))
    if spec.get("behavior"):
        annotations[_HPA_ANNOTATIONS["behavior"]] = json.dumps(spec["behavior"],
                                                               separators=(",", ":"))
    current = status.get("currentMetrics") or []
    current_cpu = next((m for m in current if _is_cpu_utilization(m, target=False)), None)
    v1_status: JSONDict = {k: status[k] for k in ("observedGeneration", "lastScaleTime",
                                                  "currentReplicas", "desiredReplicas")
                           if k in status}
    if current_cpu is not None:
        v1_status["currentCPUUtilizationPercentage"] = (
            current_cpu["resource"]["current"]["averageUtilization"])
    other_current = [m for m in current if m is not current_cpu]
    if other_current:
        annotations[_HPA_ANNOTATIONS["currentMetrics"]] = json.dumps(other_current,
                                                                     separators=(",", ":"))
    if status.get("conditions"):
        annotations[_HPA_ANNOTATIONS["conditions"]] = json.dumps(status["conditions"],
                                                                 separators=(",", ":"))
    if annotations:
        metadata["annotations"] = annotations
    out: JSONDict = {"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
                     "metadata": metadata, "spec": v1_spec}
    if "desiredReplicas" in v1_status or v1_status:
        v1_status.setdefault("currentReplicas", 0)
        v1_status.setdefault("desiredReplicas", 0)
        out["status"] = v1_status
    return out


def _hpa_from_version(obj: JSONDict, version: str) -> JSONDict:
    if version == "v2":
        return _set_api_version("autoscaling")(obj, version)
    obj = copy.deepcopy(obj)
    metadata = obj.setdefault("metadata", {})
    annotations = dict(metadata.get("annotations") or {})

    def take(name: str) -> Any:
        raw = annotations.pop(_HPA_ANNOTATIONS[name], None)
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return None

    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    metrics: list[Any] = []
    if spec.get("targetCPUUtilizationPercentage") is not None:
        metrics.append({"type": "Resource", "resource": {"name": "cpu", "target": {
            "type": "Utilization",
            "averageUtilization": spec["targetCPUUtilizationPercentage"]}}})
    metrics.extend(take("metrics") or [])
    v2_spec: JSONDict = {k: spec[k] for k in ("scaleTargetRef", "minReplicas", "maxReplicas")
                         if k in spec}
    if metrics:
        v2_spec["metrics"] = metrics
    behavior = take("behavior")
    if behavior:
        v2_spec["behavior"] = behavior
    current: list[Any] = []
    if status.get("currentCPUUtilizationPercentage") is not None:
        current.append({"type": "Resource", "resource": {"name": "cpu", "current": {
            "averageUtilization": status["currentCPUUtilizationPercentage"]}}})
    current.extend(take("currentMetrics") or [])
    conditions = take("conditions")
    v2_status: JSONDict = {k: status[k] for k in ("observedGeneration", "lastScaleTime",
                                                  "currentReplicas", "desiredReplicas")
                           if k in status}
    if current:
        v2_status["currentMetrics"] = current
    if conditions:
        v2_status["conditions"] = conditions
    if annotations:
        metadata["annotations"] = annotations
    else:
        metadata.pop("annotations", None)
    out: JSONDict = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                     "metadata": metadata, "spec": v2_spec}
    if v2_status:
        out["status"] = v2_status
    return out


# --- The built-in catalog -----------------------------------------------------------------------

POD_FIELD_LABELS = ("spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
                    "spec.serviceAccountName", "spec.hostNetwork", "status.phase",
                    "status.podIP", "status.nominatedNodeName")
EVENT_FIELD_LABELS = ("involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                      "involvedObject.uid", "involvedObject.apiVersion",
                      "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason",
                      "reportingComponent", "source", "type")
# pkg/apis/events/v1/conversion.go: the field selectors of events.k8s.io/v1, over the core
# Event it stores.
EVENTS_V1_FIELD_LABEL_PATHS = (
    ("reason", "reason"), ("regarding.kind", "involvedObject.kind"),
    ("regarding.namespace", "involvedObject.namespace"),
    ("regarding.name", "involvedObject.name"), ("regarding.uid", "involvedObject.uid"),
    ("regarding.apiVersion", "involvedObject.apiVersion"),
    ("regarding.resourceVersion", "involvedObject.resourceVersion"),
    ("regarding.fieldPath", "involvedObject.fieldPath"),
    ("reportingController", "reportingComponent"), ("type", "type"))
_WORKLOAD_SCALE = ScaleSpec(label_selector_path=".spec.selector", selector_is_object=True)


def builtin_resources() -> list[ResourceType]:
    core: list[ResourceType] = [
        _builtin("", "pods", "Pod", namespaced=True, status=True, short_names=("po",),
                 categories=("all",), return_deleted_object=True, field_labels=POD_FIELD_LABELS),
        _builtin("", "namespaces", "Namespace", namespaced=False, status=True,
                 verbs=NO_COLLECTION_DELETE, short_names=("ns",), return_deleted_object=True,
                 field_labels=("status.phase",)),
        _builtin("", "nodes", "Node", namespaced=False, status=True, short_names=("no",),
                 field_labels=("spec.unschedulable",)),
        _builtin("", "services", "Service", namespaced=True, status=True, short_names=("svc",),
                 categories=("all",), return_deleted_object=True),
        _builtin("", "configmaps", "ConfigMap", namespaced=True, short_names=("cm",)),
        _builtin("", "secrets", "Secret", namespaced=True, field_labels=("type",)),
        _builtin("", "events", "Event", namespaced=True, short_names=("ev",),
                 field_labels=EVENT_FIELD_LABELS),
        _builtin("", "endpoints", "Endpoints", namespaced=True, short_names=("ep",)),
        _builtin("", "serviceaccounts", "ServiceAccount", namespaced=True, short_names=("sa",),
                 return_deleted_object=True),
    ]
    apps = [
        _builtin("apps", "deployments", "Deployment", namespaced=True, status=True,
                 scale=_WORKLOAD_SCALE, short_names=("deploy",), categories=("all",),
                 generation="spec+annotations"),
        _builtin("apps", "statefulsets", "StatefulSet", namespaced=True, status=True,
                 scale=_WORKLOAD_SCALE, short_names=("sts",), categories=("all",),
                 generation="spec"),
        _builtin("apps", "replicasets", "ReplicaSet", namespaced=True, status=True,
                 scale=_WORKLOAD_SCALE, short_names=("rs",), categories=("all",),
                 generation="spec", field_labels=("status.replicas",)),
    ]
    others = [
        _builtin("autoscaling", "horizontalpodautoscalers", "HorizontalPodAutoscaler",
                 namespaced=True, status=True, versions=("v2", "v1"), short_names=("hpa",),
                 categories=("all",), generation="spec", to_version=_hpa_to_version,
                 from_version=_hpa_from_version),
        _builtin("coordination.k8s.io", "leases", "Lease", namespaced=True),
        _builtin("events.k8s.io", "events", "Event", namespaced=True, short_names=("ev",),
                 storage=GroupResource("", "events"),
                 field_labels=tuple(label for label, _ in EVENTS_V1_FIELD_LABEL_PATHS),
                 field_label_paths=EVENTS_V1_FIELD_LABEL_PATHS,
                 to_version=_events_to_version, from_version=_events_from_version),
        _builtin("apiextensions.k8s.io", "customresourcedefinitions", "CustomResourceDefinition",
                 namespaced=False, status=True, short_names=("crd", "crds"),
                 categories=("api-extensions",), generation="spec",
                 return_deleted_object=True),
        _builtin("apiregistration.k8s.io", "apiservices", "APIService", namespaced=False,
                 status=True, categories=("api-extensions",)),
        _builtin("authentication.k8s.io", "tokenreviews", "TokenReview", namespaced=False,
                 verbs=("create",), virtual=True),
        _builtin("authentication.k8s.io", "selfsubjectreviews", "SelfSubjectReview",
                 namespaced=False, verbs=("create",), virtual=True),
        _builtin("authorization.k8s.io", "subjectaccessreviews", "SubjectAccessReview",
                 namespaced=False, verbs=("create",), virtual=True),
        _builtin("authorization.k8s.io", "selfsubjectaccessreviews", "SelfSubjectAccessReview",
                 namespaced=False, verbs=("create",), virtual=True),
    ]
    return core + apps + others


# kube-apiserver's built-in group/version priorities (aggregator `apiVersionPriorities`).
BUILTIN_PRIORITIES: dict[tuple[str, str], tuple[int, int]] = {
    ("", "v1"): (18000, 1),
    ("apiregistration.k8s.io", "v1"): (17900, 15),
    ("apps", "v1"): (17800, 15),
    ("events.k8s.io", "v1"): (17750, 15),
    ("authentication.k8s.io", "v1"): (17700, 15),
    ("authorization.k8s.io", "v1"): (17600, 15),
    ("autoscaling", "v2"): (17500, 30),
    ("autoscaling", "v1"): (17500, 15),
    ("apiextensions.k8s.io", "v1"): (16700, 15),
    ("coordination.k8s.io", "v1"): (16500, 15),
}


# --- CRD-defined kinds -----------------------------------------------------------------------


def resource_type_from_crd(crd: Mapping[str, Any]) -> ResourceType:
    """The kind a CustomResourceDefinition serves (served versions, storage version first)."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group = spec.get("group", "")
    versions: dict[str, VersionInfo] = {}
    served = [v for v in spec.get("versions") or [] if v.get("served")]
    # Discovery lists versions by kube-aware priority; the CRD order is close enough for CRDs
    # that declare their newest version first, and the storage version is listed first here.
    served.sort(key=lambda v: not v.get("storage"))
    for version in served:
        subresources = version.get("subresources") or {}
        scale = subresources.get("scale")
        versions[version["name"]] = VersionInfo(
            status="status" in subresources,
            scale=ScaleSpec(
                spec_replicas_path=scale.get("specReplicasPath", ""),
                status_replicas_path=scale.get("statusReplicasPath", ""),
                label_selector_path=scale.get("labelSelectorPath"),
            ) if scale is not None else None,
            schema=StructuralSchema((version.get("schema") or {}).get("openAPIV3Schema")),
            printer_columns=tuple(version.get("additionalPrinterColumns") or ()),
        )
    return ResourceType(
        group=group,
        resource=names.get("plural", ""),
        kind=names.get("kind", ""),
        singular=names.get("singular") or names.get("kind", "").lower(),
        namespaced=spec.get("scope") == "Namespaced",
        versions=versions,
        verbs=ALL_VERBS,
        short_names=tuple(names.get("shortNames") or ()),
        categories=tuple(names.get("categories") or ()),
        builtin=False,
        generation="all",
        list_kind=names.get("listKind") or f"{names.get('kind', '')}List",
    )


@dataclass
class ResourceRegistry:
    """Every served resource type, by group/version/resource and by storage key."""

    types: list[ResourceType] = field(default_factory=builtin_resources)

    def add(self, resource_type: ResourceType) -> None:
        self.remove(resource_type.group, resource_type.resource)
        self.types.append(resource_type)

    def remove(self, group: str, resource: str) -> None:
        self.types = [t for t in self.types
                      if not (t.group == group and t.resource == resource and not t.builtin)]

    def resolve(self, group: str, version: str, resource: str) -> ResourceType | None:
        for resource_type in self.types:
            if (resource_type.group == group and resource_type.resource == resource
                    and version in resource_type.versions):
                return resource_type
        return None

    def group_versions(self) -> dict[str, list[str]]:
        """Served group -> versions (each type's own preference order)."""
        out: dict[str, list[str]] = {}
        for resource_type in self.types:
            versions = out.setdefault(resource_type.group, [])
            for version in resource_type.versions:
                if version not in versions:
                    versions.append(version)
        return out

    def in_group_version(self, group: str, version: str) -> list[ResourceType]:
        return [t for t in self.types if t.group == group and version in t.versions]

    def sharing_storage(self, key: GroupResource) -> list[ResourceType]:
        return [t for t in self.types if t.storage_key == key]
