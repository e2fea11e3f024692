"""KEP-5325's pod selection strategies, as a pure function over pods and ReplicaSets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoscaler.decision.explanation import render_text
from autoscaler.decision.pod_selection import (
    LABEL_SELECTOR,
    OWNER_REFERENCES,
    ReplicaSetOwner,
    parse_pod_selection_strategy,
    parse_replica_set,
    restrict_pod_metrics,
    select_pods,
)
from autoscaler.decision.snapshot import decide_snapshot, parse_snapshot, render_decision
from autoscaler.model.fields import ModelError, Quantity
from autoscaler.model.metrics import MetricValue, MetricValueList, PodMetrics, PodMetricsList
from autoscaler.model.pods import ControllerRef, Pod, PodReadyCondition, parse_pod

T0 = datetime(2026, 1, 1, tzinfo=UTC)
READY = PodReadyCondition(status="True", last_transition_time=T0)
NOT_READY = PodReadyCondition(status="False", last_transition_time=T0)

REPLICA_SETS = {
    "web-1": ReplicaSetOwner(name="web-1", controller=ControllerRef("Deployment", "web"),
                             revision=1),
    "web-2": ReplicaSetOwner(name="web-2", controller=ControllerRef("Deployment", "web"),
                             revision=2),
    "canary-1": ReplicaSetOwner(name="canary-1",
                                controller=ControllerRef("Deployment", "web-canary"),
                                revision=1),
    "orphan": ReplicaSetOwner(name="orphan"),
}


def pod(name: str, owner: tuple[str, str] | None, *, ready: bool = True,
        phase: str = "Running") -> Pod:
    return Pod(name=name, labels={"app": "web"}, phase=phase,
               ready=READY if ready else NOT_READY,
               controller=ControllerRef(*owner) if owner is not None else None)


CASES = {
    "label selector counts every pod the selector matched": (
        LABEL_SELECTOR, "Deployment",
        [pod("a", ("ReplicaSet", "web-1")), pod("c", ("ReplicaSet", "canary-1")),
         pod("j", ("Job", "migrate")), pod("n", None)],
        ["a", "c", "j", "n"], 0, 0),
    "a deployment's pods through its replica set count, a canary's and a job's do not": (
        OWNER_REFERENCES, "Deployment",
        [pod("a", ("ReplicaSet", "web-1")), pod("c", ("ReplicaSet", "canary-1")),
         pod("j", ("Job", "migrate")), pod("n", None)],
        ["a"], 3, 0),
    "a pod of an unknown or ownerless replica set is not the target's": (
        OWNER_REFERENCES, "Deployment",
        [pod("a", ("ReplicaSet", "web-1")), pod("u", ("ReplicaSet", "gone")),
         pod("o", ("ReplicaSet", "orphan"))],
        ["a"], 2, 0),
    "a statefulset owns its pods directly": (
        OWNER_REFERENCES, "StatefulSet",
        [pod("s", ("StatefulSet", "web")), pod("x", ("StatefulSet", "other")),
         pod("r", ("ReplicaSet", "web-1"))],
        ["s"], 2, 0),
    "during a rollout the newest replica set's not-ready pods are left out": (
        OWNER_REFERENCES, "Deployment",
        [pod("old-a", ("ReplicaSet", "web-1")), pod("old-b", ("ReplicaSet", "web-1")),
         pod("new-a", ("ReplicaSet", "web-2")),
         pod("surge", ("ReplicaSet", "web-2"), ready=False),
         pod("pending", ("ReplicaSet", "web-2"), ready=False, phase="Pending")],
        ["old-a", "old-b", "new-a"], 0, 2),
    "during a rollout the old replica set's not-ready pods still count (upstream's rules)": (
        OWNER_REFERENCES, "Deployment",
        [pod("old", ("ReplicaSet", "web-1"), ready=False), pod("new", ("ReplicaSet", "web-2"))],
        ["old", "new"], 0, 0),
    "outside a rollout not-ready pods count (upstream's unready rules apply)": (
        OWNER_REFERENCES, "Deployment",
        [pod("a", ("ReplicaSet", "web-2")), pod("b", ("ReplicaSet", "web-2"), ready=False)],
        ["a", "b"], 0, 0),
}


@pytest.mark.parametrize(("strategy", "kind", "pods", "kept", "not_owned", "rollout"),
                         list(CASES.values()), ids=list(CASES))
def test_pod_selection(strategy: str, kind: str, pods: list[Pod], kept: list[str],
                       not_owned: int, rollout: int) -> None:
    selection = select_pods(strategy=strategy, target_kind=kind, target_name="web", pods=pods,
                            replica_sets=REPLICA_SETS)
    assert [p.name for p in selection.pods] == kept
    assert (selection.not_owned, selection.rollout_unready) == (not_owned, rollout)
    assert selection.ignored == not_owned + rollout


owners = st.one_of(st.none(), st.tuples(
    st.sampled_from(["ReplicaSet", "StatefulSet", "Job", "Deployment"]),
    st.sampled_from(["web", "web-1", "web-2", "canary-1", "orphan", "other"])))
pods_strategy = st.lists(st.builds(
    pod, name=st.text(min_size=1, max_size=5), owner=owners, ready=st.booleans(),
    phase=st.sampled_from(["Running", "Pending", "Succeeded"])), max_size=12)


@given(pods=pods_strategy, kind=st.sampled_from(["Deployment", "StatefulSet", "ReplicaSet"]))
def test_label_selector_hands_decide_upstreams_input_unchanged(pods: list[Pod],
                                                                kind: str) -> None:
    selection = select_pods(strategy=LABEL_SELECTOR, target_kind=kind, target_name="web",
                            pods=pods, replica_sets=REPLICA_SETS)
    assert selection.pods == tuple(pods)
    assert selection.ignored == 0


@given(pods=pods_strategy, kind=st.sampled_from(["Deployment", "StatefulSet", "ReplicaSet"]))
def test_owner_references_keeps_a_subsequence_and_counts_the_rest(pods: list[Pod],
                                                                   kind: str) -> None:
    selection = select_pods(strategy=OWNER_REFERENCES, target_kind=kind, target_name="web",
                            pods=pods, replica_sets=REPLICA_SETS)
    assert len(selection.pods) + selection.ignored == len(pods)
    remaining = iter(pods)
    assert all(any(kept is p for p in remaining) for kept in selection.pods)


def test_the_strategy_defaults_to_label_selector_and_refuses_others() -> None:
    assert parse_pod_selection_strategy({}) == LABEL_SELECTOR
    assert parse_pod_selection_strategy({"podSelectionStrategy": OWNER_REFERENCES}) \
        == OWNER_REFERENCES
    with pytest.raises(ModelError, match=r"spec\.podSelectionStrategy"):
        parse_pod_selection_strategy({"podSelectionStrategy": "Owners"})


def test_pods_and_replica_sets_keep_their_controller_owner_and_revision() -> None:
    owner = [{"kind": "Deployment", "name": "other", "uid": "u0"},
             {"kind": "Deployment", "name": "web", "uid": "u1", "controller": True}]
    rs = parse_replica_set({"metadata": {
        "name": "web-1", "namespace": "default", "ownerReferences": owner,
        "annotations": {"deployment.kubernetes.io/revision": "3"}}})
    assert rs == ReplicaSetOwner(name="web-1", namespace="default",
                                 controller=ControllerRef("Deployment", "web", "u1"),
                                 revision=3)
    parsed = parse_pod({"metadata": {"name": "p", "ownerReferences": [
        {"kind": "ReplicaSet", "name": "web-1", "uid": "u2", "controller": True}]}}, "pod")
    assert parsed.controller == ControllerRef("ReplicaSet", "web-1", "u2")
    assert parse_pod({"metadata": {"name": "p"}}, "pod").controller is None


def test_left_out_pods_lose_their_per_pod_metric_values_but_object_metrics_stay() -> None:
    when = T0
    pods_list = MetricValueList(items=tuple(
        MetricValue(described_kind="Pod", described_name=name, metric_name="rps",
                    timestamp=when, value=Quantity.parse("10")) for name in ("a", "job")))
    usage = PodMetricsList(items=tuple(
        PodMetrics(name=name, timestamp=when, window=timedelta(seconds=30))
        for name in ("a", "job")))
    kept = restrict_pod_metrics(["Pods", "Resource", "Object", "External"],
                                [pods_list, usage, pods_list, None], [pod("a", None)])
    assert isinstance(kept[0], MetricValueList)
    assert [v.described_name for v in kept[0].items] == ["a"]
    assert isinstance(kept[1], PodMetricsList)
    assert [m.name for m in kept[1].items] == ["a"]
    assert kept[2:] == [pods_list, None]


def test_explain_names_the_strategy_and_the_pods_the_controller_left_out() -> None:
    document = {
        "now": "2026-01-01T00:00:00Z",
        "autoscaler": {"apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
                       "metadata": {"name": "web", "namespace": "default"},
                       "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"},
                                "maxReplicas": 5, "podSelectionStrategy": OWNER_REFERENCES},
                       "status": {"ignoredPods": 2}},
        "scale": {"spec": {"replicas": 1}, "status": {"replicas": 1, "selector": "app=web"}},
    }
    snapshot = parse_snapshot(document)
    text = render_text(snapshot, decide_snapshot(snapshot))
    assert "Pod selection: OwnerReferences (KEP-5325): the controller's last decision left " \
           "out 2 of the selector's pods" in text
    del document["autoscaler"]["spec"]["podSelectionStrategy"]  # type: ignore[attr-defined]
    snapshot = parse_snapshot(document)
    assert "Pod selection" not in render_text(snapshot, decide_snapshot(snapshot))


def _owned_pod(name: str, replica_set: str | None, *, ready: bool = True) -> dict[str, object]:
    meta: dict[str, object] = {"name": name, "namespace": "default", "labels": {"app": "web"}}
    if replica_set is not None:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                    "name": replica_set, "uid": f"u-{replica_set}",
                                    "controller": True}]
    return {"metadata": meta, "status": {
        "phase": "Running", "startTime": "2025-12-31T23:00:00Z",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                        "lastTransitionTime": "2025-12-31T23:00:00Z"}]}}


def _replica_set(name: str, owner: str, revision: int) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": "default",
                         "annotations": {"deployment.kubernetes.io/revision": str(revision)},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                              "name": owner, "uid": f"u-{owner}",
                                              "controller": True}]}}


def _rps(names_and_values: list[tuple[str, str]]) -> dict[str, object]:
    return {"kind": "MetricValueList", "apiVersion": "custom.metrics.k8s.io/v1beta2",
            "items": [{"describedObject": {"kind": "Pod", "namespace": "default", "name": name,
                                           "apiVersion": "/v1"},
                       "metric": {"name": "rps"}, "timestamp": "2026-01-01T00:00:00Z",
                       "value": value} for name, value in names_and_values]}


def _selection_snapshot(*, replica_sets: list[dict[str, object]] | None) -> dict[str, object]:
    document: dict[str, object] = {
        "now": "2026-01-01T00:00:00Z",
        "autoscaler": {"apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
                       "metadata": {"name": "web", "namespace": "default"},
                       "spec": {"scaleTargetRef": {"apiVersion": "apps/v1",
                                                   "kind": "Deployment", "name": "web"},
                                "minReplicas": 1, "maxReplicas": 10,
                                "podSelectionStrategy": OWNER_REFERENCES,
                                "metrics": [{"type": "Pods", "pods": {
                                    "metric": {"name": "rps"},
                                    "target": {"type": "AverageValue",
                                               "averageValue": "10"}}}]}},
        "scale": {"spec": {"replicas": 2}, "status": {"replicas": 3, "selector": "app=web"}},
        # Two pods of web's old ReplicaSet at the target; a not-Ready surge pod of its new one
        # and a Job's pod sharing the label, each reporting a spike.
        "pods": {"kind": "PodList", "items": [
            _owned_pod("web-a", "web-1"), _owned_pod("web-b", "web-1"),
            _owned_pod("web-surge", "web-2", ready=False), _owned_pod("job-x", None)]},
        "metrics": [_rps([("web-a", "10"), ("web-b", "10"), ("web-surge", "90"),
                          ("job-x", "90")])],
    }
    if replica_sets is not None:
        document["replicaSets"] = replica_sets
    return document


def test_the_decision_selects_the_targets_own_pods_from_a_snapshots_replica_sets() -> None:
    snapshot = parse_snapshot(_selection_snapshot(replica_sets=[
        _replica_set("web-1", "web", 1), _replica_set("web-2", "web", 2)]))
    decision = decide_snapshot(snapshot)
    assert decision.ignored_pods == 2
    assert decision.desired_replicas == 2  # the spikes are left out: the size holds
    assert "Pod selection (OwnerReferences, KEP-5325): 2 of the selector's 4 pods count: 1 " \
           "not owned by Deployment/web, 1 not Ready in its newest ReplicaSet during a " \
           "rollout left out." in decision.explanation
    text = render_text(snapshot, decision)
    assert "Pod selection: OwnerReferences (KEP-5325): left out 2 of the selector's pods" in text
    assert render_decision(decision)["ignoredPods"] == 2


def test_a_replica_set_list_as_kubectl_prints_it_is_accepted() -> None:
    snapshot = parse_snapshot(_selection_snapshot(replica_sets={  # type: ignore[arg-type]
        "kind": "ReplicaSetList", "items": [_replica_set("web-1", "web", 1)]}))
    assert snapshot.replica_sets is not None and set(snapshot.replica_sets) == {"web-1"}


def test_without_replica_sets_a_snapshots_pods_count_as_given() -> None:
    snapshot = parse_snapshot(_selection_snapshot(replica_sets=None))
    decision = decide_snapshot(snapshot)
    assert decision.ignored_pods is None
    assert decision.desired_replicas > 2  # every pod's spike counts, as upstream's would
    assert "ignoredPods" not in render_decision(decision)


def test_label_selector_ignores_replica_sets() -> None:
    document = _selection_snapshot(replica_sets=[_replica_set("web-1", "web", 1)])
    del document["autoscaler"]["spec"]["podSelectionStrategy"]  # type: ignore[index]
    decision = decide_snapshot(parse_snapshot(document))
    assert decision.ignored_pods is None and decision.desired_replicas > 2
