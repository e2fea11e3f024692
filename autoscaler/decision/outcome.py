"""What one decision is: the Decision, its metrics' details and limits, and the draft each
phase of `decide` fills in (shared by decide, proposals, activation, fallback and completion)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from autoscaler.decision.conditions import TRUE, remove_condition
from autoscaler.decision.events import Event
from autoscaler.model.history import History
from autoscaler.model.spec import Behavior
from autoscaler.model.status import AutoscalerStatus, Condition, MetricStatus

__all__ = [
    "Decision",
    "Draft",
    "Limit",
    "MetricDetail",
    "PendingWrite",
    "readable_text",
]


class Limit(NamedTuple):
    """A rule that changed the replica count, from what to what."""

    rule: str
    from_replicas: int
    to_replicas: int
    detail: str


@dataclass(frozen=True)
class MetricDetail:
    """One spec.metrics entry: what it proposed and on what grounds (or why it failed)."""

    index: int
    type: str
    name: str
    description: str = ""  # upstream's name for it in messages, e.g. "pods metric qps"
    # How a readable report names it, where upstream's name prints Go values: "external metric
    # qps (queue=orders)" for upstream's "external metric qps(&LabelSelector{...})", and
    # "external metric qps" for "external metric qps(nil)". Empty: the description serves.
    label: str = ""
    proposed_replicas: int | None = None
    current: str | None = None
    target: str | None = None
    ratio: float | None = None
    error: str | None = None
    reason: str | None = None
    ready_pods: int | None = None
    unready_pods: int | None = None
    missing_pods: int | None = None
    ignored_pods: int | None = None

    @property
    def shown_name(self) -> str:
        """The metric's name in a readable report (never Go's rendering of a selector)."""
        return self.label or self.description or f"{self.type} metric {self.name}".strip()


def readable_text(text: str, details: Sequence[MetricDetail]) -> str:
    """`text` (a rescale reason, upstream's words) with each metric's readable name in place
    of upstream's name for it: for a report, never for a status, an event or a log."""
    for detail in details:
        if detail.label and detail.description and detail.label != detail.description:
            text = text.replace(detail.description, detail.label)
    return text


class PendingWrite(NamedTuple):
    """Everything the after-write step needs (upstream keeps it in local variables)."""

    old_status: AutoscalerStatus
    conditions: tuple[Condition, ...]
    metric_statuses: tuple[MetricStatus, ...]
    current_replicas: int
    new_replicas: int
    min_replicas: int
    reason: str
    history: History
    has_object_or_external: bool
    reference: str
    error: str | None
    behavior: Behavior | None


@dataclass(frozen=True)
class Decision:
    """What one reconcile decided, and what the controller writes and records for it."""

    desired_replicas: int  # the target's size after this reconcile (if the write succeeds)
    rescale: bool  # scale.spec.replicas is (to be) written with new_replicas
    new_replicas: int
    rescale_reason: str
    scale_updated: bool  # the write happened and succeeded
    status: AutoscalerStatus
    events: tuple[Event, ...]
    metrics: tuple[MetricDetail, ...]
    limits: tuple[Limit, ...]
    history: History
    explanation: tuple[str, ...]
    error: str | None = None  # what reconcileAutoscaler returns (for the log)
    pending: PendingWrite | None = field(default=None, repr=False, compare=False)
    # KEP-5325 with OwnerReferences: the pods this decision left out (None: not selected here)
    ignored_pods: int | None = None
    # The autoscaler's status before this reconcile (for status_changed).
    previous_status: AutoscalerStatus | None = field(default=None, repr=False, compare=False)

    @property
    def status_changed(self) -> bool:
        """Upstream skips the status write when False (compared only when asked: a deep
        comparison the replay's thousands of decisions never need)."""
        return self.previous_status is None or self.status != self.previous_status

    @property
    def awaiting_write(self) -> bool:
        return self.pending is not None


@dataclass
class Draft:
    """What one decide() has gathered so far, phase by phase, with the prose that explains it."""

    old: AutoscalerStatus
    reference: str
    conditions: tuple[Condition, ...]
    history: History
    current: int = 0
    min_replicas: int = 1
    max_replicas: int = 1
    events: list[Event] = field(default_factory=list)
    limits: list[Limit] = field(default_factory=list)
    explanation: list[str] = field(default_factory=list)
    details: tuple[MetricDetail, ...] = ()
    metric_statuses: tuple[MetricStatus, ...] = ()
    error: str | None = None
    ignored_pods: int | None = None

    def keep(self, *, desired_replicas: int, status: AutoscalerStatus, reason: str = "",
             error: str | None = None) -> Decision:
        """A decision that writes no scale."""
        return Decision(
            desired_replicas=desired_replicas, rescale=False, new_replicas=desired_replicas,
            rescale_reason=reason, scale_updated=False, status=status,
            previous_status=self.old, events=tuple(self.events),
            metrics=self.details, limits=tuple(self.limits), history=self.history,
            explanation=tuple(self.explanation), error=error, ignored_pods=self.ignored_pods)

    def true_condition(self, condition_type: str) -> Condition | None:
        """The condition of that type while it is True, else None."""
        return next((c for c in self.conditions
                     if c.type == condition_type and c.status == TRUE), None)

    def lift_condition(self, condition_type: str, *, event: Event, explanation: str) -> None:
        """Remove one of our conditions that applied, with the event and the words saying so."""
        self.conditions = remove_condition(self.conditions, condition_type)
        self.events.append(event)
        self.explanation.append(explanation)

    def status(self, *, desired_replicas: int) -> AutoscalerStatus:
        return AutoscalerStatus(current_replicas=self.current, desired_replicas=desired_replicas,
                                last_scale_time=self.old.last_scale_time,
                                current_metrics=self.metric_statuses, conditions=self.conditions)

