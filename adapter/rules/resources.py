"""Prometheus labels ↔ Kubernetes group-resources: the resource catalog, overrides and templates.

`ResourceCatalog` stands in for the REST mapper prometheus-adapter builds from discovery: an
immutable value, built from the cluster's discovery documents (or the built-in list), that
normalises `pod`/`Pods`/`deployment.apps` to the plural group-resource and knows each
resource's singular, kind, preferred version and real scope.

`ResourceMapper` is one rule's `resources:` block bound to a catalog. Directions, as upstream:
* label → resource: overrides first, else the template read backwards as `^…$` with
  `(?P<group>.+?)`/`(?P<resource>.+?)`, then normalised through the catalog (failures skip
  the label);
* resource → label: an override for that resource, else the template rendered with the
  singular resource and the group with `.`/`-` turned into `_`.
When several override labels name the same resource, the lexically smallest label is the one
queried (upstream leaves that to Go's random map order).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from adapter.rules.naming import RegexError, compile_re2
from adapter.rules.templating import (
    GoStruct,
    Template,
    TemplateExecutionError,
    TemplateSyntaxError,
    parse_template,
)
from metricscale.core.selectors import quote_go_string

__all__ = [
    "BUILTIN_RESOURCES",
    "NAMESPACES",
    "NODES",
    "PERSISTENT_VOLUMES",
    "PODS",
    "CustomMetricKey",
    "GroupResource",
    "LabelTemplate",
    "LabelTemplateError",
    "NoLabelForResourceError",
    "ResourceCatalog",
    "ResourceInfo",
    "ResourceMapper",
    "UnknownResourceError",
    "builtin_catalog",
    "compile_label_template",
    "is_promql_label_name",
]

_PROMQL_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def is_promql_label_name(name: str) -> bool:
    """A label name PromQL accepts unquoted (`[a-zA-Z_][a-zA-Z0-9_]*`)."""
    return _PROMQL_LABEL.fullmatch(name) is not None


class UnknownResourceError(LookupError):
    """The catalog has no resource by that name (REST mapper: no matches for kind/resource)."""


class NoLabelForResourceError(LookupError):
    """A rule cannot name the Prometheus label for a resource (no override, no template)."""


class LabelTemplateError(ValueError):
    """A `resources.template` that prometheus-adapter would refuse at startup."""


@dataclass(frozen=True, order=True)
class GroupResource:
    """`schema.GroupResource`; prints as `resource` or `resource.group`."""

    resource: str
    group: str = ""

    def __str__(self) -> str:
        return f"{self.resource}.{self.group}" if self.group else self.resource

    @classmethod
    def parse(cls, text: str) -> GroupResource:
        """`schema.ParseGroupResource`: split at the first `.` (`deployments.apps`)."""
        resource, _, group = text.partition(".")
        return cls(resource, group)


NAMESPACES = GroupResource("namespaces")
NODES = GroupResource("nodes")
PODS = GroupResource("pods")
PERSISTENT_VOLUMES = GroupResource("persistentvolumes")


@dataclass(frozen=True, order=True)
class CustomMetricKey:
    """A custom metric as the API names it: `<resource>[.<group>]/<metric>` plus its scope."""

    resource: GroupResource
    namespaced: bool
    metric: str

    @property
    def api_name(self) -> str:
        return f"{self.resource}/{self.metric}"


@dataclass(frozen=True)
class ResourceInfo:
    """One resource of the cluster (the preferred version of its group)."""

    resource: str
    singular: str
    kind: str
    group: str
    version: str
    namespaced: bool

    @property
    def group_resource(self) -> GroupResource:
        return GroupResource(self.resource, self.group)

    @property
    def api_version(self) -> str:
        """`v1` for the core group, `apps/v1` otherwise."""
        return f"{self.group}/{self.version}" if self.group else self.version


@dataclass(frozen=True)
class ResourceCatalog:
    """The REST mapper as a value. Earlier entries win ambiguous lookups (discovery order)."""

    entries: tuple[ResourceInfo, ...]
    _by_name: Mapping[str, tuple[ResourceInfo, ...]] = field(repr=False, compare=False)
    _by_group_resource: Mapping[GroupResource, ResourceInfo] = field(repr=False, compare=False)

    @classmethod
    def from_resources(cls, entries: Iterable[ResourceInfo]) -> ResourceCatalog:
        """Build from entries; a later duplicate of a group-resource is ignored."""
        kept: list[ResourceInfo] = []
        by_group_resource: dict[GroupResource, ResourceInfo] = {}
        by_name: dict[str, list[ResourceInfo]] = {}
        for entry in entries:
            if entry.group_resource in by_group_resource:
                continue
            by_group_resource[entry.group_resource] = entry
            kept.append(entry)
            for name in {entry.resource.lower(), entry.singular.lower(), entry.kind.lower()}:
                if name:
                    by_name.setdefault(name, []).append(entry)
        return cls(tuple(kept), {k: tuple(v) for k, v in by_name.items()}, by_group_resource)

    @classmethod
    def from_discovery(cls, resource_lists: Iterable[Mapping[str, Any]]) -> ResourceCatalog:
        """Build from `APIResourceList` documents (preferred versions first, core group first).

        Subresources (`pods/log`) are skipped; an empty `singularName` falls back to the
        lower-cased kind, as client-go's discovery REST mapper does.
        """
        entries: list[ResourceInfo] = []
        for document in resource_lists:
            group_version = str(document.get("groupVersion", ""))
            group, _, version = group_version.rpartition("/")
            for resource in document.get("resources") or ():
                name = str(resource.get("name", ""))
                if not name or "/" in name:
                    continue
                kind = str(resource.get("kind", ""))
                singular = str(resource.get("singularName") or kind.lower())
                entries.append(ResourceInfo(
                    resource=name, singular=singular, kind=kind, group=group, version=version,
                    namespaced=bool(resource.get("namespaced", False))))
        return cls.from_resources(entries)

    def __len__(self) -> int:
        return len(self.entries)

    def find(self, requested: GroupResource) -> ResourceInfo | None:
        """Normalise like `RESTMapper.ResourceFor`: plural, singular or kind, any case.

        An empty group means "any group": the first match in catalog order wins, so the core
        group beats `metrics.k8s.io` for `pods`.
        """
        candidates = self._by_name.get(requested.resource.lower(), ())
        group = requested.group.lower()
        for candidate in candidates:
            if not group or candidate.group.lower() == group:
                return candidate
        return None

    def normalize(self, requested: GroupResource) -> GroupResource:
        info = self.find(requested)
        if info is None:
            raise UnknownResourceError(f"the server doesn't have a resource type "
                                       f"{str(requested)!r}")
        return info.group_resource

    def info(self, group_resource: GroupResource) -> ResourceInfo | None:
        """The entry for an already normalised group-resource."""
        return self._by_group_resource.get(group_resource)

    def singular(self, resource: str) -> str:
        """`ResourceSingularizer`: the singular of a plural resource name (any group)."""
        for candidate in self._by_name.get(resource.lower(), ()):
            if candidate.resource == resource:
                return candidate.singular
        raise UnknownResourceError(f"no singular of resource {resource} has been defined")


def _core(resource: str, kind: str, *, namespaced: bool, singular: str = "") -> ResourceInfo:
    return ResourceInfo(resource, singular or kind.lower(), kind, "", "v1", namespaced)


def _grouped(resource: str, kind: str, group: str, version: str,
             *, namespaced: bool = True) -> ResourceInfo:
    return ResourceInfo(resource, kind.lower(), kind, group, version, namespaced)


# The resources every conformant cluster serves, in discovery order, for tools that run without
# a cluster (`--check-config`) and as a fallback; a running adapter uses the cluster's discovery.
BUILTIN_RESOURCES: tuple[ResourceInfo, ...] = (
    _core("pods", "Pod", namespaced=True),
    _core("services", "Service", namespaced=True),
    _core("endpoints", "Endpoints", namespaced=True, singular="endpoints"),
    _core("namespaces", "Namespace", namespaced=False),
    _core("nodes", "Node", namespaced=False),
    _core("persistentvolumes", "PersistentVolume", namespaced=False),
    _core("persistentvolumeclaims", "PersistentVolumeClaim", namespaced=True),
    _core("configmaps", "ConfigMap", namespaced=True),
    _core("secrets", "Secret", namespaced=True),
    _core("serviceaccounts", "ServiceAccount", namespaced=True),
    _core("replicationcontrollers", "ReplicationController", namespaced=True),
    _core("events", "Event", namespaced=True),
    _grouped("deployments", "Deployment", "apps", "v1"),
    _grouped("statefulsets", "StatefulSet", "apps", "v1"),
    _grouped("daemonsets", "DaemonSet", "apps", "v1"),
    _grouped("replicasets", "ReplicaSet", "apps", "v1"),
    _grouped("horizontalpodautoscalers", "HorizontalPodAutoscaler", "autoscaling", "v2"),
    _grouped("jobs", "Job", "batch", "v1"),
    _grouped("cronjobs", "CronJob", "batch", "v1"),
    _grouped("ingresses", "Ingress", "networking.k8s.io", "v1"),
    _grouped("networkpolicies", "NetworkPolicy", "networking.k8s.io", "v1"),
    _grouped("poddisruptionbudgets", "PodDisruptionBudget", "policy", "v1"),
    _grouped("storageclasses", "StorageClass", "storage.k8s.io", "v1", namespaced=False),
    _grouped("events", "Event", "events.k8s.io", "v1"),
)


def builtin_catalog() -> ResourceCatalog:
    return ResourceCatalog.from_resources(BUILTIN_RESOURCES)


# --- resources.template -----------------------------------------------------------------------

_GROUP_SANITIZER = str.maketrans({".": "_", "-": "_"})


@dataclass(frozen=True)
class LabelTemplate:
    """A parsed `resources.template` and the `^…$` regex that reads it backwards."""

    source: str
    template: Template
    regex: re.Pattern[str]

    def render(self, *, group: str, singular_resource: str) -> str:
        """The label for a resource: group sanitised (`networking_k8s_io`), resource singular."""
        data = GoStruct("schema.GroupResource", {
            "Group": group.translate(_GROUP_SANITIZER), "Resource": singular_resource})
        return self.template.render(data)

    def match(self, label: str) -> GroupResource | None:
        """The (un-normalised) group-resource a label spells, if it has the template's shape."""
        found = self.regex.fullmatch(label)
        if found is None:
            return None
        group = found.group("group") if "group" in self.regex.groupindex else ""
        return GroupResource(found.group("resource"), group or "")


def compile_label_template(source: str) -> LabelTemplate:
    """Parse a `resources.template`, refusing what `NewResourceConverter` refuses."""
    try:
        template = parse_template(source, name="resource-label")
    except TemplateSyntaxError as error:
        raise LabelTemplateError(f"unable to parse label template {_q(source)}: {error}") \
            from None
    data = GoStruct("schema.GroupResource",
                    {"Group": "(?P<group>.+?)", "Resource": "(?P<resource>.+?)"})
    prefix = f"unable to generate label format from template {_q(source)}: "
    try:
        rendered = template.render(data)
    except TemplateExecutionError as error:
        raise LabelTemplateError(f"{prefix}unable to convert label template to matcher: "
                                 f"{error}") from None
    if not rendered:
        raise LabelTemplateError(f"{prefix}unable to convert label template to matcher: "
                                 "empty template")
    try:
        regex = compile_re2("^" + rendered + "$")
    except RegexError as error:
        raise LabelTemplateError(f"{prefix}unable to convert label template to matcher: "
                                 f"{error}") from None
    if "resource" not in regex.groupindex:
        raise LabelTemplateError(f"{prefix}must include at least `{{{{.Resource}}}}` in the "
                                 "label template")
    return LabelTemplate(source, template, regex)


def _q(text: str) -> str:
    return quote_go_string(text)


# --- one rule's mapping -------------------------------------------------------------------------


@dataclass(frozen=True)
class ResourceMapper:
    """A rule's `resources` bound to a catalog: both directions of label ↔ resource."""

    template: LabelTemplate | None
    overrides: tuple[tuple[str, GroupResource], ...]
    catalog: ResourceCatalog
    problems: tuple[str, ...] = ()
    _label_to_resource: Mapping[str, GroupResource] = field(default_factory=dict, repr=False,
                                                            compare=False)
    _resource_to_label: Mapping[GroupResource, str] = field(default_factory=dict, repr=False,
                                                            compare=False)

    @classmethod
    def build(cls, *, template: LabelTemplate | None,
              overrides: Sequence[tuple[str, GroupResource]],
              catalog: ResourceCatalog) -> ResourceMapper:
        """Normalise the overrides through the catalog.

        Upstream exits at startup when an override names a resource the cluster lacks; here
        that override is dropped and reported in `problems`, so a missing CRD disables one
        mapping instead of the whole adapter.
        """
        normalized: list[tuple[str, GroupResource]] = []
        problems: list[str] = []
        for label, requested in overrides:
            info = catalog.find(requested)
            if info is None:
                problems.append(f"unable to normalize group-resource {requested} of override "
                                f"{label!r}: the cluster has no such resource; the label is "
                                "ignored")
                continue
            normalized.append((label, info.group_resource))
        label_to_resource = dict(normalized)
        resource_to_label: dict[GroupResource, str] = {}
        for label, group_resource in sorted(normalized):
            resource_to_label.setdefault(group_resource, label)
        return cls(template, tuple(normalized), catalog, tuple(problems), label_to_resource,
                   resource_to_label)

    def label_for_resource(self, group_resource: GroupResource) -> str:
        """`LabelForResource`: an override's label, else the template's rendering."""
        label = self._resource_to_label.get(group_resource)
        if label is not None:
            return label
        if self.template is None:
            raise NoLabelForResourceError(
                f"unable to convert resource {group_resource} into label: no generic resource "
                "label form specified for this metric")
        try:
            singular = self.catalog.singular(group_resource.resource)
        except UnknownResourceError as error:
            raise NoLabelForResourceError(
                f"unable to convert resource {group_resource} into label: unable to singularize "
                f"resource {group_resource}: {error}") from None
        try:
            label = self.template.render(group=group_resource.group, singular_resource=singular)
        except TemplateExecutionError as error:
            raise NoLabelForResourceError(
                f"unable to convert resource {group_resource} into label: {error}") from None
        if not label:
            raise NoLabelForResourceError(
                f"unable to convert resource {group_resource} into label: empty label produced "
                "by label template")
        return label

    def resource_for_label(self, label: str) -> GroupResource | None:
        """The normalised resource a label stands for, or None."""
        override = self._label_to_resource.get(label)
        if override is not None:
            return override
        if self.template is None:
            return None
        candidate = self.template.match(label)
        if candidate is None:
            return None
        info = self.catalog.find(candidate)
        return None if info is None else info.group_resource

    def resources_for_labels(self, labels: Iterable[str],
                             cache: dict[str, GroupResource | None] | None = None,
                             ) -> tuple[tuple[GroupResource, ...], bool]:
        """`ResourcesForSeries`: the resources a label-name set maps to, and upstream's flag.

        The flag is true as soon as one label is unmapped or maps to something other than
        namespaces, nodes or persistentvolumes; a label that fits the template but names no
        known resource does not count. `cache` memoises per-label answers across calls.
        """
        found: dict[GroupResource, None] = {}
        namespaced = False
        for label in sorted(labels):
            if cache is not None and label in cache:
                group_resource = cache[label]
            else:
                group_resource = self.resource_for_label(label)
                if cache is not None:
                    cache[label] = group_resource
            if group_resource is None:
                if self._label_is_skipped(label):
                    continue
                namespaced = True
                continue
            found[group_resource] = None
            if group_resource not in (NAMESPACES, NODES, PERSISTENT_VOLUMES):
                namespaced = True
        return tuple(found), namespaced

    def _label_is_skipped(self, label: str) -> bool:
        # A label shaped like the template whose resource normalisation failed is skipped
        # entirely by upstream (it neither maps nor sets the namespaced flag).
        return self.template is not None and label not in self._label_to_resource \
            and self.template.match(label) is not None
