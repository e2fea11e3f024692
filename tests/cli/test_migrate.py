"""cli.migrate: the order of the hand-over's requests (the HPA deleted only once the controller
has reconciled the paused Autoscaler carrying the history; nothing of the HPA touched when it
does not), and the command's arguments and output."""

from __future__ import annotations

import argparse
import copy
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from autoscaler.kube.operations import ScaleTargetRef
from autoscaler.model.migration import autoscaler_from_hpa
from autoscaler.model.pods import Scale
from cli.main import CommandParser
from cli.migrate import (
    Cluster,
    MigrateError,
    add_arguments,
    check_arguments,
    hand_over,
    render_documents,
)
from metricscale.kube.discovery import ResourceMapping
from metricscale.kube.errors import NotFound

NOW = datetime(2026, 11, 21, 10, 0, 0, tzinfo=UTC)
HPAS = "/apis/autoscaling/v2/namespaces/shop/horizontalpodautoscalers/web"
OURS = "/apis/metricscale.dev/v1alpha1/namespaces/shop/autoscalers"


def hpa(annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web", "namespace": "shop", "uid": "hpa-uid",
                         "annotations": dict(annotations or {})},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": "web"},
                     "minReplicas": 1, "maxReplicas": 10,
                     "behavior": {"scaleDown": {"stabilizationWindowSeconds": 60}},
                     "metrics": [{"type": "Pods", "pods": {
                         "metric": {"name": "jobs"},
                         "target": {"type": "AverageValue", "averageValue": "10"}}}]}}


class Kube:
    async def resolve_scale_target(self, ref: ScaleTargetRef) -> ResourceMapping:
        return ResourceMapping(group="apps", version="v1", resource="deployments",
                               kind="Deployment", namespaced=True, has_scale=True)

    async def get_scale(self, target: ResourceMapping, *, namespace: str, name: str) -> Scale:
        return Scale(spec_replicas=5, status_replicas=5, selector="app=web")


class FakeRequests:
    """The API server as the hand-over sees it: every request recorded; the controller
    'reconciles' the Autoscaler after `reconcile_after` GETs of it (never, if None)."""

    def __init__(self, *, reconcile_after: int | None) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.autoscaler: dict[str, Any] | None = None
        self.reconcile_after = reconcile_after
        self.gets = 0

    async def call(self, verb: str, path: str, **options: Any) -> Any:
        body = copy.deepcopy(options.get("body"))
        self.calls.append((verb, path, copy.deepcopy(body)))
        if path.endswith("/events"):
            return {"items": [{"reason": "SuccessfulRescale", "count": 1,
                               "message": "New size: 5; reason: above target",
                               "lastTimestamp": "2026-11-21T09:59:50Z"}]}
        if verb == "POST":
            self.autoscaler = {**body, "metadata": {**body["metadata"], "uid": "ours",
                                                    "generation": 1}}
            return self.autoscaler
        if verb == "GET" and path.startswith(OURS):
            if self.autoscaler is None:
                raise NotFound("not found", status=404, reason="NotFound")
            self.gets += 1
            if self.reconcile_after is not None and self.gets > self.reconcile_after:
                paused = "metricscale.dev/paused" in (
                    self.autoscaler["metadata"].get("annotations") or {})
                self.autoscaler["status"] = {
                    "observedGeneration": 1, "desiredReplicas": 5, "currentReplicas": 5,
                    "history": {"recommendations": [{"replicas": 5,
                                                     "timestamp": "2026-11-21T10:00:00Z"}]},
                    "conditions": [{"type": "Paused", "status": "True", "reason": "Paused"}]
                    if paused else []}
            return self.autoscaler
        if verb == "PATCH":
            assert self.autoscaler is not None
            annotations = self.autoscaler["metadata"].setdefault("annotations", {})
            for key, value in body["metadata"]["annotations"].items():
                if value is None:
                    annotations.pop(key, None)
            return self.autoscaler
        return {}


def cluster(requests: FakeRequests) -> Cluster:
    return Cluster(requests, Kube())


async def test_the_hpa_is_deleted_only_after_the_controller_has_taken_over() -> None:
    requests = FakeRequests(reconcile_after=2)
    said: list[str] = []
    report = await hand_over(cluster(requests), hpa(), autoscaler_from_hpa(hpa()), within=30,
                             poll=0, clock=lambda: NOW, say=said.append)
    verbs = [(verb, path.rsplit("/", 1)[-1]) for verb, path, _ in requests.calls]
    created = verbs.index(("POST", "autoscalers"))
    deleted = verbs.index(("DELETE", "web"))
    reconciled = created + 3  # the third GET after the POST saw the status
    assert deleted == reconciled + 1 and verbs[deleted + 1] == ("PATCH", "web")
    (_, path, body), = [c for c in requests.calls if c[0] == "DELETE"]
    assert path == HPAS and body["preconditions"] == {"uid": "hpa-uid"}
    (_, _, created_body), = [c for c in requests.calls if c[0] == "POST"]
    annotations = created_body["metadata"]["annotations"]
    assert annotations["metricscale.dev/paused"] == "true"
    seeded = json.loads(annotations["metricscale.dev/history"])
    assert seeded["recommendations"] == [{"replicas": 5, "timestamp": "2026-11-21T10:00:00Z"}]
    (_, _, patch), = [c for c in requests.calls if c[0] == "PATCH"]
    assert patch == {"metadata": {"annotations": {"metricscale.dev/history": None,
                                                  "metricscale.dev/paused": None}}}
    assert report.lines[-1].startswith("resumed: the Autoscaler is in charge at 5")
    assert any("restarts" in line for line in said)


async def test_without_the_controller_the_autoscaler_goes_and_the_hpa_stays() -> None:
    requests = FakeRequests(reconcile_after=None)
    with pytest.raises(MigrateError, match="the HPA is left in charge"):
        await hand_over(cluster(requests), hpa(), autoscaler_from_hpa(hpa()), within=0,
                        poll=0, clock=lambda: NOW)
    deletes = [(path, body) for verb, path, body in requests.calls if verb == "DELETE"]
    assert deletes == [(f"{OURS}/web", {"apiVersion": "v1", "kind": "DeleteOptions",
                                        "preconditions": {"uid": "ours"}})]


async def test_a_native_hpas_own_history_is_carried_as_it_is() -> None:
    own = {"recommendations": [{"replicas": 7, "timestamp": "2026-11-21T09:59:00Z"}],
           "scaleDownEvents": [{"timestamp": "2026-11-21T09:59:30Z", "replicaChange": 2,
                                "outdated": False}],
           "scaleUpEvents": []}
    source = hpa({"metricscale.dev/history": json.dumps(own),
                  "metricscale.dev/paused-scale-in": "true"})
    requests = FakeRequests(reconcile_after=0)
    await hand_over(cluster(requests), source, autoscaler_from_hpa(source), within=30, poll=0,
                    clock=lambda: NOW)
    assert not any(path.endswith("/events") for _, path, _ in requests.calls)
    (_, _, created), = [c for c in requests.calls if c[0] == "POST"]
    annotations = created["metadata"]["annotations"]
    carried = json.loads(annotations["metricscale.dev/history"])
    assert carried["recommendations"] == own["recommendations"]
    assert carried["scaleDownEvents"] == own["scaleDownEvents"]
    assert annotations["metricscale.dev/paused-scale-in"] == "true"  # the user's, kept


async def test_an_existing_autoscaler_of_that_name_stops_the_handover_first() -> None:
    requests = FakeRequests(reconcile_after=0)
    requests.autoscaler = {"metadata": {"name": "web"}}
    with pytest.raises(MigrateError, match="exists already"):
        await hand_over(cluster(requests), hpa(), autoscaler_from_hpa(hpa()), within=1,
                        poll=0, clock=lambda: NOW)
    assert [verb for verb, _, _ in requests.calls] == ["GET"]


def parse(*arguments: str) -> argparse.Namespace:
    parser = CommandParser(prog="metricscale migrate")
    add_arguments(parser)
    return parser.parse_args(arguments)


@pytest.mark.parametrize(("arguments", "message"), [
    (("autoscaler", "a/b", "--apply"), "--apply is for `migrate hpa` only"),
    (("hpa", "a/b", "-o", "rules"), "-o rules is for prometheus-adapter"),
    (("prometheus-adapter", "f.yaml", "-o", "json"), "-o json is for hpa and autoscaler"),
    (("prometheus-adapter",), "prometheus-adapter takes one FILE"),
    (("hpa", "a/b", "--our-default-rules"), "--our-default-rules is for prometheus-adapter"),
])
def test_flags_that_do_not_go_with_what_is_migrated_are_refused(
        arguments: tuple[str, ...], message: str) -> None:
    with pytest.raises(MigrateError, match=message.replace("[", r"\[")):
        check_arguments(parse(*arguments))


def test_printed_manifests_carry_what_was_left_out_as_comments() -> None:
    from autoscaler.model.migration import hpa_from_autoscaler

    ours = autoscaler_from_hpa(hpa()).manifest
    ours["spec"]["idle"] = {"replicas": 0, "cooldownSeconds": 60}
    text = render_documents([hpa_from_autoscaler(ours), autoscaler_from_hpa(hpa())],
                            output="yaml")
    first, second = text.split("---\n")
    assert first.startswith("# HorizontalPodAutoscaler shop/web\n# not carried: spec.idle:")
    assert second.startswith("# Autoscaler shop/web\n")
    assert [d["kind"] for d in yaml.safe_load_all(text)] == ["HorizontalPodAutoscaler",
                                                             "Autoscaler"]
    as_json = json.loads(render_documents([autoscaler_from_hpa(hpa())] * 2, output="json"))
    assert as_json["kind"] == "List" and len(as_json["items"]) == 2


def test_hpas_owned_by_another_controller_are_skipped_and_said_so() -> None:
    import io

    from cli.migrate import _convert_all

    keda = hpa()
    keda["metadata"]["name"] = "keda-hpa-orders"
    keda["metadata"]["ownerReferences"] = [{"kind": "ScaledObject", "name": "orders"}]
    err = io.StringIO()
    conversions, _pairs, failures = _convert_all([keda, hpa()], autoscaler_from_hpa, err)
    assert [c.key for c in conversions] == ["shop/web"] and failures == 0
    assert "shop/keda-hpa-orders: skipped: owned by ScaledObject orders" in err.getvalue()
