"""`metricscale adapter` as a process beside a `ControlPlane`, under its manifests' RBAC.

The service account and its bindings are those of `manifests/adapter/rbac.yaml`, given to an
account in a namespace of the caller's choosing (so it never touches an installation of the
manifests another test made in `metricscale`): the cluster-scoped objects get the namespace as
a suffix, and the Roles of the certificate Secret and the APIService patches are left out
(certificates here are files, `--self-managed-certs=off`).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml

from testbed.aggregated import AggregatedServer
from testbed.binaries import CHECKOUT
from testbed.controlplane import ControlPlane

__all__ = ["MetricscaleAdapter", "adapter_rbac"]

ACCOUNT = "metricscale-adapter"
_NEEDED = ("system:auth-delegator", "extension-apiserver-authentication-reader",
           "metricscale-adapter-resource-reader")


def adapter_rbac(namespace: str) -> list[dict[str, Any]]:
    """The adapter's read and delegation RBAC of the manifests, for ACCOUNT in `namespace`."""
    documents = yaml.safe_load_all((CHECKOUT / "manifests/adapter/rbac.yaml").read_text())
    objects: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "ServiceAccount",
                                      "metadata": {"name": ACCOUNT, "namespace": namespace}}]
    roles = {"metricscale-adapter-resource-reader"}
    for document in documents:
        if not document:
            continue
        obj = copy.deepcopy(document)
        kind = obj["kind"]
        metadata = obj["metadata"]
        if kind == "ClusterRole" and metadata["name"] in roles:
            metadata["name"] = f"{metadata['name']}-{namespace}"
        elif kind in ("ClusterRoleBinding", "RoleBinding") and obj["roleRef"]["name"] in _NEEDED:
            metadata["name"] = f"{metadata['name']}-{namespace}"
            if obj["roleRef"]["name"] in roles:
                obj["roleRef"]["name"] = f"{obj['roleRef']['name']}-{namespace}"
            for subject in obj["subjects"]:
                subject["namespace"] = namespace
        else:
            continue
        objects.append(obj)
    return objects


class MetricscaleAdapter(AggregatedServer):
    """`with MetricscaleAdapter(cluster, ...) as adapter:` starts it and waits until it is
    ready; `point()` gives it an APIService."""

    def __init__(self, cluster: ControlPlane, *, workdir: Path, config_text: str,
                 prometheus_url: str, namespace: str = "metricscale-side",
                 relist_interval: str = "10s", extra_args: tuple[str, ...] = ()) -> None:
        super().__init__(cluster, name="metricscale-adapter", namespace=namespace,
                         service="metricscale-adapter", workdir=workdir)
        self.config = workdir / "adapter-config.yaml"
        self.config.write_text(config_text)
        self.prometheus_url = prometheus_url
        self.relist_interval = relist_interval
        self.extra_args = extra_args

    def start(self) -> None:
        self.ensure_namespace()
        for obj in adapter_rbac(self.namespace):
            self.cluster.apply(obj)
        kubeconfig = self.kubeconfig_of(ACCOUNT)
        self._run([
            sys.executable, "-m", "metricscale", "adapter",
            f"--secure-port={self.port}", "--bind-address=127.0.0.1",
            f"--tls-cert-file={self.cert}", f"--tls-private-key-file={self.key}",
            f"--kubeconfig={kubeconfig}", f"--config={self.config}",
            f"--prometheus-url={self.prometheus_url}",
            f"--metrics-relist-interval={self.relist_interval}",
            "--self-managed-certs=off", *self.extra_args],
            env={"POD_NAMESPACE": self.namespace})
        self.wait_answering("/readyz")

    def __enter__(self) -> MetricscaleAdapter:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
