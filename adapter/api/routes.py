"""Request paths of the metrics APIs, parsed into typed routes (no I/O, no registry).

`parse_route(raw_path, query_string)` takes the path exactly as it arrived (still
percent-encoded, so `%2F` inside a segment cannot split it) and returns what was asked for,
or a `RouteRejection` carrying the status the client gets (aggregation-contract.md §8.1, §9).
Every name is checked before any query is built: namespaces must be DNS-1123 labels, the names
of the built-in kinds follow their apimachinery validation (`_BUILT_IN_NAME_RULES`), and any
other name (metrics, CRD objects, kinds whose names are path segments) must be a valid path
segment (`path.IsValidPathSegmentName`: not `.` or `..`, no `/` or `%`; here also no `?`, no
U+FFFD and no control characters). A name that fails can never exist: 404 NotFound.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from adapter.api.groups import API_GROUP_VERSIONS, EXTERNAL_METRICS_GROUP, RESOURCE_METRICS_GROUP
from adapter.rules.resources import NAMESPACES, GroupResource
from metricscale.core.fields import FieldSelector, FieldSelectorError, parse_field_selector
from metricscale.core.selectors import Selector, SelectorError, parse_selector

__all__ = [
    "CustomMetricRoute",
    "ExternalMetricRoute",
    "GroupListRoute",
    "GroupRoute",
    "ResourceListRoute",
    "ResourceMetricsRoute",
    "Route",
    "RouteRejection",
    "parse_route",
]



@dataclass(frozen=True)
class GroupListRoute:
    """`GET /apis`."""


@dataclass(frozen=True)
class GroupRoute:
    """`GET /apis/<group>`."""

    group: str


@dataclass(frozen=True)
class ResourceListRoute:
    """`GET /apis/<group>/<version>` (discovery)."""

    group: str
    version: str


@dataclass(frozen=True)
class CustomMetricRoute:
    """A custom metric request.

    `resource` is as written (`pod`, `deployments.apps`): normalise it through the catalog.
    `name` None means `*` (select objects with `label_selector`). `namespace` is None for the
    root-scoped shapes and for a namespace's own metrics (`namespaces/{ns}/metrics/{metric}`,
    where `resource` is namespaces and `name` is the namespace).
    """

    version: str
    resource: GroupResource
    namespace: str | None
    name: str | None
    metric: str
    label_selector: Selector
    metric_selector: Selector
    namespace_metric: bool = False


@dataclass(frozen=True)
class ExternalMetricRoute:
    """`GET /apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/{metric}`."""

    namespace: str
    metric: str
    selector: Selector


@dataclass(frozen=True)
class ResourceMetricsRoute:
    """A `metrics.k8s.io/v1beta1` request: `kind` is `pods` or `nodes`.

    `namespace` None for nodes and for all namespaces' pods; `name` None for a list.
    """

    kind: str
    namespace: str | None
    name: str | None
    label_selector: Selector
    field_selector: FieldSelector


# Fields each kind can be selected by: the generic apiserver's metadata fields, plus a pod's
# node (`kubectl top pods --field-selector spec.nodeName=...`) and phase (always Running here).
RESOURCE_METRICS_FIELDS: Mapping[str, tuple[str, ...]] = {
    "pods": ("metadata.name", "metadata.namespace", "spec.nodeName", "status.phase"),
    "nodes": ("metadata.name",),
}


@dataclass(frozen=True)
class RouteRejection:
    """The request cannot be served: answer `code` with this reason and message."""

    code: int
    reason: str
    message: str


Route = (GroupListRoute | GroupRoute | ResourceListRoute | CustomMetricRoute
         | ExternalMetricRoute | ResourceMetricsRoute | RouteRejection)

_NOT_FOUND = RouteRejection(404, "NotFound", "the server could not find the requested resource")
_INVALID_PATH = RouteRejection(400, "BadRequest", "invalid request path")
_ALL_NAMESPACES = RouteRejection(
    400, "BadRequest", 'namespace "*" is not supported: request one namespace at a time')
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


class _Rejected(Exception):
    def __init__(self, rejection: RouteRejection) -> None:
        super().__init__(rejection.message)
        self.rejection = rejection


def _decode(segment: str) -> str:
    if _BAD_ESCAPE.search(segment):
        raise _Rejected(_INVALID_PATH)
    try:
        return urllib.parse.unquote(segment, errors="strict")
    except UnicodeDecodeError:
        raise _Rejected(_INVALID_PATH) from None


_DNS1123_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
_DNS1035_LABEL = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(
    r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*")
# Control characters (Cc), the replacement character (what a lossy decoder leaves behind)
# and the path separators: no Kubernetes name of any kind holds these.
_NEVER_IN_A_NAME = re.compile("[\x00-\x1f\x7f-\x9f\ufffd/%?]")


def _is_path_segment(text: str) -> bool:
    return True  # `_name` has checked it already


def _is_subdomain(text: str) -> bool:
    return len(text) <= 253 and _DNS1123_SUBDOMAIN.fullmatch(text) is not None


def _is_label(text: str) -> bool:
    return _DNS1123_LABEL.fullmatch(text) is not None


def _is_dns1035_label(text: str) -> bool:
    return _DNS1035_LABEL.fullmatch(text) is not None


# The built-in kinds whose names apimachinery validates other than as DNS-1123 subdomains, by
# every way a request may write the resource (plural, singular, short name) and its group.
# Every kind not listed, custom resources included (apiextensions-apiserver validates their
# names as DNS-1123 subdomains), is a subdomain; RBAC objects alone allow any path segment.
_BUILT_IN_NAME_RULES: Mapping[tuple[str, str], Callable[[str], bool]] = {
    **{(resource, group): _is_label
       for resource in ("namespaces", "namespace", "ns") for group in ("", "core")},
    **{(resource, group): _is_dns1035_label
       for resource in ("services", "service", "svc") for group in ("", "core")},
    **{(resource, group): _is_path_segment
       for resource in ("roles", "role", "rolebindings", "rolebinding", "clusterroles",
                        "clusterrole", "clusterrolebindings", "clusterrolebinding")
       for group in ("rbac.authorization.k8s.io",)},
    **{(resource, group): _is_subdomain
       for resources, groups in (
           (("pods", "pod", "po", "nodes", "node", "no", "configmaps", "configmap", "cm",
             "secrets", "secret", "persistentvolumeclaims", "persistentvolumeclaim", "pvc",
             "persistentvolumes", "persistentvolume", "pv", "endpoints", "replicationcontrollers",
             "replicationcontroller", "rc", "serviceaccounts", "serviceaccount", "sa"),
            ("", "core")),
           (("deployments", "deployment", "deploy", "statefulsets", "statefulset", "sts",
             "replicasets", "replicaset", "rs", "daemonsets", "daemonset", "ds"),
            ("", "apps")),
           (("jobs", "job", "cronjobs", "cronjob", "cj"), ("", "batch")),
           (("ingresses", "ingress", "ing"), ("", "networking.k8s.io")),
       )
       for resource in resources for group in groups},
}


def _name(text: str) -> str:
    """A metric name, or the name of an object of a kind not validated further: a path
    segment that some object could carry; anything else can never exist (404)."""
    if not text or text in (".", "..") or _NEVER_IN_A_NAME.search(text) is not None:
        raise _Rejected(_NOT_FOUND)
    return text


def _namespace(text: str) -> str:
    """A namespace's name: a DNS-1123 label (404 otherwise, like any name that cannot exist)."""
    if not _is_label(text):
        raise _Rejected(_NOT_FOUND)
    return text


def _object_name(resource: GroupResource, text: str) -> str:
    """An object's name, by the validation of its kind: a DNS-1123 subdomain unless the kind
    validates names otherwise (namespaces, services, RBAC objects)."""
    rule = _BUILT_IN_NAME_RULES.get((resource.resource.lower(), resource.group.lower()),
                                    _is_subdomain)
    _name(text)
    if not rule(text):
        raise _Rejected(_NOT_FOUND)
    return text


def _query(query_string: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for key, value in urllib.parse.parse_qsl(query_string, keep_blank_values=True):
        values.setdefault(key, value)  # the first occurrence wins, as Go's Query().Get
    return values


def _selector(text: str) -> Selector:
    try:
        return parse_selector(text)
    except SelectorError as error:
        raise _Rejected(RouteRejection(400, "BadRequest", str(error))) from None


def parse_route(raw_path: str, query_string: str = "", *,
                groups: Mapping[str, tuple[str, ...]] = API_GROUP_VERSIONS) -> Route | None:
    """Parse a request path; None when it is not under `/apis` or names a group not in
    `groups` (the groups served, with their versions)."""
    path = raw_path.split("?", 1)[0]
    if not path.startswith("/"):
        return None
    segments = path[1:].split("/")
    if segments[0] != "apis":
        return None
    # A trailing slash is accepted on the discovery paths only (/apis/, /apis/g/, /apis/g/v/).
    if len(segments) <= 4 and len(segments) > 1 and segments[-1] == "":
        segments = segments[:-1]
    try:
        return _route(segments[1:], _query(query_string), groups)
    except _Rejected as rejected:
        return rejected.rejection


def _route(segments: list[str], query: dict[str, str],
           groups: Mapping[str, tuple[str, ...]]) -> Route | None:
    if not segments:
        return GroupListRoute()
    group = _decode(segments[0])
    versions = groups.get(group)
    if versions is None:
        return None
    if len(segments) == 1:
        return GroupRoute(group)
    version = _decode(segments[1])
    if version not in versions:
        return _NOT_FOUND
    rest = [_decode(segment) for segment in segments[2:]]
    if not rest:
        return ResourceListRoute(group, version)
    if group == EXTERNAL_METRICS_GROUP:
        return _external(rest, query)
    if group == RESOURCE_METRICS_GROUP:
        return _resource_metrics(rest, query)
    return _custom(version, rest=rest, query=query)


def _resource_metrics(rest: list[str], query: dict[str, str]) -> Route:
    """`nodes[/{name}]`, `pods`, `namespaces/{ns}/pods[/{name}]`."""
    namespace: str | None = None
    if rest[0] == "namespaces":
        if len(rest) < 3 or rest[2] != "pods" or len(rest) > 4:
            return _NOT_FOUND
        namespace = _namespace(rest[1])
        rest = rest[2:]
    kind = rest[0]
    if kind not in RESOURCE_METRICS_FIELDS or len(rest) > 2 or (
            kind == "nodes" and namespace is not None):
        return _NOT_FOUND
    name = _object_name(GroupResource(kind), rest[1]) if len(rest) == 2 else None
    if kind == "pods" and name is not None and namespace is None:
        return _NOT_FOUND  # a pod is always named within its namespace
    try:
        fields = parse_field_selector(query.get("fieldSelector", ""))
    except FieldSelectorError as error:
        raise _Rejected(RouteRejection(400, "BadRequest", str(error))) from None
    known = RESOURCE_METRICS_FIELDS[kind]
    unsupported = fields.unsupported(known)
    if unsupported is not None:
        only = ", ".join(f'"{key}"' for key in known)
        raise _Rejected(RouteRejection(
            400, "BadRequest", f'"{unsupported}" is not a known field selector: only {only}'))
    return ResourceMetricsRoute(kind, namespace, name,
                                _selector(query.get("labelSelector", "")), fields)


def _external(rest: list[str], query: dict[str, str]) -> Route:
    if len(rest) != 3 or rest[0] != "namespaces":
        return _NOT_FOUND
    if rest[1] == "*":
        return _ALL_NAMESPACES
    namespace, metric = _namespace(rest[1]), _name(rest[2])
    return ExternalMetricRoute(namespace, metric, _selector(query.get("labelSelector", "")))


def _custom(version: str, *, rest: list[str], query: dict[str, str]) -> Route:
    metric_selector = _selector(query.get("metricLabelSelector", ""))
    if rest[0] == "namespaces":
        if len(rest) == 3:
            return _INVALID_PATH  # `namespaces/{ns}/metrics`, `namespaces/*/{metric}`
        if len(rest) == 4:
            if rest[2] != "metrics":
                return _NOT_FOUND
            metric = _name(rest[3])
            if rest[1] == "*":
                return CustomMetricRoute(version, NAMESPACES, None, None, metric,
                                         _selector(query.get("labelSelector", "")),
                                         metric_selector, namespace_metric=True)
            return CustomMetricRoute(version, NAMESPACES, None, _namespace(rest[1]), metric,
                                     Selector(), metric_selector, namespace_metric=True)
        if len(rest) != 5:
            return _NOT_FOUND
        if rest[1] == "*":
            return _ALL_NAMESPACES
        namespace = _namespace(rest[1])
        resource_text, name_text, metric_text = rest[2:]
    elif len(rest) == 3:
        namespace = None
        resource_text, name_text, metric_text = rest
    else:
        return _NOT_FOUND
    resource = GroupResource.parse(_name(resource_text))
    if not resource.resource:
        return _NOT_FOUND
    metric = _name(metric_text)
    if name_text == "*":
        return CustomMetricRoute(version, resource, namespace, None, metric,
                                 _selector(query.get("labelSelector", "")), metric_selector)
    return CustomMetricRoute(version, resource, namespace, _object_name(resource, name_text),
                             metric, Selector(), metric_selector)
