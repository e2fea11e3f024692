"""`metricscale autoscale`: the object it builds and the flags it rejects, in kubectl's words."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cli.autoscale import (
    AutoscaleError,
    Target,
    build_autoscaler,
    context_namespace,
    kubeconfig_path,
    parse_metric,
    parse_target,
)

WEB = Target(api_version="apps/v1", kind="Deployment", name="web")
CPU_50 = {"type": "Resource", "resource": {"name": "cpu", "target": {
    "type": "Utilization", "averageUtilization": 50}}}
CPU_80 = {"type": "Resource", "resource": {"name": "cpu", "target": {
    "type": "Utilization", "averageUtilization": 80}}}

# The spec of `kubectl autoscale deployment/web ... --dry-run=client -o yaml` (autoscaling/v2),
# with the 80% CPU the API server defaults an empty `metrics` to written out.
KUBECTL_CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("min_max_and_cpu_percent", {"min_replicas": 2, "max_replicas": 10, "cpu_percent": 50},
     {"maxReplicas": 10, "minReplicas": 2, "metrics": [CPU_50],
      "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}}),
    ("no_metric_flag_means_80_percent_cpu", {"min_replicas": 2, "max_replicas": 10,
                                             "cpu_percent": -1},
     {"maxReplicas": 10, "minReplicas": 2, "metrics": [CPU_80],
      "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}}),
    ("negative_min_is_left_unset", {"min_replicas": -1, "max_replicas": 3, "cpu_percent": 50},
     {"maxReplicas": 3, "metrics": [CPU_50],
      "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}}),
    ("min_equal_to_max", {"min_replicas": 4, "max_replicas": 4, "cpu_percent": 70},
     {"maxReplicas": 4, "minReplicas": 4, "metrics": [{"type": "Resource", "resource": {
         "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}}],
      "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}}),
]


@pytest.mark.parametrize(("flags", "spec"), [(f, s) for _, f, s in KUBECTL_CASES],
                         ids=[case[0] for case in KUBECTL_CASES])
def test_spec_matches_kubectl_autoscale(flags: dict[str, Any], spec: dict[str, Any]) -> None:
    obj = build_autoscaler(target=WEB, name=None, namespace="shop", **flags)
    assert obj["spec"] == spec
    assert obj["apiVersion"] == "metricscale.dev/v1alpha1"
    assert obj["kind"] == "Autoscaler"
    assert obj["metadata"] == {"name": "web", "namespace": "shop"}


def test_name_flag_overrides_the_target_name() -> None:
    obj = build_autoscaler(target=WEB, name="front", namespace="default", min_replicas=1,
                           max_replicas=2, cpu_percent=-1)
    assert obj["metadata"]["name"] == "front"
    assert obj["spec"]["scaleTargetRef"]["name"] == "web"


def test_metric_flags_become_pods_metrics_without_default_cpu() -> None:
    obj = build_autoscaler(target=WEB, name=None, namespace="default", min_replicas=1,
                           max_replicas=5, cpu_percent=-1,
                           metrics=[parse_metric("rps=100"), parse_metric("queue=0.5")])
    assert obj["spec"]["metrics"] == [
        {"type": "Pods", "pods": {"metric": {"name": "rps"},
                                  "target": {"type": "AverageValue", "averageValue": "100"}}},
        {"type": "Pods", "pods": {"metric": {"name": "queue"},
                                  "target": {"type": "AverageValue", "averageValue": "500m"}}},
    ]


def test_cpu_percent_and_metric_together_keep_both() -> None:
    obj = build_autoscaler(target=WEB, name=None, namespace="default", min_replicas=1,
                           max_replicas=5, cpu_percent=50, metrics=[parse_metric("rps=1k")])
    assert [m["type"] for m in obj["spec"]["metrics"]] == ["Resource", "Pods"]


REJECTED = [
    ("max_below_min", {"min_replicas": 5, "max_replicas": 2},
     "--max=MAXPODS must be larger or equal to --min=MINPODS, max: 2, min: 5"),
    ("max_zero", {"min_replicas": 1, "max_replicas": 0},
     "--max=MAXPODS is required and must be at least 1, max: 0"),
    ("max_missing", {"min_replicas": 1, "max_replicas": None}, 'required flag(s) "max" not set'),
    ("min_zero", {"min_replicas": 0, "max_replicas": 3}, "--min=MINPODS must be at least 1"),
]


@pytest.mark.parametrize(("flags", "message"), [(f, m) for _, f, m in REJECTED],
                         ids=[case[0] for case in REJECTED])
def test_invalid_replica_flags_use_kubectl_messages(flags: dict[str, Any], message: str) -> None:
    with pytest.raises(AutoscaleError) as caught:
        build_autoscaler(target=WEB, name=None, namespace="default", cpu_percent=-1, **flags)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


TARGETS = [
    (["deployment/web"], ("apps/v1", "Deployment", "web")),
    (["deploy", "web"], ("apps/v1", "Deployment", "web")),
    (["rs/web"], ("apps/v1", "ReplicaSet", "web")),
    (["replicasets", "web"], ("apps/v1", "ReplicaSet", "web")),
    (["sts/db"], ("apps/v1", "StatefulSet", "db")),
    (["statefulset", "db"], ("apps/v1", "StatefulSet", "db")),
    (["rc/old"], ("v1", "ReplicationController", "old")),
    (["Deployment/web"], ("apps/v1", "Deployment", "web")),
]


@pytest.mark.parametrize(("arguments", "expected"), TARGETS)
def test_targets_resolve_as_kubectl_resolves_them(arguments: list[str],
                                                  expected: tuple[str, str, str]) -> None:
    assert parse_target(arguments) == Target(*expected)


@pytest.mark.parametrize(("arguments", "message"), [
    ([], "You must provide one or more resources"),
    (["pod/web"], "cannot autoscale a Pod"),
    (["daemonset", "agent"], "cannot autoscale a DaemonSet"),
    (["widgets/web"], 'the server doesn\'t have a resource type "widgets"'),
    (["deployment"], "there is no need to specify a resource type"),
    (["deployment/"], "resource name may not be empty"),
    (["a", "b", "c"], "autoscale takes one resource"),
])
def test_unusable_targets_are_rejected(arguments: list[str], message: str) -> None:
    with pytest.raises(AutoscaleError, match=message.replace("(", r"\(")):
        parse_target(arguments)


@pytest.mark.parametrize("text", ["rps", "=100", "rps=", "rps=abc", "rps=0", "rps=-1"])
def test_bad_metric_flags_are_rejected(text: str) -> None:
    with pytest.raises(AutoscaleError, match="--metric="):
        parse_metric(text)


def test_kubeconfig_flag_then_env_then_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    (home / ".kube" / "config").write_text("{}")
    env_file = tmp_path / "env-config"
    env_file.write_text("{}")
    assert kubeconfig_path(flag="x", environ={"KUBECONFIG": str(env_file)}, home=home) == "x"
    # $KUBECONFIG stays a list: its files are merged as kubectl merges them
    assert kubeconfig_path(flag=None, environ={"KUBECONFIG": f"/missing:{env_file}"},
                           home=home) == f"/missing:{env_file}"
    assert kubeconfig_path(flag=None, environ={}, home=home) == str(home / ".kube" / "config")
    assert kubeconfig_path(flag=None, environ={}, home=tmp_path / "nobody") is None


def test_namespace_comes_from_the_context_else_default(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("current-context: a\ncontexts:\n"
                      "- name: a\n  context: {cluster: c, namespace: shop}\n"
                      "- name: b\n  context: {cluster: c}\n")
    assert context_namespace(str(config), None) == "shop"
    assert context_namespace(str(config), "b") == "default"
    assert context_namespace(None, None) == "default"
    assert context_namespace(str(tmp_path / "missing"), None) == "default"
