"""What the tests on the real control plane share: waiting for the cluster to get somewhere, the
Deployment they scale, and metricscale in native-HPA mode on a control plane of its own."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from testbed.binaries import CHECKOUT
from testbed.controlplane import CONTROLLERS, ControlPlane
from testbed.fakes.prometheus import PrometheusServer
from testbed.install import Installation
from testbed.pytest_plugin import require_peers

WITHOUT_HPA = tuple(c for c in CONTROLLERS if c != "horizontal-pod-autoscaler-controller")


async def until(check: Callable[[], object] | Callable[[], Awaitable[object]], *, what: str,
                within: float = 180) -> None:
    """Poll `check` (plain or async) until it holds. `within` guards against a hang; it is not
    a measure (the cluster's sync periods are; the test's own timeout is 900 s)."""
    deadline = time.monotonic() + within
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within:.0f} s: {what}")
        await asyncio.sleep(0.25)


def deployment(namespace: str, *, name: str = "web", replicas: int = 1,
               labels: Mapping[str, str] | None = None,
               cpu_request: str | None = None) -> dict[str, Any]:
    """Deployment `name` selecting app=`name` (its pods carry `labels` besides), one container
    `app` of an image nothing pulls (the kubelet stand-in runs pods without images)."""
    container: dict[str, Any] = {"name": "app", "image": "registry.invalid/app:1"}
    if cpu_request is not None:
        container["resources"] = {"requests": {"cpu": cpu_request}}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name, **(labels or {})}},
                                  "spec": {"containers": [container]}}}}


@contextlib.contextmanager
def native_hpa_installation(prometheus: PrometheusServer, *, name: str) -> Iterator[Installation]:
    """A control plane whose kube-controller-manager runs no HPA controller (the only way ours
    may share a cluster with it), and metricscale installed with `--enable-native-hpa` and the
    RBAC it needs; its kubelet stand-in (node `name`-a) scraped by `prometheus`."""
    require_peers("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                  "kubectl")
    with tempfile.TemporaryDirectory(prefix=f"metricscale-{name}-") as workdir, \
            ControlPlane(controllers=WITHOUT_HPA) as cluster:
        kubelet = cluster.start_kubelet((f"{name}-a",))
        prometheus.add_target(kubelet.address, job=f"kubelet-{name}")
        installed = Installation(cluster=cluster, workdir=Path(workdir),
                                 prometheus_url=prometheus.url,
                                 autoscaler_args=("--enable-native-hpa",))
        try:
            installed.install_manifests()
            cluster.kubectl("apply", "-f",
                            str(CHECKOUT / "manifests" / "autoscaler" / "native-hpa-rbac.yaml"))
            installed.start_adapter()
            installed.start_autoscaler()
            installed.kubelet = kubelet
            yield installed
        finally:
            installed.stop()
            prometheus.remove_target(kubelet.address)
