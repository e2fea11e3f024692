"""metricscale installed on the real control plane as a user installs it, its programs run here.

`kubectl apply -k` of an overlay of `manifests/` (with the resource-metrics component) that
changes only what a cluster without a container runtime needs: the Deployments at zero replicas
(the programs run as local processes instead, under the service accounts and RBAC the manifests
create), and the adapter's Service made an ExternalName Service for localhost on the adapter's
local port (see testbed.controlplane), with the APIServices pointing at that port.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testbed.binaries import CHECKOUT
from testbed.controlplane import ControlPlane, Kubelet
from testbed.processes import Child, free_port, wait_until

NAMESPACE = "metricscale"
ADAPTER_SA = "metricscale-adapter"
AUTOSCALER_SA = "metricscale-autoscaler"
APISERVICES = (("custom.metrics.k8s.io", "v1beta1"), ("custom.metrics.k8s.io", "v1beta2"),
               ("external.metrics.k8s.io", "v1beta1"), ("metrics.k8s.io", "v1beta1"))
DAY = 24 * 3600
RATE_WINDOW = "30s"


def write_overlay(directory: Path, *, adapter_port: int,
                  components: tuple[str, ...] = ("resource-metrics",)) -> Path:
    """A kustomization over the repository's manifests for this test bed."""
    directory.mkdir(parents=True, exist_ok=True)
    # kustomize takes other roots only as relative paths.
    manifests = Path(os.path.relpath(CHECKOUT / "manifests", directory))
    apiservice_patch = [{"op": "replace", "path": "/spec/service/port", "value": adapter_port}]
    kustomization: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [str(manifests)],
        "components": [str(manifests / "components" / name) for name in components],
        "patches": [
            {"target": {"kind": "Deployment"},
             "patch": json.dumps([{"op": "replace", "path": "/spec/replicas", "value": 0}])},
            {"target": {"kind": "Service", "name": "metricscale-adapter"},
             "patch": json.dumps([{"op": "replace", "path": "/spec", "value": {
                 "type": "ExternalName", "externalName": "localhost",
                 "ports": [{"name": "https", "port": adapter_port, "protocol": "TCP"}]}}])},
            *({"target": {"kind": "APIService", "name": f"{version}.{group}"},
               "patch": json.dumps(apiservice_patch)} for group, version in APISERVICES),
        ],
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return directory


@dataclass
class Installation:
    """The applied manifests and the two programs, running as their service accounts."""

    cluster: ControlPlane
    workdir: Path
    prometheus_url: str
    sync_period: str = "5s"
    adapter_port: int = field(default_factory=free_port)
    autoscaler_port: int = field(default_factory=free_port)
    adapter: Child | None = None
    autoscaler: Child | None = None
    autoscaler_args: tuple[str, ...] = ()
    kubelet: Kubelet | None = None

    def install(self) -> None:
        self.install_manifests()
        self.start_adapter()
        self.start_autoscaler()

    def install_manifests(self) -> None:
        overlay = write_overlay(self.workdir / "overlay", adapter_port=self.adapter_port)
        self.cluster.kubectl("apply", "-k", str(overlay))
        self.cluster.kubectl("wait", "--for=condition=Established", "--timeout=120s",
                             "crd/autoscalers.metricscale.dev")

    def kubeconfig_of(self, service_account: str) -> Path:
        token = self.cluster.service_account_token(NAMESPACE, service_account, seconds=DAY)
        return self.cluster.write_kubeconfig(f"{NAMESPACE}-{service_account}", token,
                                             path=self.workdir / f"{service_account}.kubeconfig")

    def adapter_config(self) -> Path:
        """The shipped rules from the applied ConfigMap, with two test-bed changes: the CPU
        rate window is 30s instead of 5m (upstream's HPA ignores a new pod's CPU until one
        window after it is Ready, and the tests should not wait five minutes for that), and
        one external rule (`queue_depth` by its `queue` label) is added."""
        configmap = self.cluster.get(
            f"/api/v1/namespaces/{NAMESPACE}/configmaps/metricscale-adapter-config")
        config = yaml.safe_load(configmap["data"]["config.yaml"])
        for resource in ("cpu", "memory"):
            rule = config["resourceRules"][resource]
            for key in ("containerQuery", "nodeQuery"):
                rule[key] = rule[key].replace("[5m]", f"[{RATE_WINDOW}]")
        config["resourceRules"]["window"] = RATE_WINDOW
        config["externalRules"] = [*(config.get("externalRules") or []), {
            "seriesQuery": '{__name__="queue_depth",queue!=""}',
            "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
            "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (queue)"}]
        path = self.workdir / "adapter-config.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def start_adapter(self) -> None:
        self.adapter = Child("metricscale-adapter", [
            sys.executable, "-m", "metricscale", "adapter",
            f"--secure-port={self.adapter_port}", "--bind-address=127.0.0.1",
            f"--kubeconfig={self.kubeconfig_of(ADAPTER_SA)}",
            f"--config={self.adapter_config()}",
            f"--prometheus-url={self.prometheus_url}",
            "--metrics-relist-interval=5s",
            f"--cert-dir={self.workdir / 'adapter-certs'}",
            "--self-managed-certs=on", f"--certs-namespace={NAMESPACE}",
            "--service-name=metricscale-adapter"],
            log=self.workdir / "adapter.log", cwd=CHECKOUT,
            env={"POD_NAMESPACE": NAMESPACE})
        for group, version in APISERVICES:
            self.cluster.wait_apiservice_available(group, version, timeout=180)

    def start_autoscaler(self) -> None:
        self.autoscaler = Child("metricscale-autoscaler", [
            sys.executable, "-m", "metricscale", "autoscaler",
            f"--kubeconfig={self.kubeconfig_of(AUTOSCALER_SA)}",
            f"--horizontal-pod-autoscaler-sync-period={self.sync_period}",
            f"--metrics-bind-address=127.0.0.1:{self.autoscaler_port}",
            f"--leader-elect-resource-namespace={NAMESPACE}", *self.autoscaler_args],
            log=self.workdir / "autoscaler.log", cwd=CHECKOUT,
            env={"POD_NAMESPACE": NAMESPACE, "POD_NAME": "metricscale-autoscaler-test"})

        def leading() -> bool:
            lease = self.cluster.request(
                "GET", f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases")
            return any((item.get("spec") or {}).get("holderIdentity")
                       for item in lease.get("items", [])
                       if item["metadata"]["name"] == "metricscale-autoscaler")

        assert self.autoscaler is not None
        wait_until(leading, what="the autoscaler holds its Lease", timeout=120,
                   children=[self.autoscaler])

    def stop(self) -> None:
        for child in (self.autoscaler, self.adapter):
            if child is not None:
                child.stop()
