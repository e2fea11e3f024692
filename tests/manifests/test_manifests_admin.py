"""What a cluster admin expects beside the programs, checked on what kustomize renders.

The base and every component: valid for the pinned Kubernetes; namespace `view`/`edit`/`admin`
extended to Autoscalers (and to metrics.k8s.io with the resource-metrics component); network
policies that let exactly the needed ports in; ServiceMonitors whose scrape jobs are the ones the
shipped alerts name; Linux nodes, a termination message, critical priority when serving
metrics.k8s.io; and the version labels of pyproject.toml's version on every object.
"""

from __future__ import annotations

import re
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
from adapter.security.selfcerts import CA_CERT_KEY
from adapter.settings import DEFAULT_CERTS_SECRET_NAME
from cli import certs
from cli.certs import CertsOptions, ensure_certificates
from tests.manifests.test_manifests import (
    KUBERNETES_VERSION,
    MANIFESTS,
    REPO,
    by_kind,
    enable_components,
    kustomize,
    one,
)
from tests.monitoring.support import alert_expressions

Obj = dict[str, Any]
Rule = tuple[str, str, str]  # (API group, resource, verb)

VERSION: str = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
NAMESPACE = "metricscale"
ADAPTER = "metricscale-adapter"
AUTOSCALER = "metricscale-autoscaler"

RESOURCE_METRICS = "components/resource-metrics"
SERVICE_MONITORS = "components/servicemonitors"
CERT_MANAGER = "components/cert-manager"
CERTS_FILES = "components/certs-files"
# Each way a user can combine the components (in the order manifests/kustomization.yaml asks
# for: resource-metrics, then servicemonitors, then a certificate component).
VARIANTS: dict[str, tuple[str, ...]] = {
    "base": (),
    "resource-metrics": (RESOURCE_METRICS,),
    "servicemonitors": (SERVICE_MONITORS,),
    "self-managed-all": (RESOURCE_METRICS, SERVICE_MONITORS),
    "cert-manager": (RESOURCE_METRICS, SERVICE_MONITORS, CERT_MANAGER),
    "certs-files": (RESOURCE_METRICS, SERVICE_MONITORS, CERTS_FILES),
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


def test_the_base_needs_no_custom_resource_definitions_but_its_own(rendered: Renderings) -> None:
    """`kubectl apply -k manifests` works in a cluster without prometheus-operator's CRDs."""
    assert {group_of(obj) for obj in rendered["base"]} & CUSTOM_API_GROUPS == set()
    assert {group_of(obj) for obj in rendered["resource-metrics"]} & CUSTOM_API_GROUPS == set()


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


# ---------------------------------------------------------------------------- NetworkPolicies


def container_ports(objects: list[Obj], name: str) -> dict[str, int]:
    (container,) = pod_spec(objects, name)["containers"]
    return {port["name"]: port["containerPort"] for port in container["ports"]}


def policies_for(objects: list[Obj], name: str) -> list[Obj]:
    labels = pod_labels(objects, name)
    return [policy for policy in by_kind(objects, "NetworkPolicy")
            if policy["metadata"]["namespace"] == NAMESPACE
            and matches(policy["spec"]["podSelector"], labels)]


def allowed_ports(policy: Obj) -> set[tuple[str, str]]:
    return {(str(port["port"]), port["protocol"]) for rule in policy["spec"]["ingress"]
            for port in rule["ports"]}


def test_every_pod_is_selected_by_exactly_one_ingress_only_policy(rendered: Renderings) -> None:
    objects = rendered["self-managed-all"]
    for name in (ADAPTER, AUTOSCALER):
        (policy,) = policies_for(objects, name)
        # Egress stays open: the API server's address cannot be selected by pod or namespace
        # (see the policies' comments).
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        # Every container port is let in, by its name, and nothing else.
        assert allowed_ports(policy) == {(port, "TCP") for port in container_ports(objects, name)}
    (adapter_policy,) = policies_for(objects, ADAPTER)
    (autoscaler_policy,) = policies_for(objects, AUTOSCALER)
    assert adapter_policy is not autoscaler_policy


def test_the_adapters_serving_port_is_open_to_any_source(rendered: Renderings) -> None:
    """kube-apiserver dials it from a node or control-plane address, not from a pod."""
    objects = rendered["base"]
    (policy,) = policies_for(objects, ADAPTER)
    (rule,) = policy["spec"]["ingress"]
    assert "from" not in rule
    (port,) = rule["ports"]
    (container,) = pod_spec(objects, ADAPTER)["containers"]
    secure_port = next(int(arg.split("=", 1)[1]) for arg in container["args"]
                       if arg.startswith("--secure-port="))
    assert container_ports(objects, ADAPTER)[port["port"]] == secure_port


def test_the_autoscalers_metrics_port_is_open_to_monitoring_only(rendered: Renderings) -> None:
    objects = rendered["base"]
    (policy,) = policies_for(objects, AUTOSCALER)
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"], "an empty `from` would admit every source"
    peers = [(peer.get("namespaceSelector"), peer.get("podSelector")) for peer in rule["from"]]
    assert ({"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}, None) in peers
    # prometheus-operator's label on its Prometheus pods, in any namespace.
    assert ({}, {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}) in peers
    for peer in rule["from"]:
        assert "ipBlock" not in peer
        assert peer != {"namespaceSelector": {}}, "every pod of the cluster"
    (port,) = rule["ports"]
    (container,) = pod_spec(objects, AUTOSCALER)["containers"]
    metrics_port = container_ports(objects, AUTOSCALER)[port["port"]]
    assert f"--metrics-bind-address=:{metrics_port}" in container["args"]


# ------------------------------------------------------------- scraping: Services, ServiceMonitors


def alert_jobs() -> set[str]:
    return {job for expression in alert_expressions().values()
            for job in re.findall(r'\bjob\s*=\s*"([^"]+)"', expression)}


def scrape_jobs(objects: list[Obj]) -> dict[str, tuple[Obj, Obj]]:
    """job -> (ServiceMonitor, Service), as prometheus-operator labels the targets: the value of
    the Service's label named by jobLabel, or the Service's name without one."""
    jobs: dict[str, tuple[Obj, Obj]] = {}
    for monitor in by_kind(objects, "ServiceMonitor"):
        spec = monitor["spec"]
        namespaces = spec.get("namespaceSelector", {}).get(
            "matchNames", [monitor["metadata"]["namespace"]])
        (service,) = [service for service in by_kind(objects, "Service")
                      if service["metadata"]["namespace"] in namespaces
                      and matches(spec["selector"], service["metadata"].get("labels", {}))]
        port_names = {port["name"] for port in service["spec"]["ports"]}
        for endpoint in spec["endpoints"]:
            assert endpoint["port"] in port_names
            # Nothing may rewrite the job label after the operator sets it.
            assert "relabelings" not in endpoint
            assert not endpoint.get("honorLabels", False)
        labels = service["metadata"].get("labels", {})
        job = labels.get(spec.get("jobLabel", ""), service["metadata"]["name"])
        assert job not in jobs
        jobs[job] = (monitor, service)
    return jobs


def test_the_autoscaler_has_a_service_for_its_metrics_port(rendered: Renderings) -> None:
    objects = rendered["base"]
    service = one(objects, "Service", AUTOSCALER)
    assert service["metadata"]["namespace"] == NAMESPACE
    assert service["spec"]["selector"].items() <= pod_labels(objects, AUTOSCALER).items()
    assert not service["spec"]["selector"].items() <= pod_labels(objects, ADAPTER).items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in container_ports(objects, AUTOSCALER)
    assert port["name"] == port["targetPort"]


@pytest.mark.parametrize("variant", ["servicemonitors", "cert-manager", "certs-files"])
def test_service_monitors_scrape_the_jobs_the_alerts_name(rendered: Renderings,
                                                          variant: str) -> None:
    jobs = scrape_jobs(rendered[variant])
    assert alert_jobs() == {ADAPTER}
    assert alert_jobs() <= jobs.keys()
    # The PrometheusRule's header promises these two jobs.
    assert set(jobs) == {ADAPTER, AUTOSCALER}
    objects = rendered[variant]
    for job, (monitor, service) in jobs.items():
        assert monitor["metadata"]["namespace"] == NAMESPACE
        assert service["spec"]["selector"].items() <= pod_labels(objects, job).items()


def scraper_rules(objects: list[Obj], secret_name: str) -> list[Obj]:
    """The RBAC rules of the ServiceAccount whose token the Secret holds."""
    secret = one(objects, "Secret", secret_name)
    assert secret["type"] == "kubernetes.io/service-account-token"
    account = secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]
    assert one(objects, "ServiceAccount", account)["metadata"]["namespace"] == NAMESPACE
    subject = {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    rules: list[Obj] = []
    for binding in by_kind(objects, "ClusterRoleBinding") + by_kind(objects, "RoleBinding"):
        if subject in binding["subjects"]:
            rules += one(objects, binding["roleRef"]["kind"], binding["roleRef"]["name"])["rules"]
    return rules


def test_the_adapter_is_scraped_over_verified_tls_with_a_metrics_only_token(
        rendered: Renderings) -> None:
    objects = rendered["servicemonitors"]
    monitor, service = scrape_jobs(objects)[ADAPTER]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["scheme"], endpoint["path"]) == ("https", "https",
                                                                       "/metrics")
    assert service["metadata"]["name"] == certs.SERVICE_NAME
    # The adapter's own Secret (self-managed certificates) holds the CA; the serving
    # certificate names the Service, not the pod address Prometheus dials.
    assert endpoint["tlsConfig"] == {
        "ca": {"secret": {"name": DEFAULT_CERTS_SECRET_NAME, "key": CA_CERT_KEY}},
        "serverName": f"{certs.SERVICE_NAME}.{NAMESPACE}.svc"}
    authorization = endpoint["authorization"]
    assert authorization["type"] == "Bearer"
    assert authorization["credentials"]["key"] == "token"
    # /metrics is behind the adapter's delegated authorization: the token may read it and
    # nothing else.
    assert scraper_rules(objects, authorization["credentials"]["name"]) == [
        {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]


def test_the_scraper_account_is_applied_before_its_token_secret(rendered: Renderings) -> None:
    """The token controller fills a service-account-token Secret only for an account that
    exists (and deletes one whose account is missing)."""
    objects = rendered["servicemonitors"]
    monitor, _ = scrape_jobs(objects)[ADAPTER]
    secret_name = monitor["spec"]["endpoints"][0]["authorization"]["credentials"]["name"]
    secret = one(objects, "Secret", secret_name)
    account = secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]
    assert objects.index(one(objects, "ServiceAccount", account)) < objects.index(secret)


def test_the_autoscaler_is_scraped_over_plain_http(rendered: Renderings) -> None:
    monitor, _ = scrape_jobs(rendered["servicemonitors"])[AUTOSCALER]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["scheme"], endpoint["path"]) == ("http-metrics", "http",
                                                                       "/metrics")
    assert "tlsConfig" not in endpoint
    assert "authorization" not in endpoint


def test_cert_manager_component_verifies_the_scrape_against_its_ca(rendered: Renderings) -> None:
    objects = rendered["cert-manager"]
    monitor, _ = scrape_jobs(objects)[ADAPTER]
    (endpoint,) = monitor["spec"]["endpoints"]
    serving = one(objects, "Certificate", "metricscale-adapter-serving")
    # cert-manager's CA issuer writes ca.crt beside tls.crt in the Certificate's Secret.
    assert endpoint["tlsConfig"]["ca"] == {"secret": {"name": serving["spec"]["secretName"],
                                                      "key": "ca.crt"}}
    assert endpoint["tlsConfig"]["serverName"] in serving["spec"]["dnsNames"]


def test_certs_files_component_verifies_the_scrape_against_a_ca_secret(
        rendered: Renderings) -> None:
    objects = rendered["certs-files"]
    monitor, _ = scrape_jobs(objects)[ADAPTER]
    (endpoint,) = monitor["spec"]["endpoints"]
    tls = endpoint["tlsConfig"]
    assert "insecureSkipVerify" not in tls
    assert tls["ca"]["secret"]["key"] == certs.CA_CERT
    assert tls["ca"]["secret"]["name"] != DEFAULT_CERTS_SECRET_NAME  # no self-managed Secret
