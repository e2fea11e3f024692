"""Running one reconcile the way upstream's horizontal_test.go sets it up (helpers for tests)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autoscaler.decision.decide import (
    SCALE_WRITE_SUCCEEDED,
    Decision,
    ScaleWriteResult,
    complete,
    decide,
)
from autoscaler.decision.snapshot import parse_snapshot
from tests.autoscaler import builders as b

STATUS_OK = [("AbleToScale", "True", "SucceededRescale"),
             ("ScalingActive", "True", "ValidMetricFound"),
             ("ScalingLimited", "False", "DesiredWithinRange")]


def ok_with(*overrides: tuple[str, str, str]) -> list[tuple[str, str, str]]:
    """statusOkWithOverrides: replace the condition of the same type, or append it."""
    result = list(STATUS_OK)
    for override in overrides:
        for index, existing in enumerate(result):
            if existing[0] == override[0]:
                result[index] = override
                break
        else:
            result.append(override)
    return result


def conditions(decision: Decision) -> list[tuple[str, str, str]]:
    return [(c.type, c.status, c.reason) for c in decision.status.conditions]


def _metric_input(metric: Mapping[str, Any], levels: Sequence[int]) -> Any:
    kind = metric.get("type")
    if kind in {"Resource", "ContainerResource"}:
        return b.pod_metrics(b.controller_levels(*levels), timestamp=b.ts(b.NOW))
    if kind == "Pods":
        return b.custom_metrics(levels, timestamp=b.ts(b.NOW))
    if kind == "Object":
        return b.object_metric(levels[0], timestamp=b.ts(b.NOW))
    if kind == "External":
        return b.external_metrics(levels, timestamp=b.ts(b.NOW))
    return None


def scenario(*, min_replicas: int | None, max_replicas: int, spec_replicas: int,
             status_replicas: int | None = None, cpu_target: int = 0,
             levels: Sequence[int] = (), requests: Sequence[str] | None = None,
             readiness: Sequence[str] | None = None, start: Sequence[str] | None = None,
             phase: Sequence[str] | None = None, deleted: Sequence[bool] | None = None,
             metrics: Sequence[Mapping[str, Any]] = (), behavior: dict[str, Any] | None = None,
             recommendations: list[dict[str, Any]] | None = None,
             history: dict[str, Any] | None = None,
             initial_conditions: Sequence[dict[str, Any]] = (),
             last_scale_time: str | None = None, selector: str | None = b.SELECTOR,
             metric_inputs: Sequence[Any] | None = None, settings: dict[str, Any] | None = None,
             write_error: str | None = None, other_selectors: Mapping[str, str] | None = None,
             scale_error: str | None = None,
             annotations: Mapping[str, str] | None = None,
             spec_extra: Mapping[str, Any] | None = None) -> Decision:
    """One reconcile of upstream's test HPA (test-namespace/test-hpa over test-rc)."""
    status = spec_replicas if status_replicas is None else status_replicas
    specs: list[Mapping[str, Any]] = []
    if cpu_target:
        specs.append(b.cpu_utilization(cpu_target))
    specs.extend(metrics)
    if not specs:
        specs.append({"type": "Resource", "resource": {"name": "cpu", "target": {
            "type": "Utilization"}}})
    inputs = list(metric_inputs) if metric_inputs is not None else \
        [_metric_input(m, levels) for m in specs]
    if requests is None:
        requests = ["1.0"] * status
    pods = b.controller_pods(requests, ready=readiness, start=start, phase=phase,
                             deleted=deleted)
    autoscaler = b.hpa(min_replicas=min_replicas, max_replicas=max_replicas, metrics=specs,
                       behavior=behavior, current=spec_replicas, conditions=initial_conditions,
                       last_scale_time=last_scale_time)
    if annotations:
        autoscaler["metadata"]["annotations"] = dict(annotations)
    if spec_extra:
        autoscaler["spec"].update(spec_extra)
    if history is None and recommendations is not None:
        history = {"recommendations": recommendations}
    scale_object: dict[str, Any] = {"error": scale_error} if scale_error is not None \
        else b.scale(spec_replicas, status, selector)
    snap = parse_snapshot(b.snapshot(
        autoscaler=autoscaler, scale_object=scale_object, pods=pods, metrics=inputs,
        history=history, settings=b.UPSTREAM_TEST_SETTINGS if settings is None else settings))
    decision = decide(autoscaler=snap.autoscaler, scale=snap.scale, pods=snap.pods,
                      metrics=snap.metrics, history=snap.history, now=snap.now,
                      settings=snap.settings, other_selectors=other_selectors)
    result = SCALE_WRITE_SUCCEEDED if write_error is None else ScaleWriteResult(write_error)
    return complete(decision, write_result=result, settings=snap.settings, now=snap.now)
