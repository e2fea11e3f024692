"""manifests/autoscaler: the Autoscaler CRD against upstream's autoscaling/v2 API and validation,
objects accepted and refused by its schema (and its CEL rules), RBAC, and the Deployment."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from cli import certs
from cli.certs import CertsOptions, ensure_certificates
from testbed.fakes.kube_cel import compile_rule, schema_rule_problems
from testbed.fakes.tools import require_tool
from tests.autoscaler.crd_support import (
    CRD,
    HERE,
    MANIFESTS,
    OBJECTS,
    SCHEMA,
    VERSION,
    Obj,
    cel_rules,
    one,
    problems,
)

KUBERNETES_VERSION = "1.32"
# The newest API the CRD mirrors field for field (behavior tolerance arrived in 1.33).
UPSTREAM_API_VERSION = "1.35"


# --------------------------------------------------------------------------------- the CRD


def test_crd_is_valid_for_the_pinned_kubernetes() -> None:
    kubernetes_validate.validate(CRD, KUBERNETES_VERSION, strict=True)


def test_crd_serves_v1alpha1_autoscalers_with_a_status_subresource_and_no_scale() -> None:
    spec = CRD["spec"]
    assert (spec["group"], spec["scope"]) == ("metricscale.dev", "Namespaced")
    assert spec["names"]["kind"] == "Autoscaler"
    assert spec["names"]["plural"] == "autoscalers"
    assert (VERSION["name"], VERSION["served"], VERSION["storage"]) == ("v1alpha1", True, True)
    assert VERSION["subresources"] == {"status": {}}


# Short names of built-in kinds (kubectl api-resources) and of widely installed CRDs.
TAKEN_SHORT_NAMES = {
    "cm", "cs", "csr", "crd", "crds", "deploy", "ds", "ep", "ev", "hpa", "ing", "ingclass",
    "limits", "netpol", "no", "ns", "pc", "pdb", "po", "psp", "pv", "pvc", "quota", "rc", "rs",
    "sa", "sc", "sts", "svc", "vpa", "so", "sj", "kpa", "pa", "ksvc", "smon", "pmon", "prom",
    "am", "cert", "certs", "cr", "issuer", "as",
}


def test_short_names_collide_with_no_builtin_or_common_resource() -> None:
    short_names = set(CRD["spec"]["names"]["shortNames"])
    assert short_names == {"msa"}
    assert not short_names & TAKEN_SHORT_NAMES


def test_printer_columns_are_those_of_kubectl_get_hpa() -> None:
    columns = [(c["name"].upper(), c["jsonPath"]) for c in VERSION["additionalPrinterColumns"]]
    assert columns == [
        ("REFERENCE", ".status.reference"), ("TARGETS", ".status.targets"),
        ("MINPODS", ".spec.minReplicas"), ("MAXPODS", ".spec.maxReplicas"),
        ("REPLICAS", ".status.currentReplicas"), ("AGE", ".metadata.creationTimestamp")]
    for _, path in columns[:-1]:
        node: Obj = SCHEMA
        for part in path.strip(".").split("."):
            node = node["properties"][part]
        assert node["type"] in {"string", "integer"}


# ------------------------------------------------------- fidelity to autoscaling/v2 (OpenAPI)


def upstream_definitions() -> dict[str, Any]:
    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    data = json.loads((root / f"v{UPSTREAM_API_VERSION}.0-local-strict" /
                       "_definitions.json").read_text())
    return dict(data["$defs"])


DEFINITIONS = upstream_definitions()
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
TIME = "io.k8s.apimachinery.pkg.apis.meta.v1.Time"


def resolve(node: Obj) -> tuple[str | None, Obj]:
    ref = node.get("$ref")
    if ref is None:
        return None, node
    name = ref.rsplit("/", 1)[-1]
    return name, DEFINITIONS[name]


def json_type(node: Obj) -> str:
    declared = node.get("type")
    if isinstance(declared, list):
        (declared,) = [t for t in declared if t != "null"]
    return str(declared)


def walk_upstream(node: Obj, path: str) -> Iterator[tuple[str, str, Obj]]:
    """(path, kind, upstream node) for every field under an upstream definition."""
    name, resolved = resolve(node)
    if name == QUANTITY:
        yield path, "quantity", resolved
        return
    if name == TIME:
        yield path, "time", resolved
        return
    kind = json_type(resolved)
    yield path, kind, resolved
    if kind == "object":
        for key, child in (resolved.get("properties") or {}).items():
            yield from walk_upstream(child, f"{path}.{key}")
        extra = resolved.get("additionalProperties")
        if isinstance(extra, dict):
            yield from walk_upstream(extra, f"{path}.*")
    if kind == "array":
        yield from walk_upstream(resolved["items"], f"{path}[]")


def ours(path: str) -> Obj:
    node = SCHEMA
    for part in re.findall(r"[^.\[\]]+|\[\]", path):
        if part == "[]":
            node = node["items"]
        elif part == "*":
            node = node["additionalProperties"]
        else:
            node = node["properties"][part]
    return node


def upstream_fields(definition: str, root: str) -> list[tuple[str, str, Obj]]:
    return list(walk_upstream({"$ref": f"#/$defs/{definition}"}, root))


SPEC_FIELDS = upstream_fields("io.k8s.api.autoscaling.v2.HorizontalPodAutoscalerSpec", "spec")
STATUS_FIELDS = upstream_fields("io.k8s.api.autoscaling.v2.HorizontalPodAutoscalerStatus",
                                "status")


@pytest.mark.parametrize(("path", "kind", "upstream"), SPEC_FIELDS + STATUS_FIELDS,
                         ids=[f[0] for f in SPEC_FIELDS + STATUS_FIELDS])
def test_every_autoscaling_v2_field_is_in_the_crd_with_its_type_and_required_fields(
        path: str, kind: str, upstream: Obj) -> None:
    node = ours(path)
    if kind == "quantity":
        assert node["x-kubernetes-int-or-string"] is True
        assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}]
        assert "pattern" in node
    elif kind == "time":
        assert (node["type"], node["format"]) == ("string", "date-time")
    else:
        assert node["type"] == kind
        if kind == "object":
            assert sorted(node.get("required", [])) == sorted(upstream.get("required", []))
            assert set(node.get("properties", {})) >= set(upstream.get("properties", {}))
    for marker in ("x-kubernetes-list-type", "x-kubernetes-list-map-keys",
                   "x-kubernetes-map-type"):
        assert node.get(marker) == upstream.get(marker), marker


# Our extensions of the autoscaling/v2 spec (each documented in the README), by field path.
EXTENSIONS = ("fallback", "syncPeriodSeconds", "podSelectionStrategy", "activationThreshold",
              "idle")


def test_the_crd_spec_has_no_field_autoscaling_v2_lacks_but_our_extensions() -> None:
    upstream_paths = {p for p, _, _ in SPEC_FIELDS}

    def our_paths(node: Obj, path: str) -> Iterator[str]:
        yield path
        for key, child in (node.get("properties") or {}).items():
            yield from our_paths(child, f"{path}.{key}")
        if isinstance(node.get("additionalProperties"), dict):
            yield from our_paths(node["additionalProperties"], f"{path}.*")
        if "items" in node:
            yield from our_paths(node["items"], f"{path}[]")

    ours = set(our_paths(SCHEMA["properties"]["spec"], "spec"))
    extended = {p for p in ours if any(f".{name}" in p for name in EXTENSIONS)}
    assert ours - extended == upstream_paths
    sources = ("object", "pods", "resource", "containerResource", "external")
    assert extended == {f"spec.metrics[].{source}.fallback{leaf}" for source in sources
                        for leaf in ("", ".replicas", ".failureThreshold",
                                     ".failureDurationSeconds", ".behavior")} | {
        f"spec.metrics[].{source}.activationThreshold" for source in sources} | {
        "spec.behavior.syncPeriodSeconds", "spec.podSelectionStrategy", "spec.idle",
        "spec.idle.replicas", "spec.idle.cooldownSeconds"}


def test_every_cel_rule_compiles_in_real_cel() -> None:
    rules = list(cel_rules(SCHEMA))
    assert len(rules) >= 10
    assert schema_rule_problems(SCHEMA, "openAPIV3Schema") == []
    for _, _, rule in rules:
        compile_rule(rule)


def autoscaler(spec: Obj, status: Obj | None = None) -> Obj:
    obj: Obj = {"apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
                "metadata": {"name": "web", "namespace": "shop"}, "spec": spec}
    if status is not None:
        obj["status"] = status
    return obj


TARGET = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}
CPU = {"type": "Resource", "resource": {"name": "cpu",
                                        "target": {"type": "Utilization",
                                                   "averageUtilization": 60}}}
EVERY_METRIC = [
    CPU,
    {"type": "Resource", "resource": {"name": "memory",
                                      "target": {"type": "AverageValue", "averageValue": "512Mi"}}},
    {"type": "ContainerResource", "containerResource": {
        "name": "cpu", "container": "app", "target": {"type": "Utilization",
                                                      "averageUtilization": 50}}},
    {"type": "Pods", "pods": {"metric": {"name": "http_requests_per_second"},
                              "target": {"type": "AverageValue", "averageValue": "100"}}},
    {"type": "Object", "object": {
        "describedObject": {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                            "name": "main"},
        "metric": {"name": "requests_per_second",
                   "selector": {"matchLabels": {"verb": "GET"}}},
        "target": {"type": "Value", "value": "10k"}}},
    {"type": "External", "external": {
        "metric": {"name": "queue_messages_ready",
                   "selector": {"matchExpressions": [
                       {"key": "queue", "operator": "In", "values": ["orders"]}]}},
        "target": {"type": "AverageValue", "averageValue": 30}}},
]
BEHAVIOR = {
    "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15},
                             {"type": "Percent", "value": 100, "periodSeconds": 15}],
                "tolerance": "0.05"},
    "scaleDown": {"stabilizationWindowSeconds": 300, "selectPolicy": "Disabled",
                  "policies": [{"type": "Percent", "value": 10, "periodSeconds": 60}]},
}

VALID = {
    "minimal": {"scaleTargetRef": TARGET, "maxReplicas": 3},
    "every metric type and a behavior": {"scaleTargetRef": TARGET, "minReplicas": 2,
                                         "maxReplicas": 20, "metrics": EVERY_METRIC,
                                         "behavior": BEHAVIOR},
    "min equals max": {"scaleTargetRef": TARGET, "minReplicas": 4, "maxReplicas": 4,
                       "metrics": [CPU]},
    "scale to zero with an external metric": {"scaleTargetRef": TARGET, "minReplicas": 0,
                                              "maxReplicas": 5, "metrics": EVERY_METRIC[-1:]},
    "a custom resource target": {"scaleTargetRef": {"apiVersion": "example.com/v1",
                                                    "kind": "Widget", "name": "w.1"},
                                 "maxReplicas": 2},
    "idle at 0 with activation thresholds": {
        "scaleTargetRef": TARGET, "maxReplicas": 5, "idle": {"cooldownSeconds": 60},
        "metrics": [{"type": "External", "external": {
            **EVERY_METRIC[-1]["external"], "activationThreshold": "0.5"}},
            {**CPU, "resource": {**CPU["resource"], "activationThreshold": 5}}]},
    "idle at 2 below minReplicas 3": {"scaleTargetRef": TARGET, "minReplicas": 3,
                                      "maxReplicas": 5, "idle": {"replicas": 2}},
}


@pytest.mark.parametrize("name", VALID)
def test_schema_accepts(name: str) -> None:
    assert problems(autoscaler(VALID[name])) == []


def with_metric(metric: Obj, **spec: Any) -> Obj:
    return {"scaleTargetRef": TARGET, "maxReplicas": 5, "metrics": [metric], **spec}


def resource_target(**target: Any) -> Obj:
    return {"type": "Resource", "resource": {"name": "cpu", "target": target}}


def pods_target(**target: Any) -> Obj:
    return {"type": "Pods", "pods": {"metric": {"name": "qps"}, "target": target}}


def scaling(**rules: Any) -> Obj:
    return {"scaleTargetRef": TARGET, "maxReplicas": 5, "behavior": {"scaleDown": rules}}


INVALID: dict[str, tuple[Obj, str]] = {
    "maxReplicas missing": ({"scaleTargetRef": TARGET},
        "'maxReplicas' is a required"),
    "scaleTargetRef missing": ({"maxReplicas": 3},
        "'scaleTargetRef' is a required"),
    "scaleTargetRef without kind": ({"scaleTargetRef": {"name": "web"}, "maxReplicas": 3},
        "'kind' is a required"),
    "target name with a slash": ({"scaleTargetRef": {**TARGET, "name": "a/b"}, "maxReplicas": 3},
        'scaleTargetRef.name'),
    "target name ..": ({"scaleTargetRef": {**TARGET, "name": ".."}, "maxReplicas": 3},
        'scaleTargetRef.name'),
    "maxReplicas 0": ({"scaleTargetRef": TARGET, "maxReplicas": 0},
        'spec.maxReplicas'),
    "minReplicas negative": ({"scaleTargetRef": TARGET, "minReplicas": -1, "maxReplicas": 3},
        'spec.minReplicas'),
    "minReplicas above maxReplicas": ({"scaleTargetRef": TARGET, "minReplicas": 4,
                                      "maxReplicas": 3},
        'self.minReplicas <= self.maxReplicas'),
    "minReplicas 0 without Object or External metric": ({
        "scaleTargetRef": TARGET, "minReplicas": 0, "maxReplicas": 3, "metrics": [CPU]},
        'self.metrics.exists'),
    "an unknown field": ({"scaleTargetRef": TARGET, "maxReplicas": 3, "maxPods": 4},
        "'maxPods' was unexpected"),
    "unknown metric type": (with_metric({"type": "Prometheus", "pods": pods_target(
        type="AverageValue", averageValue="1")["pods"]}),
        "'Prometheus' is not one of"),
    "metric type without its source": (with_metric({"type": "Pods"}),
        'has(self.pods)'),
    "metric with two sources": (with_metric({**pods_target(type="AverageValue", averageValue="1"),
                                            "resource": CPU["resource"]}),
        'has(self.resource)'),
    "unknown target type": (with_metric(resource_target(type="Average", averageUtilization=5)),
        "'Average' is not one of"),
    "utilization 0": (with_metric(resource_target(type="Utilization", averageUtilization=0)),
        'averageUtilization'),
    "resource with both targets": (with_metric(resource_target(
        type="Utilization", averageUtilization=5, averageValue="100m")),
        '!(has(self.target.averageUtilization)'),
    "resource with no target": (with_metric(resource_target(type="Utilization")),
        'has(self.target.averageUtilization) ||'),
    "pods metric without averageValue": (with_metric(pods_target(type="Value", value="1")),
        'has(self.target.averageValue)'),
    "negative quantity": (with_metric(pods_target(type="AverageValue", averageValue="-1")),
        "'-1' does not match"),
    "zero quantity": (with_metric(pods_target(type="AverageValue", averageValue="0.0m")),
        "'0.0m' does not match"),
    "not a quantity": (with_metric(pods_target(type="AverageValue", averageValue="ten")),
        "'ten' does not match"),
    "external with value and averageValue": (with_metric({"type": "External", "external": {
        "metric": {"name": "q"}, "target": {"type": "Value", "value": "1",
                                            "averageValue": "1"}}}),
        '!(has(self.target.value)'),
    "object without value": (with_metric({"type": "Object", "object": {
        "describedObject": TARGET, "metric": {"name": "q"},
        "target": {"type": "Utilization", "averageUtilization": 3}}}),
        'has(self.target.value) ||'),
    "bad selector operator": (with_metric({"type": "External", "external": {
        "metric": {"name": "q", "selector": {"matchExpressions": [
            {"key": "a", "operator": "Equals", "values": ["b"]}]}},
        "target": {"type": "Value", "value": "1"}}}),
        "'Equals' is not one of"),
    "invalid container name": (with_metric({"type": "ContainerResource", "containerResource": {
        "name": "cpu", "container": "App_1", "target": {"type": "Utilization",
                                                         "averageUtilization": 5}}}),
        "'App_1' does not match"),
    "selectPolicy unknown": (scaling(selectPolicy="Fastest"),
        "'Fastest' is not one of"),
    "window above an hour": (scaling(stabilizationWindowSeconds=3601),
        '3601 is greater'),
    "negative window": (scaling(stabilizationWindowSeconds=-1),
        '-1 is less'),
    "no policies": (scaling(policies=[]),
        'should be non-empty'),
    "policy type unknown": (scaling(policies=[{"type": "Replicas", "value": 1,
                                              "periodSeconds": 15}]),
        "'Replicas' is not one of"),
    "policy value 0": (scaling(policies=[{"type": "Pods", "value": 0, "periodSeconds": 15}]),
        '0 is less than the minimum of 1'),
    "policy period above 30 minutes": (scaling(policies=[{"type": "Pods", "value": 1,
                                                         "periodSeconds": 1801}]),
        '1801 is greater'),
    "negative tolerance": (scaling(tolerance="-0.1"),
        "'-0.1' does not match"),
    "idle replicas not below minReplicas": ({"scaleTargetRef": TARGET, "minReplicas": 2,
                                            "maxReplicas": 5, "idle": {"replicas": 2}},
        'self.idle.replicas < '),
    "idle replicas 1 with the default minReplicas": ({"scaleTargetRef": TARGET,
                                                     "maxReplicas": 5, "idle": {"replicas": 1}},
        'self.idle.replicas < '),
    "negative cooldown": ({"scaleTargetRef": TARGET, "maxReplicas": 5,
                           "idle": {"cooldownSeconds": -1}},
        '-1 is less'),
    "activation threshold not a quantity": (with_metric(
        {**pods_target(type="AverageValue", averageValue="1"),
         "pods": {**pods_target(type="AverageValue", averageValue="1")["pods"],
                  "activationThreshold": "some"}}),
        "'some' does not match"),
    "negative activation threshold": (with_metric(
        {"type": "External", "external": {"metric": {"name": "q"},
                                          "target": {"type": "Value", "value": "1"},
                                          "activationThreshold": "-1"}}),
        "'-1' does not match"),
}


@pytest.mark.parametrize("name", INVALID)
def test_schema_refuses(name: str) -> None:
    spec, expected = INVALID[name]
    found = problems(autoscaler(spec))
    assert any(expected in problem for problem in found), found


def test_status_with_conditions_metrics_and_history_is_accepted() -> None:
    status = {
        "observedGeneration": 3, "lastScaleTime": "2026-11-21T10:00:00Z",
        "currentReplicas": 3, "desiredReplicas": 6,
        "currentMetrics": [
            {"type": "Resource", "resource": {"name": "cpu", "current": {
                "averageUtilization": 120, "averageValue": "1200m"}}},
            {"type": "Pods", "pods": {
                "metric": {"name": "qps"}, "current": {"averageValue": "12"}}},
            {"type": ""}],  # a metric that could not be read, as upstream records it
        "conditions": [{"type": "AbleToScale", "status": "True", "reason": "SucceededRescale",
                        "message": "the HPA controller was able to update the target scale to 6",
                        "lastTransitionTime": "2026-11-21T10:00:00Z"}],
        "history": {"recommendations": [{"timestamp": "2026-11-21T09:59:45.123456Z",
                                         "replicas": 6}],
                    "scaleUpEvents": [{"timestamp": "2026-11-21T10:00:00Z", "replicaChange": 3,
                                       "outdated": False}],
                    "scaleDownEvents": []},
        "reference": "Deployment/web", "targets": "cpu: 120%/60%",
    }
    assert problems(autoscaler(VALID["minimal"], status)) == []


def test_status_history_without_timestamps_is_refused() -> None:
    status = {"desiredReplicas": 1, "history": {"recommendations": [{"replicas": 2}]}}
    assert problems(autoscaler(VALID["minimal"], status)) != []


def test_defaults_mirror_the_api_servers_hpa_defaulting() -> None:
    spec = SCHEMA["properties"]["spec"]["properties"]
    assert spec["minReplicas"]["default"] == 1
    assert spec["metrics"]["default"] == [CPU | {"resource": {
        "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]
    up = spec["behavior"]["properties"]["scaleUp"]["properties"]
    down = spec["behavior"]["properties"]["scaleDown"]["properties"]
    assert up["stabilizationWindowSeconds"]["default"] == 0
    assert "default" not in down["stabilizationWindowSeconds"]  # the controller's flag decides
    assert up["policies"]["default"] == [{"type": "Pods", "value": 4, "periodSeconds": 15},
                                         {"type": "Percent", "value": 100, "periodSeconds": 15}]
    assert down["policies"]["default"] == [{"type": "Percent", "value": 100,
                                            "periodSeconds": 15}]
    assert up["selectPolicy"]["default"] == down["selectPolicy"]["default"] == "Max"


# ------------------------------------------------------------------------------------- RBAC

SA = {"kind": "ServiceAccount", "name": "metricscale-autoscaler", "namespace": "metricscale"}


def grants(role: Obj) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def test_controller_role_is_least_privilege() -> None:
    role = one(OBJECTS, "ClusterRole", "metricscale-autoscaler")
    assert grants(role) == {
        ("metricscale.dev", "autoscalers", "get"), ("metricscale.dev", "autoscalers", "list"),
        ("metricscale.dev", "autoscalers", "watch"),
        ("metricscale.dev", "autoscalers/status", "update"),
        ("metricscale.dev", "autoscalers/status", "patch"),
        ("", "pods", "list"), ("", "pods", "watch"),
        ("apps", "replicasets", "list"), ("apps", "replicasets", "watch"),
        ("events.k8s.io", "events", "create"), ("events.k8s.io", "events", "patch")}
    binding = one(OBJECTS, "ClusterRoleBinding", "metricscale-autoscaler")
    assert binding["subjects"] == [SA]


def test_scale_targets_are_an_aggregated_role_users_extend_by_label() -> None:
    aggregated = one(OBJECTS, "ClusterRole", "metricscale-autoscaler-scale-targets")
    label = {"metricscale.dev/aggregate-to-autoscaler-scale": "true"}
    assert aggregated["aggregationRule"]["clusterRoleSelectors"] == [{"matchLabels": label}]
    apps = one(OBJECTS, "ClusterRole", "metricscale-autoscaler-scale-apps")
    assert label.items() <= apps["metadata"]["labels"].items()
    assert grants(apps) == {("apps", f"{r}/scale", v)
                            for r in ("deployments", "statefulsets", "replicasets")
                            for v in ("get", "update")} | {
        ("", "replicationcontrollers/scale", v) for v in ("get", "update")}
    assert one(OBJECTS, "ClusterRoleBinding",
               "metricscale-autoscaler-scale-targets")["subjects"] == [SA]


def test_leases_only_in_the_controllers_namespace_and_renewal_only_of_its_own() -> None:
    role = one(OBJECTS, "Role", "metricscale-autoscaler-leader-election")
    assert role["metadata"]["namespace"] == "metricscale"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "resourceNames": ["metricscale-autoscaler"], "verbs": ["get", "update"]}]
    binding = one(OBJECTS, "RoleBinding", "metricscale-autoscaler-leader-election")
    assert binding["subjects"] == [SA]


def test_native_hpa_permissions_are_opt_in() -> None:
    kustomization = yaml.safe_load((HERE / "kustomization.yaml").read_text())
    assert "native-hpa-rbac.yaml" not in kustomization["resources"]
    assert "# - native-hpa-rbac.yaml" in (HERE / "kustomization.yaml").read_text()
    role = one(OBJECTS, "ClusterRole", "metricscale-autoscaler-native-hpa")
    assert ("autoscaling", "horizontalpodautoscalers/status", "patch") in grants(role)
    assert ("autoscaling", "horizontalpodautoscalers", "watch") in grants(role)


def test_no_autoscaler_role_grants_wildcards() -> None:
    for role in (o for o in OBJECTS if o["kind"] in {"ClusterRole", "Role"}):
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]


# ------------------------------------------------------------------------------- Deployment

DEPLOYMENT = one(OBJECTS, "Deployment", "metricscale-autoscaler")
CONTAINER = DEPLOYMENT["spec"]["template"]["spec"]["containers"][0]


def test_deployment_runs_two_replicas_with_leader_election() -> None:
    assert DEPLOYMENT["spec"]["replicas"] == 2
    assert DEPLOYMENT["spec"]["template"]["spec"]["serviceAccountName"] == "metricscale-autoscaler"
    assert "--leader-elect=true" in CONTAINER["args"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in CONTAINER["env"]}
    assert env == {"POD_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name"}
    budget = one(OBJECTS, "PodDisruptionBudget", "metricscale-autoscaler")
    assert budget["spec"]["minAvailable"] == 1


def test_deployment_args_are_flags_the_autoscaler_accepts() -> None:
    from autoscaler.server import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert CONTAINER["command"] == ["metricscale"]
    subcommand, *flags = CONTAINER["args"]
    assert subcommand == "autoscaler"
    parsed, unknown = parser.parse_known_args(flags)
    assert unknown == []
    assert parsed.leader_elect is True


def test_probes_hit_the_health_endpoints_on_the_metrics_port() -> None:
    (port,) = CONTAINER["ports"]
    assert f"--metrics-bind-address=:{port['containerPort']}" in CONTAINER["args"]
    assert CONTAINER["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    assert CONTAINER["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port["name"]}
    security = CONTAINER["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}


# -------------------------------------------------------------------------------- kustomize


@pytest.mark.kubectl
def test_kustomize_renders_the_autoscaler_into_the_installation(tmp_path: Path) -> None:
    kubectl = require_tool("kubectl")
    shutil.copytree(MANIFESTS, tmp_path / "manifests")
    (tmp_path / "manifests" / certs.CA_BUNDLE_PATCH).unlink(missing_ok=True)
    ensure_certificates(CertsOptions(directory=tmp_path / "certs",
                                     manifests=tmp_path / "manifests"), now=datetime.now(UTC))
    rendered = subprocess.run([kubectl, "kustomize", str(tmp_path / "manifests")],
                              capture_output=True, text=True, check=False, timeout=120)
    assert rendered.returncode == 0, rendered.stderr
    objects = [doc for doc in yaml.safe_load_all(rendered.stdout) if doc is not None]
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert {("CustomResourceDefinition", "autoscalers.metricscale.dev"),
            ("Deployment", "metricscale-autoscaler"),
            ("ServiceAccount", "metricscale-autoscaler"),
            ("ClusterRole", "metricscale-autoscaler-scale-targets"),
            ("Role", "metricscale-autoscaler-leader-election")} <= names
    assert ("ClusterRole", "metricscale-autoscaler-native-hpa") not in names
    assert one(objects, "Deployment", "metricscale-autoscaler")["metadata"][
        "namespace"] == "metricscale"
