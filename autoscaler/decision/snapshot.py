"""Decision snapshots (snapshot.md): all one reconcile looks at, in; the decision, out."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from autoscaler.decision.decide import (
    SCALE_WRITE_SUCCEEDED,
    Decision,
    MetricDetail,
    complete,
    decide,
)
from autoscaler.decision.pod_selection import ReplicaSetOwner, parse_replica_set
from autoscaler.decision.settings import Settings, SettingsError, parse_settings
from autoscaler.model.fields import ModelError
from autoscaler.model.history import History, parse_history, render_history
from autoscaler.model.metrics import (
    ExternalMetricValueList,
    MetricFetchError,
    MetricInput,
    MetricValueList,
    PodMetricsList,
    parse_metric_input,
)
from autoscaler.model.objects import AUTOSCALER_KIND, Autoscaler, parse_autoscaler
from autoscaler.model.pods import Pod, Scale, ScaleError, parse_pods, parse_scale
from autoscaler.model.status import render_status
from autoscaler.model.times import parse_time
from autoscaler.model.validation import validate_spec
from metricscale.core.errors import ConfigError

__all__ = [
    "SNAPSHOT_API_VERSION",
    "SNAPSHOT_KIND",
    "Snapshot",
    "SnapshotError",
    "decide_snapshot",
    "parse_checked_snapshot",
    "parse_snapshot",
    "render_decision",
]

SNAPSHOT_API_VERSION = "metricscale.dev/v1alpha1"
SNAPSHOT_KIND = "DecisionSnapshot"

_KNOWN_KEYS = {"apiVersion", "kind", "now", "settings", "autoscaler", "scale", "pods", "metrics",
               "history", "replicaSets"}
# What each metric type reads from the metrics APIs.
_EXPECTED_INPUT: Mapping[str, type] = {
    "Resource": PodMetricsList,
    "ContainerResource": PodMetricsList,
    "Pods": MetricValueList,
    "Object": MetricValueList,
    "External": ExternalMetricValueList,
}


class SnapshotError(ConfigError):
    """A snapshot that cannot be used; `str(err)` names the field (`scale.spec.replicas: ...`)."""

    heading = "invalid snapshot"

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


@dataclass(frozen=True)
class Snapshot:
    now: datetime
    settings: Settings
    autoscaler: Autoscaler
    scale: Scale | ScaleError
    pods: tuple[Pod, ...]
    metrics: tuple[MetricInput, ...]
    history: History
    # KEP-5325 with OwnerReferences: the namespace's ReplicaSets, to pick the target's own
    # pods with; None (no `replicaSets` key): the pods are counted as given
    replica_sets: dict[str, ReplicaSetOwner] | None = None
    ignored_pods: int | None = None  # status.ignoredPods: what the controller left out

    @property
    def pod_selection(self) -> str:
        """KEP-5325's spec.podSelectionStrategy."""
        return self.autoscaler.spec.pod_selection_strategy


def _parse(raw: Any) -> Snapshot:
    if not isinstance(raw, Mapping):
        raise SnapshotError("", "a snapshot must be an object (a JSON or YAML mapping)")
    for key in raw:
        if key not in _KNOWN_KEYS:
            known = ", ".join(sorted(_KNOWN_KEYS))
            raise SnapshotError(str(key), f"unknown field (known: {known})")
    api_version = raw.get("apiVersion")
    if api_version is not None and api_version != SNAPSHOT_API_VERSION:
        raise SnapshotError("apiVersion", f"must be {SNAPSHOT_API_VERSION}, not {api_version!r}")
    kind = raw.get("kind")
    if kind is not None and kind != SNAPSHOT_KIND:
        raise SnapshotError("kind", f"must be {SNAPSHOT_KIND}, not {kind!r}")
    for required in ("now", "autoscaler", "scale"):
        if raw.get(required) is None:
            raise SnapshotError(required, "is required")
    now = parse_time(raw["now"], "now")
    settings = parse_settings(raw.get("settings"))
    autoscaler = parse_autoscaler(raw["autoscaler"], "autoscaler")
    scale = parse_scale(raw["scale"], "scale")
    pods = parse_pods(raw.get("pods") if raw.get("pods") is not None else [], "pods")
    specs = autoscaler.spec.metrics
    metrics_raw = raw.get("metrics")
    if metrics_raw is None:
        metrics_raw = [None] * len(specs)
    if not isinstance(metrics_raw, list | tuple):
        raise SnapshotError("metrics", "must be a list, one entry per spec.metrics entry")
    if len(metrics_raw) != len(specs):
        raise SnapshotError("metrics", f"has {len(metrics_raw)} entries; the autoscaler has "
                                       f"{len(specs)} metrics (spec.metrics, after the API "
                                       "server's defaulting), and each needs one entry")
    metrics: list[MetricInput] = []
    for index, (spec, item) in enumerate(zip(specs, metrics_raw, strict=True)):
        path = f"metrics[{index}]"
        value = parse_metric_input(item, path, metric_type=spec.type)
        expected = _EXPECTED_INPUT.get(spec.type)
        if expected is not None and value is not None and \
                not isinstance(value, expected | MetricFetchError):
            raise SnapshotError(f"{path}.kind", f"a {spec.type} metric reads a "
                                                f"{expected.__name__}; got "
                                                f"{type(value).__name__}")
        metrics.append(value)
    status = raw["autoscaler"].get("status")
    ignored = status.get("ignoredPods") if isinstance(status, Mapping) else None
    replica_sets = None
    if raw.get("replicaSets") is not None:
        items = raw["replicaSets"]
        if isinstance(items, Mapping) and items.get("kind") == "ReplicaSetList":
            items = items.get("items") or []  # `kubectl get rs -o json` as it prints
        if not isinstance(items, list | tuple):
            raise SnapshotError("replicaSets", "must be a list of ReplicaSets (or a "
                                               "ReplicaSetList)")
        owners = [parse_replica_set(item, f"replicaSets[{i}]") for i, item in enumerate(items)]
        replica_sets = {owner.name: owner for owner in owners}
    return Snapshot(now=now, settings=settings, autoscaler=autoscaler, scale=scale,
                    pods=pods, metrics=tuple(metrics), history=parse_history(raw.get("history")),
                    replica_sets=replica_sets,
                    ignored_pods=ignored if isinstance(ignored, int) else None)


def parse_snapshot(raw: Any) -> Snapshot:
    """A snapshot document (already decoded from JSON or YAML) as values."""
    try:
        return _parse(raw)
    except (ModelError, SettingsError) as err:
        raise SnapshotError(err.path, err.message) from None


def parse_checked_snapshot(raw: Any) -> Snapshot:
    """parse_snapshot, refusing first an autoscaler spec the API server would have refused
    (the Autoscaler CRD's schema and CEL rules, autoscaler.model.validation), with its words:
    what `metricscale explain` reads. parse_snapshot alone decides on any spec it can read,
    as the controller does on an object stored before a schema change."""
    autoscaler = raw.get("autoscaler") if isinstance(raw, Mapping) else None
    if isinstance(autoscaler, Mapping):
        try:
            validate_spec(autoscaler.get("spec"), "autoscaler.spec",
                          strict=autoscaler.get("kind") == AUTOSCALER_KIND)
        except ModelError as err:
            raise SnapshotError(err.path, err.message) from None
    return parse_snapshot(raw)


def decide_snapshot(snapshot: Snapshot, *, other_selectors: Mapping[str, str] | None = None
                    ) -> Decision:
    """The decision for a snapshot, with the scale write (if any) taken as successful."""
    decision = decide(autoscaler=snapshot.autoscaler, scale=snapshot.scale, pods=snapshot.pods,
                      metrics=snapshot.metrics, history=snapshot.history, now=snapshot.now,
                      settings=snapshot.settings, other_selectors=other_selectors,
                      replica_sets=snapshot.replica_sets)
    return complete(decision, write_result=SCALE_WRITE_SUCCEEDED, settings=snapshot.settings,
                    now=snapshot.now)


def _render_metric(detail: MetricDetail) -> dict[str, Any]:
    out: dict[str, Any] = {
        "index": detail.index,
        "type": detail.type,
        "name": detail.name,
        "description": detail.description or None,
        "proposedReplicas": detail.proposed_replicas,
        "current": detail.current,
        "target": detail.target,
        "ratio": detail.ratio if detail.ratio is None or math.isfinite(detail.ratio) else None,
        "error": detail.error,
    }
    if detail.reason is not None:
        out["reason"] = detail.reason
    if detail.ready_pods is not None or detail.unready_pods is not None:
        pods: dict[str, int] = {}
        for key, value in (("ready", detail.ready_pods), ("unready", detail.unready_pods),
                           ("missing", detail.missing_pods), ("ignored", detail.ignored_pods)):
            if value is not None:
                pods[key] = value
        out["pods"] = pods
    return out


def render_decision(decision: Decision) -> dict[str, Any]:
    """The decision as `metricscale explain` prints it (snapshot.md, Output)."""
    return {
        "desiredReplicas": decision.desired_replicas,
        "scaleUpdated": decision.scale_updated,
        "status": render_status(decision.status),
        "events": [{"type": e.type, "reason": e.reason, "message": e.message}
                   for e in decision.events],
        "metrics": [_render_metric(d) for d in decision.metrics],
        "limits": [{"rule": limit.rule, "from": limit.from_replicas, "to": limit.to_replicas,
                    "detail": limit.detail} for limit in decision.limits],
        "history": render_history(decision.history),
        "explanation": list(decision.explanation),
        **({"ignoredPods": decision.ignored_pods} if decision.ignored_pods is not None else {}),
    }
