"""What a cluster admin expects beside the programs, checked on what kustomize renders.

The base and every component: valid for the pinned Kubernetes; Linux nodes, a termination
message; the version labels of pyproject.toml's version on every object; namespace
`view`/`edit`/`admin` extended to Autoscalers (and to metrics.k8s.io with the resource-metrics
component), and critical priority when serving metrics.k8s.io.
"""

from __future__ import annotations

import shutil
import tempfile
import tomllib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from adapter.api.usage import render_resource_metrics_resource_list
from cli import certs
from cli.certs import CertsOptions, ensure_certificates
from tests.unit.test_manifests import (
    KUBERNETES_VERSION,
    MANIFESTS,
    REPO,
    by_kind,
    enable_components,
    kustomize,
    one,
)

Obj = dict[str, Any]
Rule = tuple[str, str, str]  # (API group, resource, verb)

VERSION: str = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
NAMESPACE = "metricscale"
ADAPTER = "metricscale-adapter"
AUTOSCALER = "metricscale-autoscaler"

RESOURCE_METRICS = "components/resource-metrics"
CERT_MANAGER = "components/cert-manager"
CERTS_FILES = "components/certs-files"
# Each way a user can combine the components (in the order manifests/kustomization.yaml asks
# for: resource-metrics, then a certificate component).
VARIANTS: dict[str, tuple[str, ...]] = {
    "base": (),
    "resource-metrics": (RESOURCE_METRICS,),
    "cert-manager": (RESOURCE_METRICS, CERT_MANAGER),
    "certs-files": (RESOURCE_METRICS, CERTS_FILES),
}
# Kinds whose CRDs are not in kubernetes-validate's schemas (installed by their operators).
CUSTOM_API_GROUPS = {"cert-manager.io", "monitoring.coreos.com"}

pytestmark = pytest.mark.kubectl


class Renderings:
    """`kubectl kustomize` of each variant, rendered once per module on first use."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._cache: dict[str, list[Obj]] = {}

    def __getitem__(self, variant: str) -> list[Obj]:
        if variant not in self._cache:
            self._cache[variant] = self._render(variant, VARIANTS[variant])
        return self._cache[variant]

    def _render(self, variant: str, components: tuple[str, ...]) -> list[Obj]:
        home = Path(tempfile.mkdtemp(prefix=f"{variant}-", dir=self._root))
        shutil.copytree(MANIFESTS, home / "manifests",
                        ignore=shutil.ignore_patterns(certs.CA_BUNDLE_PATCH))
        if CERTS_FILES in components:
            ensure_certificates(CertsOptions(directory=home / "certs",
                                             manifests=home / "manifests" / CERTS_FILES),
                                now=datetime.now(UTC))
        if components:
            enable_components(home / "manifests", *components)
        return kustomize(home / "manifests")

    def monitoring(self) -> list[Obj]:
        if "monitoring" not in self._cache:
            self._cache["monitoring"] = kustomize(MANIFESTS / "monitoring")
        return self._cache["monitoring"]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Renderings:
    return Renderings(tmp_path_factory.mktemp("renderings"))


def group_of(obj: Obj) -> str:
    api_version: str = obj["apiVersion"]
    return api_version.rpartition("/")[0]


def deployment(objects: list[Obj], name: str) -> Obj:
    return one(objects, "Deployment", name)


def pod_spec(objects: list[Obj], name: str) -> Obj:
    spec: Obj = deployment(objects, name)["spec"]["template"]["spec"]
    return spec


def pod_labels(objects: list[Obj], name: str) -> dict[str, str]:
    labels: dict[str, str] = deployment(objects, name)["spec"]["template"]["metadata"]["labels"]
    return labels


def matches(selector: Obj, labels: dict[str, str]) -> bool:
    """A label selector with matchLabels only (the manifests use no matchExpressions)."""
    assert set(selector) <= {"matchLabels"}, selector
    wanted: dict[str, str] = selector.get("matchLabels", {})
    return wanted.items() <= labels.items()


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_rendering_is_valid_for_the_pinned_kubernetes(rendered: Renderings,
                                                            variant: str) -> None:
    objects = rendered[variant]
    for obj in objects:
        if group_of(obj) in CUSTOM_API_GROUPS:
            continue
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    names = [(obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])
             for obj in objects]
    assert len(names) == len(set(names))


# ----------------------------------------------------------------------- scheduling and pods


@pytest.mark.parametrize("name", [ADAPTER, AUTOSCALER])
def test_pods_run_on_linux_nodes(rendered: Renderings, name: str) -> None:
    assert pod_spec(rendered["base"], name)["nodeSelector"] == {"kubernetes.io/os": "linux"}


@pytest.mark.parametrize("variant", VARIANTS)
def test_containers_fall_back_to_their_log_as_termination_message(rendered: Renderings,
                                                                  variant: str) -> None:
    for name in (ADAPTER, AUTOSCALER):
        spec = pod_spec(rendered[variant], name)
        for container in spec["containers"] + spec.get("initContainers", []):
            assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


# ------------------------------------------------------------------------------------ labels


def all_renderings(rendered: Renderings) -> Iterator[tuple[str, Obj]]:
    for variant in VARIANTS:
        for obj in rendered[variant]:
            yield variant, obj
    for obj in rendered.monitoring():
        yield "monitoring", obj


def test_every_object_carries_the_version_of_pyproject(rendered: Renderings) -> None:
    for variant, obj in all_renderings(rendered):
        labels = obj["metadata"].get("labels", {})
        where = (variant, obj["kind"], obj["metadata"]["name"])
        assert labels.get("app.kubernetes.io/version") == VERSION, where
        assert labels.get("app.kubernetes.io/part-of") == "metricscale", where


@pytest.mark.parametrize("name", [ADAPTER, AUTOSCALER])
def test_pods_carry_the_version_and_run_the_image_of_that_version(rendered: Renderings,
                                                                   name: str) -> None:
    labels = pod_labels(rendered["base"], name)
    assert labels["app.kubernetes.io/version"] == VERSION
    assert labels["app.kubernetes.io/part-of"] == "metricscale"
    (container,) = pod_spec(rendered["base"], name)["containers"]
    assert container["image"].rpartition(":")[2] == VERSION


def test_no_selector_names_the_version(rendered: Renderings) -> None:
    """Deployment selectors are immutable: a version in one would break every upgrade."""
    for variant, obj in all_renderings(rendered):
        spec = obj.get("spec", {})
        selectors = [spec.get("selector"), spec.get("podSelector")]
        for selector in selectors:
            if isinstance(selector, dict):
                flat = selector.get("matchLabels", selector)
                assert "app.kubernetes.io/version" not in flat, (variant, obj["kind"])


# ------------------------------------------------------------------- aggregated ClusterRoles

AGGREGATE_TO = "rbac.authorization.k8s.io/aggregate-to-{}"
# Kubernetes' own chain (bootstrap policy): `view` is labelled aggregate-to-edit and `edit`
# aggregate-to-admin, so what reaches view reaches edit and admin too.
AGGREGATED_INTO = {"view": ("view",), "edit": ("edit", "view"), "admin": ("admin", "edit", "view")}
READ = ("get", "list", "watch")
WRITE = ("create", "update", "patch", "delete", "deletecollection")


def aggregated_rules(objects: list[Obj], role: str) -> set[Rule]:
    """What our ClusterRoles add to Kubernetes' `view`, `edit` or `admin`."""
    found: set[Rule] = set()
    for cluster_role in by_kind(objects, "ClusterRole"):
        labels = cluster_role["metadata"].get("labels", {})
        if not any(labels.get(AGGREGATE_TO.format(into)) == "true"
                   for into in AGGREGATED_INTO[role]):
            continue
        assert "aggregationRule" not in cluster_role
        for rule in cluster_role["rules"]:
            # Never by name and never a non-resource URL: a namespace role holds neither.
            assert set(rule) == {"apiGroups", "resources", "verbs"}, rule
            found |= {(group, resource, verb) for group in rule["apiGroups"]
                      for resource in rule["resources"] for verb in rule["verbs"]}
    return found


def autoscaler_resources(objects: list[Obj]) -> tuple[str, str, list[str]]:
    """(group, plural, subresource paths) of the Autoscaler CRD as rendered."""
    crd = one(objects, "CustomResourceDefinition", "autoscalers.metricscale.dev")
    group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
    subresources = {name for version in crd["spec"]["versions"]
                    for name in version.get("subresources", {})}
    return group, plural, [f"{plural}/{name}" for name in sorted(subresources)]


def grants(group: str, resources: list[str], verbs: tuple[str, ...]) -> set[Rule]:
    return {(group, resource, verb) for resource in resources for verb in verbs}


def test_view_reads_autoscalers_and_their_status(rendered: Renderings) -> None:
    objects = rendered["base"]
    group, plural, subresources = autoscaler_resources(objects)
    # As `view` reads HorizontalPodAutoscalers and their status.
    assert aggregated_rules(objects, "view") == grants(group, [plural, *subresources], READ)


def test_edit_and_admin_manage_autoscalers_but_not_their_status(rendered: Renderings) -> None:
    objects = rendered["base"]
    group, plural, subresources = autoscaler_resources(objects)
    expected = grants(group, [plural, *subresources], READ) | grants(group, [plural], WRITE)
    # As `edit` writes HorizontalPodAutoscalers: the status is the controller's alone.
    assert aggregated_rules(objects, "edit") == expected
    assert aggregated_rules(objects, "admin") == expected


def test_resource_metrics_component_keeps_kubectl_top_for_view(rendered: Renderings) -> None:
    """metrics-server's aggregated reader, for what the adapter serves in metrics.k8s.io."""
    group, plural, subresources = autoscaler_resources(rendered["base"])
    autoscalers = grants(group, [plural, *subresources], READ)
    served = render_resource_metrics_resource_list()
    metrics_group = served["groupVersion"].split("/")[0]
    metrics = {(metrics_group, resource["name"], verb) for resource in served["resources"]
               for verb in resource["verbs"]}
    assert metrics == grants("metrics.k8s.io", ["pods", "nodes"], ("get", "list"))
    for variant in ("resource-metrics", "cert-manager", "certs-files"):
        objects = rendered[variant]
        for role in ("view", "edit", "admin"):
            assert aggregated_rules(objects, role) - aggregated_rules(rendered["base"], role) == (
                metrics), (variant, role)
        assert aggregated_rules(objects, "view") == autoscalers | metrics
    # Named apart from metrics-server's system:aggregated-metrics-reader, so that deleting
    # metrics-server's manifest does not delete ours.
    names = {role["metadata"]["name"] for role in by_kind(rendered["resource-metrics"],
                                                          "ClusterRole")}
    assert "system:aggregated-metrics-reader" not in names


# ------------------------------------------------------- critical priority for metrics.k8s.io


def test_only_the_resource_metrics_adapter_is_cluster_critical(rendered: Renderings) -> None:
    assert "priorityClassName" not in pod_spec(rendered["base"], ADAPTER)
    for variant in ("resource-metrics", "cert-manager", "certs-files"):
        objects = rendered[variant]
        # As metrics-server: `kubectl top` and every cpu/memory HPA depend on it.
        assert pod_spec(objects, ADAPTER)["priorityClassName"] == "system-cluster-critical"
        assert "priorityClassName" not in pod_spec(objects, AUTOSCALER)


def test_critical_pods_have_a_quota_where_clusters_limit_them(rendered: Renderings) -> None:
    """GKE, and any cluster that limits critical priority classes by default, admits such pods
    only in a namespace whose ResourceQuota covers the class."""
    assert by_kind(rendered["base"], "ResourceQuota") == []
    objects = rendered["resource-metrics"]
    (quota,) = by_kind(objects, "ResourceQuota")
    assert quota["metadata"]["namespace"] == NAMESPACE
    assert quota["spec"]["scopeSelector"] == {"matchExpressions": [
        {"scopeName": "PriorityClass", "operator": "In", "values": ["system-cluster-critical"]}]}
    strategy = deployment(objects, ADAPTER)["spec"]
    rollout = strategy["replicas"] + strategy["strategy"]["rollingUpdate"]["maxSurge"]
    assert int(quota["spec"]["hard"]["pods"]) >= rollout
    assert set(quota["spec"]["hard"]) == {"pods"}
