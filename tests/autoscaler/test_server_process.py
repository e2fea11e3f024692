"""`metricscale autoscaler` as a process against the real kube-apiserver: it takes the lease,
reconciles, serves /readyz, logs JSON lines naming their object, and on SIGTERM releases the
lease and exits 0 (how soon is not measured here: a busy machine decides that).

The cluster is the session's, shared with other modules: the process watches only the test's
namespace (`--namespace`) and holds its Lease there; the Autoscaler CRD is applied from
manifests/ (the same object every module applies)."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import aiohttp

from testbed.controlplane import ControlPlane, KubeError
from tests.autoscaler.autoscaler_objects import autoscaler, pods_metric, until
from tests.autoscaler.real_cluster_support import condition, install_crd

LEASE = "metricscale-autoscaler"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def deployment(name: str, namespace: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{
                                      "name": "app", "image": "registry.k8s.io/pause:3.10"}]}}}}


def lease_holder(cluster: ControlPlane, namespace: str) -> str | None:
    try:
        lease = cluster.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{LEASE}")
    except KubeError as error:
        if error.status == 404:
            return None
        raise
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


async def test_sigterm_releases_the_lease_and_exits_cleanly(
        control_plane: ControlPlane, namespace: str, tmp_path: Path) -> None:
    cluster = control_plane
    install_crd(cluster)
    cluster.apply(deployment("web", namespace, 2))
    obj = autoscaler("web", target="web", metrics=[pods_metric("http_requests", "10")])
    obj["metadata"]["namespace"] = namespace
    cluster.apply(obj)
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "metricscale", "autoscaler",
        "--kubeconfig", str(cluster.kubeconfig), f"--namespace={namespace}",
        "--leader-elect=true", f"--leader-elect-resource-namespace={namespace}",
        "--leader-elect-lease-duration=2s", "--leader-elect-renew-deadline=1500ms",
        "--leader-elect-retry-period=1s", "--horizontal-pod-autoscaler-sync-period=1s",
        f"--metrics-bind-address=127.0.0.1:{port}", "--log-format=json",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env={"POD_NAME": "autoscaler-0", "PATH": "/usr/bin:/bin"})
    try:
        # `within` guards against a hang; a busy machine may take its time.
        await until(lambda: bool(lease_holder(cluster, namespace)), what="the lease taken",
                    within=300)
        await until(lambda: condition(cluster, namespace, "web", "AbleToScale") is not None,
                    what="a reconcile", within=300)
        async with aiohttp.ClientSession() as http, \
                http.get(f"http://127.0.0.1:{port}/readyz") as response:
            assert response.status == 200
        process.send_signal(signal.SIGTERM)
        _, stderr = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, stderr.decode()
    assert lease_holder(cluster, namespace) == ""  # released: the standby need not wait it out
    lines = [json.loads(line) for line in stderr.decode().splitlines() if line.strip()]
    assert lines and all("object" in line and "message" in line for line in lines)
    about_web = [line for line in lines if line["object"] == f"{namespace}/web"]
    assert about_web and all((line["namespace"], line["name"]) == (namespace, "web")
                             for line in about_web)
    messages = [line["message"] for line in lines]
    assert any("released" in message for message in messages)
