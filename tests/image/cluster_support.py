"""The image's adapter against the session's real control plane (`control_plane`).

How the container reaches kube-apiserver: the adapter's container runs with `--network=host`
(as it always did to reach the Prometheus servers on the host), so it shares the host's
loopback and dials kube-apiserver at its own `https://127.0.0.1:<port>`; no traffic leaves
loopback, and 127.0.0.1 is among the IP SANs of the serving certificate `testbed.controlplane`
issues (checked by `container_server`, not assumed).

The adapter authenticates as the service account of `manifests/adapter/rbac.yaml`, bound as
`testbed.metricscale_adapter.adapter_rbac` binds it for a namespace of the test's own, with a
bound token in a kubeconfig written beside the test's other files: the control plane's own
directory is private to root and the container runs as UID 65532, so the cluster's CA is copied
next to the kubeconfig rather than pointed at.
"""

from __future__ import annotations

import contextlib
import ipaddress
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from cryptography import x509

from metricscale import pki
from testbed.controlplane import ControlPlane
from testbed.metricscale_adapter import ACCOUNT, adapter_rbac

__all__ = ["SERVICE", "ServingPair", "adapter_kubeconfig", "container_server", "serving_pair"]

SERVICE = "metricscale-adapter"
TOKEN_SECONDS = 3600


def container_server(cluster: ControlPlane) -> str:
    """kube-apiserver's URL as the host-networked container dials it: the same loopback
    address, which the serving certificate must name."""
    host = urlsplit(cluster.server).hostname
    assert host is not None
    address = ipaddress.ip_address(host)
    assert address.is_loopback, f"kube-apiserver is not on loopback: {cluster.server}"
    certificate = x509.load_pem_x509_certificate(cluster.serving.cert.read_bytes())
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert address in names.get_values_for_type(x509.IPAddress), \
        f"kube-apiserver's certificate does not cover {address}"
    return cluster.server


def _delete_all(cluster: ControlPlane, objects: list[dict[str, Any]]) -> None:
    for obj in reversed(objects):
        cluster.delete(obj)


@contextlib.contextmanager
def adapter_kubeconfig(cluster: ControlPlane, namespace: str, directory: Path
                       ) -> Iterator[Path]:
    """A kubeconfig (token of the manifests' adapter account in `namespace`, the cluster's CA
    beside it) for the container; the cluster-scoped RBAC is deleted afterwards (the rest goes
    with the namespace)."""
    directory.mkdir(parents=True, exist_ok=True)
    objects = adapter_rbac(namespace)
    applied: list[dict[str, Any]] = []
    try:
        for obj in objects:
            cluster.apply(obj)
            applied.append(obj)
        token = cluster.service_account_token(namespace, ACCOUNT, seconds=TOKEN_SECONDS)
        ca = shutil.copyfile(cluster.ca_file, directory / "cluster-ca.crt")
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {
                "server": container_server(cluster), "certificate-authority": str(ca)}}],
            "users": [{"name": ACCOUNT, "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": ACCOUNT,
                                                      "namespace": namespace}}],
        }
        kubeconfig = directory / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(config))
        yield kubeconfig
    finally:
        _delete_all(cluster, [obj for obj in applied
                              if obj["kind"] in ("ClusterRole", "ClusterRoleBinding")
                              or obj["metadata"].get("namespace") == "kube-system"])


@dataclass(frozen=True)
class ServingPair:
    cert: Path
    key: Path


def serving_pair(cluster: ControlPlane, directory: Path, namespace: str) -> ServingPair:
    """A serving certificate of the cluster's CA for the name the aggregator checks
    (`<service>.<namespace>.svc`), for `--tls-cert-file`."""
    directory.mkdir(parents=True, exist_ok=True)
    pair = pki.issue_serving_certificate(
        cluster.ca, common_name=SERVICE, dns_names=[f"{SERVICE}.{namespace}.svc", "localhost"],
        ip_addresses=["127.0.0.1"], now=datetime.now(UTC) - timedelta(minutes=5),
        validity=timedelta(days=1))
    return ServingPair(cert=pki.write_certificate(directory / "serving.crt", pair.certificate),
                       key=pki.write_private_key(directory / "serving.key", pair.private_key))
