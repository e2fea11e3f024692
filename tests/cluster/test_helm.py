"""`helm install charts/metricscale` on a real control plane, as a user installs it, then
upgraded and uninstalled.

The control plane is this module's own: the chart's APIServices and ClusterRoles have the same
cluster-wide names as the kustomize installation of tests/cluster/conftest.py. The values do
what testbed/install.py's overlay does, with the chart's own keys (nothing runs containers
here): both Deployments at zero replicas, and the adapter's Service an ExternalName Service for
localhost on the adapter's local port, which the APIServices then name. The two programs run
as local processes under the service accounts the chart creates, as in testbed.install.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.binaries import CHECKOUT, find_peer
from testbed.controlplane import ControlPlane, KubeError
from testbed.fakes.prometheus import PrometheusServer
from testbed.install import APISERVICES, NAMESPACE, Installation
from testbed.processes import wait_until
from testbed.pytest_plugin import require_peers

CHART = CHECKOUT / "charts" / "metricscale"
RELEASE = "metricscale"
CRD = "autoscalers.metricscale.dev"
# What the programs write themselves (not Helm), and what every namespace has: left behind by
# `helm uninstall`, gone with the namespace (docs/helm.md, "Uninstall").
WRITTEN_BY_THE_PROGRAMS = {("Secret", "metricscale-adapter-certs"),
                           ("Lease", "metricscale-autoscaler")}
EVERY_NAMESPACE_HAS = {("ConfigMap", "kube-root-ca.crt"), ("ServiceAccount", "default")}
# The namespaced kinds the chart makes, with where to list them.
NAMESPACED_LISTS = {
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "Secret": "/api/v1/namespaces/{ns}/secrets",
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "Service": "/api/v1/namespaces/{ns}/services",
    "ResourceQuota": "/api/v1/namespaces/{ns}/resourcequotas",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "ReplicaSet": "/apis/apps/v1/namespaces/{ns}/replicasets",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
    "PodDisruptionBudget": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
    "Lease": "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
}


@dataclass
class HelmInstallation(Installation):
    """testbed.install.Installation, installed with `helm install` instead of kubectl apply -k."""

    notes: str = ""

    def helm(self, *args: str) -> subprocess.CompletedProcess[str]:
        home = self.workdir / "helm"
        env = {**os.environ, "HELM_CACHE_HOME": str(home / "cache"),
               "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")}
        argv = [str(find_peer("helm")), f"--kubeconfig={self.cluster.kubeconfig}",
                "--namespace", NAMESPACE, *args]
        result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=300,
                                env=env)
        assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stderr}"
        return result

    def values(self) -> Path:
        """The test bed's values: what testbed.install's overlay patches, as values."""
        path = self.workdir / "testbed-values.yaml"
        path.write_text(yaml.safe_dump({
            "prometheus": {"url": self.prometheus_url, "port": None},
            "replicas": 0,
            "autoscaler": {"replicas": 0},
            "resourceMetrics": {"enabled": True},
            "service": {"type": "ExternalName", "externalName": "localhost",
                        "port": self.adapter_port},
        }))
        return path

    def install(self) -> None:
        # As docs/helm.md says: the namespace first, labelled restricted.
        self.cluster.kubectl("create", "namespace", NAMESPACE)
        self.cluster.kubectl("label", "namespace", NAMESPACE,
                             "pod-security.kubernetes.io/enforce=restricted",
                             "pod-security.kubernetes.io/enforce-version=latest")
        self.notes = self.helm("install", RELEASE, str(CHART), "--values",
                               str(self.values())).stdout
        self.cluster.kubectl("wait", "--for=condition=Established", "--timeout=120s",
                             f"crd/{CRD}")
        self.start_adapter()
        self.start_autoscaler()


@pytest.fixture(scope="module")
def helm_installation(prometheus: PrometheusServer) -> Iterator[HelmInstallation]:
    require_peers("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                  "kubectl", "helm")
    with ControlPlane() as cluster, \
            tempfile.TemporaryDirectory(prefix="metricscale-helm-") as workdir:
        installed = HelmInstallation(cluster=cluster, workdir=Path(workdir),
                                     prometheus_url=prometheus.url)
        try:
            installed.install()
            yield installed
        finally:
            installed.stop()


def manifest_objects(installed: HelmInstallation) -> list[dict[str, Any]]:
    manifest = installed.helm("get", "manifest", RELEASE).stdout
    return [doc for doc in yaml.safe_load_all(manifest) if doc]


def exists(cluster: ControlPlane, obj: dict[str, Any]) -> bool:
    try:
        cluster.get(cluster.object_path(obj))
    except KubeError as error:
        if error.status == 404:
            return False
        raise
    return True


# ----------------------------------------------------------------------------- install


def test_install_notes_say_how_to_check_the_apiservices(
        helm_installation: HelmInstallation) -> None:
    assert "kubectl get apiservices" in helm_installation.notes
    assert "ignored" not in helm_installation.notes  # the test bed sets no foreign key


def test_every_apiservice_is_available_through_the_real_aggregator(
        helm_installation: HelmInstallation) -> None:
    for group, version in APISERVICES:
        available, message = helm_installation.cluster.apiservice_available(group, version)
        assert available, f"{version}.{group}: {message}"


def test_kubectl_get_raw_lists_the_three_metric_groups(
        helm_installation: HelmInstallation) -> None:
    for group, version in APISERVICES:
        listed = json.loads(helm_installation.cluster.kubectl(
            "get", "--raw", f"/apis/{group}/{version}").stdout)
        assert listed["kind"] == "APIResourceList"
        assert listed["groupVersion"] == f"{group}/{version}"


def test_every_object_of_the_release_is_in_the_cluster_with_helms_labels(
        helm_installation: HelmInstallation) -> None:
    objects = manifest_objects(helm_installation)
    assert len(objects) > 30
    for obj in objects:
        live = helm_installation.cluster.get(helm_installation.cluster.object_path(obj))
        labels = live["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/part-of"] == "metricscale"
        assert live["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE


# ----------------------------------------------------------------------------- upgrade


def test_helm_upgrade_changes_a_value_in_the_cluster_and_keeps_the_apiservices_available(
        helm_installation: HelmInstallation) -> None:
    cluster = helm_installation.cluster
    external = {"seriesQuery": '{__name__="jobs_waiting",queue!=""}',
                "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
                "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (queue)"}
    more = helm_installation.workdir / "upgrade-values.yaml"
    # A prometheus-adapter values file's logLevel is ignored, and the notes say so.
    more.write_text(yaml.safe_dump({"autoscaler": {"syncPeriod": "30s"}, "logLevel": 4,
                                    "rules": {"external": [external]}}))
    upgraded = helm_installation.helm("upgrade", RELEASE, str(CHART),
                                      "--values", str(helm_installation.values()),
                                      "--values", str(more))
    assert "ignored here: logLevel" in upgraded.stdout

    (last,) = json.loads(helm_installation.helm("history", RELEASE, "--max", "1",
                                                "--output", "json").stdout)
    assert (last["revision"], last["status"]) == (2, "deployed")
    deployment = cluster.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/"
                             "metricscale-autoscaler")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--horizontal-pod-autoscaler-sync-period=30s" in args
    configmap = cluster.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/"
                            "metricscale-adapter-config")
    assert yaml.safe_load(configmap["data"]["config.yaml"])["externalRules"] == [external]
    # The caBundle the adapter wrote is not in the chart; the upgrade must leave it there.
    for group, version in APISERVICES:
        apiservice = cluster.get(f"/apis/apiregistration.k8s.io/v1/apiservices/"
                                 f"{version}.{group}")
        assert apiservice["spec"].get("caBundle"), f"{version}.{group} lost its caBundle"
        available, message = cluster.apiservice_available(group, version)
        assert available, f"{version}.{group}: {message}"


# ----------------------------------------------------------------------------- uninstall


def test_helm_uninstall_leaves_nothing_of_the_chart_but_its_crd(
        helm_installation: HelmInstallation) -> None:
    cluster = helm_installation.cluster
    objects = manifest_objects(helm_installation)
    assert len(objects) > 30
    helm_installation.stop()  # the programs would write their Secret and Lease again
    helm_installation.helm("uninstall", RELEASE, "--wait")

    assert [f"{obj['kind']}/{obj['metadata']['name']}" for obj in objects
            if exists(cluster, obj)] == []
    assert exists(cluster, {"apiVersion": "apiextensions.k8s.io/v1",
                            "kind": "CustomResourceDefinition", "metadata": {"name": CRD}})
    apiservices = cluster.get("/apis/apiregistration.k8s.io/v1/apiservices")["items"]
    assert not [a["metadata"]["name"] for a in apiservices
                if "metricscale" in json.dumps(a["metadata"].get("labels", {}))]

    def namespace_contents() -> set[tuple[str, str]]:
        return {(kind, item["metadata"]["name"])
                for kind, path in NAMESPACED_LISTS.items()
                for item in cluster.get(path.format(ns=NAMESPACE))["items"]}

    # The garbage collector removes the Deployments' ReplicaSets after the Deployments.
    expected = WRITTEN_BY_THE_PROGRAMS | EVERY_NAMESPACE_HAS
    wait_until(lambda: namespace_contents() == expected, timeout=60,
               what=f"the namespace holds only {sorted(expected)}")
    assert json.loads(helm_installation.helm("list", "--all", "--output", "json").stdout) == []
