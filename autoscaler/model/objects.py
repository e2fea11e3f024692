"""The HorizontalPodAutoscaler and Autoscaler objects: metadata, spec and status together."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autoscaler.model.fields import (
    ModelError,
    join_path,
    read_int,
    read_object,
    read_str,
    read_string_map,
)
from autoscaler.model.spec import (
    AutoscalerSpec,
    parse_spec,
    render_spec,
)
from autoscaler.model.status import (
    AutoscalerStatus,
    parse_status,
    render_status,
)

__all__ = [
    "AUTOSCALER_API_VERSION",
    "AUTOSCALER_KIND",
    "HPA_API_VERSION",
    "HPA_KIND",
    "Autoscaler",
    "ObjectMeta",
    "parse_autoscaler",
    "render_autoscaler",
]


HPA_API_VERSION = "autoscaling/v2"
HPA_KIND = "HorizontalPodAutoscaler"
AUTOSCALER_API_VERSION = "metricscale.dev/v1alpha1"
AUTOSCALER_KIND = "Autoscaler"


ANNOTATION_PREFIX = "metricscale.dev/"


@dataclass(frozen=True)
class ObjectMeta:
    name: str
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    generation: int | None = None
    # metricscale's own annotations (`metricscale.dev/...`), sorted; others are not kept.
    annotations: tuple[tuple[str, str], ...] = ()

    def annotation(self, key: str) -> str | None:
        return next((value for name, value in self.annotations if name == key), None)


@dataclass(frozen=True)
class Autoscaler:
    """An autoscaling/v2 HorizontalPodAutoscaler or a metricscale.dev/v1alpha1 Autoscaler."""

    api_version: str
    kind: str
    metadata: ObjectMeta
    spec: AutoscalerSpec
    status: AutoscalerStatus = field(default_factory=AutoscalerStatus)

    @property
    def key(self) -> str:
        return f"{self.metadata.namespace}/{self.metadata.name}"


def _parse_meta(raw: Any, path: str) -> ObjectMeta:
    obj = read_object(raw if raw is not None else {}, path)
    annotations = read_string_map(obj, "annotations", path)
    return ObjectMeta(
        name=read_str(obj, "name", path),
        namespace=read_str(obj, "namespace", path),
        uid=read_str(obj, "uid", path),
        resource_version=read_str(obj, "resourceVersion", path),
        generation=read_int(obj, "generation", path, bits=64),
        annotations=tuple(sorted((k, v) for k, v in annotations.items()
                                 if k.startswith(ANNOTATION_PREFIX))),
    )


def parse_autoscaler(raw: Any, path: str = "") -> Autoscaler:
    """An HPA or Autoscaler object from the wire, with the API server's defaults applied."""
    obj = read_object(raw, path or "autoscaler")
    api_version = read_str(obj, "apiVersion", path)
    kind = read_str(obj, "kind", path)
    accepted = {(HPA_API_VERSION, HPA_KIND), (AUTOSCALER_API_VERSION, AUTOSCALER_KIND)}
    if (api_version, kind) not in accepted:
        raise ModelError(
            join_path(path, "kind") if api_version in {HPA_API_VERSION, AUTOSCALER_API_VERSION}
            else join_path(path, "apiVersion"),
            f"expected {HPA_API_VERSION} {HPA_KIND} or {AUTOSCALER_API_VERSION} "
            f"{AUTOSCALER_KIND}, got {api_version or '(none)'} {kind or '(none)'}")
    return Autoscaler(
        api_version=api_version,
        kind=kind,
        metadata=_parse_meta(obj.get("metadata"), join_path(path, "metadata")),
        spec=parse_spec(obj.get("spec"), join_path(path, "spec")),
        status=parse_status(obj.get("status"), join_path(path, "status")),
    )


def render_autoscaler(autoscaler: Autoscaler) -> dict[str, Any]:
    """The whole object in the wire format."""
    meta: dict[str, Any] = {"name": autoscaler.metadata.name}
    if autoscaler.metadata.namespace:
        meta["namespace"] = autoscaler.metadata.namespace
    if autoscaler.metadata.uid:
        meta["uid"] = autoscaler.metadata.uid
    if autoscaler.metadata.resource_version:
        meta["resourceVersion"] = autoscaler.metadata.resource_version
    if autoscaler.metadata.generation is not None:
        meta["generation"] = autoscaler.metadata.generation
    if autoscaler.metadata.annotations:
        meta["annotations"] = dict(autoscaler.metadata.annotations)
    return {
        "apiVersion": autoscaler.api_version,
        "kind": autoscaler.kind,
        "metadata": meta,
        "spec": render_spec(autoscaler.spec),
        "status": render_status(autoscaler.status),
    }
