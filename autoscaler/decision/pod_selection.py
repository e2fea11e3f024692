"""KEP-5325's pod selection strategies: which of the selector's pods a decision counts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autoscaler.decision.outcome import Draft
from autoscaler.model.fields import read_object, read_str, read_string_map
from autoscaler.model.metrics import MetricInput, MetricValueList, PodMetricsList
from autoscaler.model.pods import ControllerRef, Pod, parse_controller_ref
from autoscaler.model.spec import (
    LABEL_SELECTOR,
    OWNER_REFERENCES,
    POD_SELECTION_STRATEGIES,
    parse_pod_selection_strategy,
)

__all__ = [
    "LABEL_SELECTOR",
    "OWNER_REFERENCES",
    "POD_SELECTION_STRATEGIES",
    "PodSelection",
    "ReplicaSetOwner",
    "parse_pod_selection_strategy",
    "parse_replica_set",
    "report_pod_selection",
    "restrict_pod_metrics",
    "select_pods",
]

REVISION_ANNOTATION = "deployment.kubernetes.io/revision"


@dataclass(frozen=True)
class ReplicaSetOwner:
    """A ReplicaSet's metadata as pod selection needs it: its controller and its revision."""

    name: str
    namespace: str = ""
    controller: ControllerRef | None = None
    revision: int = 0  # the Deployment's revision annotation; 0 when absent or not a number


@dataclass(frozen=True)
class PodSelection:
    """The pods a decision counts and how many of the selector's pods it left out."""

    pods: tuple[Pod, ...]
    not_owned: int = 0  # matched the selector, but another workload's (or nobody's) pods
    rollout_unready: int = 0  # not-Ready pods of the newest ReplicaSet during a rollout

    @property
    def ignored(self) -> int:
        return self.not_owned + self.rollout_unready


def parse_replica_set(raw: Any, path: str = "replicaset") -> ReplicaSetOwner:
    obj = read_object(raw, path)
    meta = read_object(obj.get("metadata") or {}, f"{path}.metadata")
    annotations = read_string_map(meta, "annotations", f"{path}.metadata")
    revision = annotations.get(REVISION_ANNOTATION, "")
    return ReplicaSetOwner(
        name=read_str(meta, "name", f"{path}.metadata", required=True),
        namespace=read_str(meta, "namespace", f"{path}.metadata"),
        controller=parse_controller_ref(meta, f"{path}.metadata"),
        revision=int(revision) if revision.isdigit() else 0,
    )


def _is_ready(pod: Pod) -> bool:
    return pod.phase == "Running" and pod.ready is not None and pod.ready.status == "True"


def select_pods(*, strategy: str, target_kind: str, target_name: str, pods: Sequence[Pod],
                replica_sets: Mapping[str, ReplicaSetOwner]) -> PodSelection:
    """The pods to hand `decide`.

    LabelSelector: all of them, unchanged. OwnerReferences: only the pods whose controller is
    the target (for a Deployment: a ReplicaSet whose controller is the target); and while a
    Deployment rolls out (its pods sit in more than one ReplicaSet), the not-Ready pods of its
    newest ReplicaSet are left out too, so surge pods alone never drive a scale-up.
    """
    if strategy != OWNER_REFERENCES:
        return PodSelection(pods=tuple(pods))
    owned: list[tuple[Pod, ReplicaSetOwner | None]] = []
    for pod in pods:
        ref = pod.controller
        if ref is None:
            continue
        if target_kind == "Deployment":
            replica_set = replica_sets.get(ref.name) if ref.kind == "ReplicaSet" else None
            owner = replica_set.controller if replica_set is not None else None
            if owner is not None and owner.kind == "Deployment" and owner.name == target_name:
                owned.append((pod, replica_set))
        elif ref.kind == target_kind and ref.name == target_name:
            owned.append((pod, None))
    not_owned = len(pods) - len(owned)
    sets = {rs.name: rs for _, rs in owned if rs is not None}
    if len(sets) < 2:
        return PodSelection(pods=tuple(pod for pod, _ in owned), not_owned=not_owned)
    newest = max(sets.values(), key=lambda rs: (rs.revision, rs.name)).name
    kept = tuple(pod for pod, rs in owned
                 if rs is None or rs.name != newest or _is_ready(pod))
    return PodSelection(pods=kept, not_owned=not_owned, rollout_unready=len(owned) - len(kept))


_POD_METRIC_TYPES = ("Resource", "ContainerResource", "Pods")


def restrict_pod_metrics(metric_types: Sequence[str], inputs: Sequence[MetricInput],
                         pods: Sequence[Pod]) -> list[MetricInput]:
    """Per-pod metric values of the selected pods only: upstream averages every value the
    metrics API returns for the selector, listed pod or not, so a left-out pod's value must go
    too."""
    names = {pod.name for pod in pods}
    restricted: list[MetricInput] = []
    for metric_type, data in zip(metric_types, inputs, strict=True):
        if metric_type in _POD_METRIC_TYPES and isinstance(data, PodMetricsList):
            data = PodMetricsList(items=tuple(m for m in data.items if m.name in names))
        elif metric_type in _POD_METRIC_TYPES and isinstance(data, MetricValueList):
            data = MetricValueList(items=tuple(v for v in data.items
                                               if v.described_name in names))
        restricted.append(data)
    return restricted


def report_pod_selection(draft: Draft, selection: PodSelection, *, pods: int) -> None:
    """KEP-5325's OwnerReferences: which of the selector's pods the decision counts."""
    draft.ignored_pods = selection.ignored
    ref = draft.reference.split("/")
    target = f"{ref[0]}/{ref[-1]}"
    parts = []
    if selection.not_owned:
        parts.append(f"{selection.not_owned} not owned by {target}")
    if selection.rollout_unready:
        parts.append(f"{selection.rollout_unready} not Ready in its newest ReplicaSet during a "
                     "rollout")
    left_out = f": {', '.join(parts)} left out" if parts else ""
    draft.explanation.append(
        f"Pod selection (OwnerReferences, KEP-5325): {len(selection.pods)} of the selector's "
        f"{pods} pods count{left_out}.")
