"""The real metrics-server (v0.8.0, built by `make peers`) beside a `ControlPlane`.

It runs as upstream's manifest runs it (`manifests/base` of kubernetes-sigs/metrics-server:
the service account `kube-system/metrics-server` with its RBAC, `--kubelet-use-node-status-port`,
`--metric-resolution=15s`), with what a process outside the cluster needs instead of the
in-cluster defaults: the service account's token in a kubeconfig for the API server and for
delegated authentication and authorization, a serving certificate of the cluster's CA (the
APIService carries that CA, where upstream's sets `insecureSkipTLSVerify`), the loopback
address, and `--kubelet-preferred-address-types=InternalIP` (the stand-in's Nodes have only
that address). The kubelets' serving certificates are verified against the cluster's CA
(`--kubelet-certificate-authority`): `--kubelet-insecure-tls` is not needed, as the stand-in's
certificate names 127.0.0.1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testbed.aggregated import AggregatedServer
from testbed.binaries import find_peer
from testbed.controlplane import ControlPlane, ControlPlaneMissing

__all__ = ["METRICS_SERVER_RBAC", "MetricsServer"]

NAMESPACE = "kube-system"
ACCOUNT = "metrics-server"


def _binding(kind: str, name: str, role_kind: str, role: str,
             namespace: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": metadata,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind,
                        "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}]}


# The server's own RBAC of metrics-server v0.8.0's manifests/base/rbac.yaml (the reader role for
# users, system:aggregated-metrics-reader, is left out: the tests ask as system:masters).
METRICS_SERVER_RBAC: list[dict[str, Any]] = [
    {"apiVersion": "v1", "kind": "ServiceAccount",
     "metadata": {"name": ACCOUNT, "namespace": NAMESPACE}},
    _binding("RoleBinding", "metrics-server-auth-reader", "Role",
             "extension-apiserver-authentication-reader", NAMESPACE),
    _binding("ClusterRoleBinding", "metrics-server:system:auth-delegator", "ClusterRole",
             "system:auth-delegator"),
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
     "metadata": {"name": "system:metrics-server"},
     "rules": [{"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]},
               {"apiGroups": [""], "resources": ["pods", "nodes"],
                "verbs": ["get", "list", "watch"]}]},
    _binding("ClusterRoleBinding", "system:metrics-server", "ClusterRole",
             "system:metrics-server"),
]


class MetricsServer(AggregatedServer):
    """`with MetricsServer(cluster, workdir=...) as server:` starts it and waits until it
    serves (its informers synced); `point()` gives it v1beta1.metrics.k8s.io."""

    def __init__(self, cluster: ControlPlane, *, workdir: Path, resolution: str = "15s",
                 request_timeout: str = "10s", verbosity: int = 1) -> None:
        super().__init__(cluster, name="metrics-server", namespace=NAMESPACE,
                         service="metrics-server", workdir=workdir)
        self.resolution = resolution
        self.request_timeout = request_timeout
        self.verbosity = verbosity

    def start(self) -> None:
        binary = find_peer("metrics-server")
        if binary is None:
            raise ControlPlaneMissing("metrics-server not found (make peers builds it)")
        for obj in METRICS_SERVER_RBAC:
            self.cluster.apply(obj)
        kubeconfig = self.kubeconfig_of(ACCOUNT)
        self._run([
            str(binary),
            f"--secure-port={self.port}", "--bind-address=127.0.0.1",
            f"--tls-cert-file={self.cert}", f"--tls-private-key-file={self.key}",
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--kubelet-preferred-address-types=InternalIP",
            "--kubelet-use-node-status-port",
            f"--kubelet-certificate-authority={self.cluster.ca_file}",
            f"--kubelet-request-timeout={self.request_timeout}",
            f"--metric-resolution={self.resolution}",
            "--profiling=false",
            f"--v={self.verbosity}"])
        # It serves only once its node and pod informers have synced.
        self.wait_answering("/livez")

    def __enter__(self) -> MetricsServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
