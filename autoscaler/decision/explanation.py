"""The readable report of a decision, as `metricscale explain -o text` prints it (pure)."""

from __future__ import annotations

from datetime import datetime

from autoscaler.decision.decide import Decision, readable_text
from autoscaler.decision.phrases import phrase_replicas
from autoscaler.decision.snapshot import Snapshot
from autoscaler.model.spec import LABEL_SELECTOR
from autoscaler.model.times import format_time

__all__ = ["render_text"]


def _when(value: datetime | None) -> str:
    return "-" if value is None else format_time(value)


def render_text(snapshot: Snapshot, decision: Decision) -> str:
    """A readable report of the decision. Where upstream's words print a Go value (a metric
    selector as `&LabelSelector{...}`, or `nil` for none), the report names the metric as
    kubectl would; the JSON output keeps the words the controller writes, byte for byte."""
    autoscaler = snapshot.autoscaler
    ref = autoscaler.spec.scale_target_ref
    lines = [
        f"{autoscaler.kind} {autoscaler.key} -> {ref.kind}/{ref.name} at {_when(snapshot.now)}",
    ]
    if decision.rescale:
        lines.append(f"Decision: scale to {decision.new_replicas} "
                     f"({readable_text(decision.rescale_reason, decision.metrics)})")
    else:
        lines.append(f"Decision: keep {phrase_replicas(decision.desired_replicas)}")
    lines.append("")
    if decision.metrics:
        lines.append("Metrics:")
        for detail in decision.metrics:
            label = detail.shown_name
            if detail.error is not None:
                lines.append(f"  [{detail.index}] {label}: FAILED ({detail.reason}): "
                             f"{detail.error}")
                continue
            ratio = f"{detail.ratio:.4g}" if detail.ratio is not None else "undefined"
            lines.append(f"  [{detail.index}] {label}: current {detail.current}, target "
                         f"{detail.target}, ratio {ratio} -> {detail.proposed_replicas}")
        lines.append("")
    if decision.limits:
        lines.append("Rules that changed the number:")
        for limit in decision.limits:
            lines.append(f"  {limit.rule}: {limit.from_replicas} -> {limit.to_replicas} "
                         f"({limit.detail})")
        lines.append("")
    if decision.ignored_pods is not None:
        lines.append(f"Pod selection: {snapshot.pod_selection} (KEP-5325): left out "
                     f"{decision.ignored_pods} of the selector's pods")
        lines.append("")
    elif snapshot.pod_selection != LABEL_SELECTOR:
        left_out = ("?" if snapshot.ignored_pods is None else str(snapshot.ignored_pods))
        lines.append(f"Pod selection: {snapshot.pod_selection} (KEP-5325): the controller's "
                     f"last decision left out {left_out} of the selector's pods "
                     "(status.ignoredPods); the snapshot has no replicaSets, so its pods "
                     "count as given")
        lines.append("")
    lines.append("Why:")
    lines.extend(f"  - {line}" for line in decision.explanation)
    lines.append("")
    status = decision.status
    lines.append(f"Status: currentReplicas {status.current_replicas}, desiredReplicas "
                 f"{status.desired_replicas}, lastScaleTime {_when(status.last_scale_time)}")
    for condition in status.conditions:
        lines.append(f"  {condition.type:<15} {condition.status:<6} {condition.reason:<28} "
                     f"{readable_text(condition.message, decision.metrics)}")
    if decision.events:
        lines.append("")
        lines.append("Events:")
        for event in decision.events:
            lines.append(f"  {event.type:<8} {event.reason:<28} "
                         f"{readable_text(event.message, decision.metrics)}")
    return "\n".join(lines) + "\n"
