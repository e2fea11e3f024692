"""The closed-loop replay: the pure decision run step by step over observed metric history.

No I/O: `simulate` takes the observations (one value per metric per step, already read from
Prometheus) and builds, at each step, the same DecisionSnapshot `metricscale explain` reads,
then decides it with the controller's code and carries the decision's history and status on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from autoscaler.decision.snapshot import (
    SNAPSHOT_API_VERSION,
    SNAPSHOT_KIND,
    Snapshot,
    SnapshotError,
    decide_snapshot,
    parse_snapshot,
    render_decision,
)
from autoscaler.model.fields import ModelError, Quantity
from autoscaler.model.history import History
from autoscaler.model.metrics import (
    ExternalMetricValue,
    ExternalMetricValueList,
    MetricInput,
    MetricValue,
    MetricValueList,
    parse_metric_input,
)
from autoscaler.model.objects import Autoscaler
from autoscaler.model.pods import Pod, Scale, ScaleError, parse_pod, parse_scale
from autoscaler.model.status import AutoscalerStatus
from metricscale.core.errors import ConfigError

REPLAY_LABELS = {"app.kubernetes.io/name": "replay"}
REPLAY_SELECTOR = "app.kubernetes.io/name=replay"
SUPPORTED_TYPES = ("Pods", "Object", "External", "Resource", "ContainerResource")
PER_POD_TYPES = ("Pods", "Resource", "ContainerResource")


class ReplayInputError(ConfigError):
    """Input the replay cannot use; the message says what to fix (exit status 2)."""

    heading = ""


class MissingInitialReplicas(ReplayInputError):
    """Prometheus has no size of the target at --from, and --initial-replicas is not given."""


@dataclass(frozen=True)
class Observation:
    """One metric at one step: the value the metrics API would have served.

    Pods, Resource, ContainerResource: `value` is the observed per-pod average (Resource: CPU
    cores or memory bytes per pod) and `pods` the observed pod count (their product is the
    total load, redistributed over the simulated ready pods).
    Object/External: `value` is used as observed. None: no sample at that step.
    """

    value: float | None
    pods: int | None = None


@dataclass(frozen=True)
class Step:
    time: datetime
    values: tuple[float | None, ...]  # what the decision saw (Pods: per simulated ready pod)
    current_replicas: int
    ready_pods: int
    proposed_replicas: int | None
    decided_replicas: int
    limiting_rule: str | None
    above_target: bool


@dataclass(frozen=True)
class Summary:
    steps: int
    scale_ups: int
    scale_downs: int
    min_replicas: int
    max_replicas: int
    mean_replicas: float
    replica_hours: float
    seconds_above_target: float


@dataclass
class _Pod:
    name: str
    started: datetime


@dataclass
class _State:
    replicas: int
    pods: list[_Pod] = field(default_factory=list)
    serial: int = 0
    history: dict[str, Any] | None = None
    status: dict[str, Any] | None = None


def _time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _quantity(value: float) -> str:
    return f"{round(value * 1000)}m"


def container_names(autoscaler: Mapping[str, Any]) -> list[str]:
    """The simulated pod's containers: those ContainerResource metrics name, else `main`."""
    names = sorted({(spec.get("containerResource") or {}).get("container", "main")
                    for spec in autoscaler.get("spec", {}).get("metrics") or []
                    if spec.get("type") == "ContainerResource"})
    return names or ["main"]


def _pod_object(pod: _Pod, *, namespace: str, ready: bool, now: datetime,
                startup: timedelta, containers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    transition = pod.started + startup if ready else pod.started
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod.name, "namespace": namespace, "labels": dict(REPLAY_LABELS)},
        "spec": {"containers": list(containers)},
        "status": {"phase": "Running", "startTime": _time(pod.started),
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                   "lastTransitionTime": _time(min(transition, now))}]},
    }


def _usage_input(spec: Mapping[str, Any], per_pod: float, *, namespace: str,
                 ready: Sequence[_Pod], stamp: str, containers: Sequence[str]) -> Any:
    body = spec.get(spec["type"][0].lower() + spec["type"][1:]) or {}
    resource = body.get("name", "cpu")
    if spec["type"] == "ContainerResource":
        usage = {name: per_pod if name == body.get("container") else 0.0
                 for name in containers}
    else:  # Resource: the pod's total, spread evenly over its containers
        usage = {name: per_pod / len(containers) for name in containers}
    items = [{"metadata": {"name": pod.name, "namespace": namespace}, "timestamp": stamp,
              "window": "1m0s",
              "containers": [{"name": name, "usage": {resource: _quantity(value)}}
                             for name, value in usage.items()]} for pod in ready]
    return {"kind": "PodMetricsList", "apiVersion": "metrics.k8s.io/v1beta1", "metadata": {},
            "items": items}


def _metric_input(spec: Mapping[str, Any], observation: Observation, *, namespace: str,
                  ready: Sequence[_Pod], now: datetime,
                  containers: Sequence[str] = ("main",)) -> tuple[Any, float | None]:
    kind = spec["type"]
    if observation.value is None or not math.isfinite(observation.value):
        return {"error": "no sample at this step"}, None
    stamp = _time(now)
    if kind in PER_POD_TYPES:
        if not ready:
            return {"error": "no ready pods"}, None
        observed_pods = observation.pods or 1
        per_pod = observation.value * observed_pods / len(ready)
        if kind != "Pods":
            return _usage_input(spec, per_pod, namespace=namespace, ready=ready, stamp=stamp,
                                containers=containers), per_pod
        name = spec["pods"]["metric"]["name"]
        items = [{"describedObject": {"kind": "Pod", "namespace": namespace, "name": pod.name,
                                      "apiVersion": "/v1"},
                  "metric": {"name": name}, "timestamp": stamp, "windowSeconds": 60,
                  "value": _quantity(per_pod)} for pod in ready]
        return {"kind": "MetricValueList", "apiVersion": "custom.metrics.k8s.io/v1beta2",
                "metadata": {}, "items": items}, per_pod
    if kind == "Object":
        described = spec["object"]["describedObject"]
        item = {"describedObject": {"kind": described.get("kind"), "namespace": namespace,
                                    "name": described.get("name"),
                                    "apiVersion": described.get("apiVersion", "")},
                "metric": {"name": spec["object"]["metric"]["name"]}, "timestamp": stamp,
                "windowSeconds": 60, "value": _quantity(observation.value)}
        return {"kind": "MetricValueList", "apiVersion": "custom.metrics.k8s.io/v1beta2",
                "metadata": {}, "items": [item]}, observation.value
    item = {"metricName": spec["external"]["metric"]["name"], "metricLabels": {},
            "timestamp": stamp, "value": _quantity(observation.value)}
    return {"kind": "ExternalMetricValueList", "apiVersion": "external.metrics.k8s.io/v1beta1",
            "metadata": {}, "items": [item]}, observation.value


def build_snapshot(*, autoscaler: Mapping[str, Any], now: datetime, state: _State,
                   observations: Sequence[Observation], settings: Mapping[str, Any],
                   startup: timedelta, requests: Mapping[str, str] | None = None,
                   ) -> tuple[dict[str, Any], tuple[float | None, ...], int]:
    """The DecisionSnapshot of one step (what `metricscale explain` would be given).

    `requests` are each simulated container's resource requests (for Utilization targets).
    """
    namespace = autoscaler.get("metadata", {}).get("namespace", "default")
    names = container_names(autoscaler)
    containers = [{"name": name, **({"resources": {"requests": dict(requests)}}
                                    if requests else {})} for name in names]
    ready = [pod for pod in state.pods if pod.started + startup <= now]
    ready_names = {pod.name for pod in ready}
    specs = autoscaler["spec"]["metrics"]
    metrics: list[Any] = []
    seen: list[float | None] = []
    for spec, observation in zip(specs, observations, strict=True):
        data, value = _metric_input(spec, observation, namespace=namespace, ready=ready,
                                    now=now, containers=names)
        metrics.append(data)
        seen.append(value)
    target = dict(autoscaler)
    if state.status is not None:
        target["status"] = state.status
    else:
        target.pop("status", None)
    snapshot: dict[str, Any] = {
        "apiVersion": SNAPSHOT_API_VERSION, "kind": SNAPSHOT_KIND, "now": _time(now),
        "settings": dict(settings), "autoscaler": target,
        "scale": {"apiVersion": "autoscaling/v1", "kind": "Scale",
                  "metadata": {"name": autoscaler["spec"]["scaleTargetRef"]["name"],
                               "namespace": namespace},
                  "spec": {"replicas": state.replicas},
                  "status": {"replicas": len(state.pods), "selector": REPLAY_SELECTOR}},
        "pods": [_pod_object(pod, namespace=namespace, ready=pod.name in ready_names, now=now,
                             startup=startup, containers=containers) for pod in state.pods],
        "metrics": metrics,
    }
    if state.history is not None:
        snapshot["history"] = state.history
    return snapshot, tuple(seen), len(ready)


def _resize(state: _State, *, replicas: int, now: datetime, started: datetime) -> None:
    while len(state.pods) < replicas:
        state.serial += 1
        state.pods.append(_Pod(f"replay-{state.serial}", started))
    # Scale-down removes the newest pods first (the ReplicaSet controller prefers unready ones).
    del state.pods[replicas:]
    state.replicas = replicas


_NEVER = datetime.max.replace(tzinfo=UTC)


def _whole_second(moment: datetime) -> datetime:
    """The time a metric value's `timestamp` (RFC 3339, whole seconds) parses back to."""
    return datetime.fromtimestamp(int(moment.timestamp()), UTC)


class _Models:
    """The model values a step's snapshot parses to, built without re-parsing what does not
    change: the autoscaler (status swapped in), settings, and each pod (a pod's object only
    changes when it turns ready). The first step is parsed from its whole snapshot."""

    def __init__(self, first: Snapshot) -> None:
        self.autoscaler = first.autoscaler
        self.settings = first.settings
        self.pods: dict[tuple[str, bool], Pod] = {}
        self.scales: dict[tuple[int, int], Scale | ScaleError] = {}
        self.quantities: dict[int, Quantity] = {}  # by milli-units
        self._with_status: Autoscaler | None = None  # the autoscaler with the last status
        self._pods_key: tuple[tuple[str, ...], tuple[bool, ...]] | None = None
        self._pods: tuple[Pod, ...] = ()
        self._version: tuple[int, int] | None = None  # the simulated pods' serial and count
        self._next_ready = _NEVER  # when the next of them turns ready
        self._ready: list[_Pod] = []
        self._containers: list[str] = []

    def _quantity(self, value: float) -> Quantity:
        milli = round(value * 1000)  # _quantity(value), keyed by its number
        found = self.quantities.get(milli)
        if found is None:
            found = self.quantities[milli] = Quantity.parse(f"{milli}m")
        return found

    def _direct(self, spec: Mapping[str, Any], observation: Observation, *, namespace: str,
                ready: Sequence[_Pod], stamp: datetime
                ) -> tuple[MetricInput, float] | None:
        """A Pods, Object or External metric's input as the model values its answer parses
        to (what _metric_input's document gives through parse_metric_input), without the
        document; None for the other cases, which take that path."""
        kind = spec["type"]
        value = observation.value
        if value is None or not math.isfinite(value) or kind not in ("Pods", "Object",
                                                                      "External"):
            return None
        if kind == "Pods":
            if not ready:
                return None
            per_pod = value * (observation.pods or 1) / len(ready)
            quantity = self._quantity(per_pod)
            name = spec["pods"]["metric"]["name"]
            return MetricValueList(items=tuple([
                MetricValue("Pod", pod.name, name, stamp, quantity, 60, namespace, "/v1")
                for pod in ready])), per_pod
        if kind == "Object":
            described = spec["object"]["describedObject"]
            return MetricValueList(items=(MetricValue(
                described_kind=described.get("kind") or "",
                described_name=described.get("name") or "", described_namespace=namespace,
                described_api_version=described.get("apiVersion", "") or "",
                metric_name=spec["object"]["metric"]["name"], timestamp=stamp,
                window_seconds=60, value=self._quantity(value)),)), value
        return ExternalMetricValueList(items=(ExternalMetricValue(
            metric_name=spec["external"]["metric"]["name"], metric_labels={},
            timestamp=stamp, value=self._quantity(value)),)), value

    def snapshot(self, *, autoscaler: Mapping[str, Any], state: _State, now: datetime,
                 observations: Sequence[Observation], startup: timedelta,
                 requests: Mapping[str, str] | None, history: History,
                 status: AutoscalerStatus) -> tuple[Snapshot, tuple[float | None, ...], int]:
        """What parse_snapshot(build_snapshot(...)) gives, building only what changed."""
        namespace = autoscaler.get("metadata", {}).get("namespace", "default")
        # The pods change only when the simulation resizes (serial and count say which pods)
        # or when one of them turns ready: until then the last step's are this step's.
        version = (state.serial, len(state.pods))
        if version != self._version or now >= self._next_ready:
            flags = tuple(pod.started + startup <= now for pod in state.pods)
            self._ready = [pod for pod, is_ready in zip(state.pods, flags, strict=True)
                           if is_ready]
            self._version = version
            self._next_ready = min((pod.started + startup for pod in state.pods
                                    if pod.started + startup > now), default=_NEVER)
            names_key = (tuple(pod.name for pod in state.pods), flags)
            if names_key != self._pods_key:  # the pods changed since the last step
                pods = []
                for index, pod in enumerate(state.pods):
                    key = (pod.name, flags[index])
                    parsed = self.pods.get(key)
                    if parsed is None:
                        containers = [{"name": name, **(
                            {"resources": {"requests": dict(requests)}} if requests else {})}
                            for name in container_names(autoscaler)]
                        parsed = self.pods[key] = parse_pod(
                            _pod_object(pod, namespace=namespace, ready=key[1], now=now,
                                        startup=startup, containers=containers),
                            f"pods[{index}]")
                    pods.append(parsed)
                self._pods_key, self._pods = names_key, tuple(pods)
        ready = self._ready
        scale_key = (state.replicas, len(state.pods))
        scale = self.scales.get(scale_key)
        if scale is None:
            scale = self.scales[scale_key] = parse_scale({
                "apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {"name": autoscaler["spec"]["scaleTargetRef"]["name"],
                             "namespace": namespace},
                "spec": {"replicas": state.replicas},
                "status": {"replicas": len(state.pods), "selector": REPLAY_SELECTOR}})
        if not self._containers:
            self._containers = container_names(autoscaler)
        names = self._containers
        metrics: list[MetricInput] = []
        seen: list[float | None] = []
        stamp = _whole_second(now)
        for index, (spec, raw_spec, observation) in enumerate(zip(
                self.autoscaler.spec.metrics, autoscaler["spec"]["metrics"], observations,
                strict=True)):
            direct = self._direct(raw_spec, observation, namespace=namespace, ready=ready,
                                  stamp=stamp)
            if direct is not None:
                metrics.append(direct[0])
                seen.append(direct[1])
                continue
            data, value = _metric_input(raw_spec, observation, namespace=namespace,
                                        ready=ready, now=now, containers=names)
            metrics.append(parse_metric_input(data, f"metrics[{index}]",
                                              metric_type=spec.type))
            seen.append(value)
        if self._with_status is None or self._with_status.status is not status:
            base = self.autoscaler
            self._with_status = Autoscaler(api_version=base.api_version, kind=base.kind,
                                           metadata=base.metadata, spec=base.spec,
                                           status=status)
        return Snapshot(now=now, settings=self.settings,
                        autoscaler=self._with_status,
                        scale=scale, pods=self._pods, metrics=tuple(metrics),
                        history=history), tuple(seen), len(ready)


def simulate(*, autoscaler: Mapping[str, Any], times: Sequence[datetime],
             observations: Sequence[Sequence[Observation]], initial_replicas: int,
             startup: timedelta, settings: Mapping[str, Any] | None = None,
             requests: Mapping[str, str] | None = None,
             reparse: bool = False) -> list[Step]:
    """Decide at every time; `observations[i][j]` is metric j at times[i].

    The initial pods count as started long ago (ready at the first step). The decision's
    history and status are carried to the next step as values; `reparse=True` instead
    renders them and parses every step's whole snapshot as `metricscale explain` would (the
    tests pin that both give the same snapshots).
    """
    specs = autoscaler.get("spec", {}).get("metrics") or []
    for index, spec in enumerate(specs):
        if spec.get("type") not in SUPPORTED_TYPES:
            raise ReplayInputError(f"spec.metrics[{index}]: type {spec.get('type')!r} is not "
                                   f"supported by replay yet (supported: "
                                   f"{', '.join(SUPPORTED_TYPES)})")
    if not times:
        raise ReplayInputError("the range has no steps")
    state = _State(replicas=initial_replicas)
    _resize(state, replicas=initial_replicas, now=times[0],
            started=times[0] - startup - timedelta(hours=1))
    steps: list[Step] = []
    models: _Models | None = None
    history: History | None = None
    status: AutoscalerStatus | None = None
    for now, observed in zip(times, observations, strict=True):
        try:
            if models is None or history is None or status is None or reparse:
                raw, seen, ready_count = build_snapshot(
                    autoscaler=autoscaler, now=now, state=state, observations=observed,
                    settings=settings or {}, startup=startup, requests=requests)
                snapshot = parse_snapshot(raw)
                models = _Models(snapshot)
            else:
                snapshot, seen, ready_count = models.snapshot(
                    autoscaler=autoscaler, state=state, now=now, observations=observed,
                    startup=startup, requests=requests, history=history, status=status)
            decision = decide_snapshot(snapshot)
        except (SnapshotError, ModelError) as err:
            raise ReplayInputError(f"the autoscaler cannot be decided on: {err}") from None
        proposals = [d.proposed_replicas for d in decision.metrics
                     if d.proposed_replicas is not None]
        current = state.replicas
        steps.append(Step(
            time=now, values=seen, current_replicas=current, ready_pods=ready_count,
            proposed_replicas=max(proposals) if proposals else None,
            decided_replicas=decision.desired_replicas,
            limiting_rule=decision.limits[-1].rule if decision.limits else None,
            above_target=any(d.ratio is not None and math.isfinite(d.ratio) and d.ratio > 1.0
                             for d in decision.metrics)))
        history, status = decision.history, decision.status
        if reparse:
            rendered = render_decision(decision)
            state.history, state.status = rendered["history"], rendered["status"]
        if decision.desired_replicas != current:
            _resize(state, replicas=decision.desired_replicas, now=now, started=now)
    return steps


def summarize(steps: Sequence[Step], *, step: timedelta) -> Summary:
    if not steps:
        raise ReplayInputError("the range has no steps")
    replicas = [s.decided_replicas for s in steps]
    seconds = step.total_seconds()
    return Summary(
        steps=len(steps),
        scale_ups=sum(1 for s in steps if s.decided_replicas > s.current_replicas),
        scale_downs=sum(1 for s in steps if s.decided_replicas < s.current_replicas),
        min_replicas=min(replicas), max_replicas=max(replicas),
        mean_replicas=sum(replicas) / len(replicas),
        replica_hours=sum(replicas) * seconds / 3600.0,
        seconds_above_target=sum(seconds for s in steps if s.above_target))
