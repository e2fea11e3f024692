"""`metricscale autoscaler` as a process against the fake API server: it takes the lease,
reconciles, serves /readyz, logs JSON lines naming their object, and on SIGTERM releases the
lease and exits 0 (how soon is not measured here: a busy machine decides that)."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
from pathlib import Path

import aiohttp

from testbed.fakes.kube_api import FakeKubeAPI
from tests.autoscaler.fake_cluster import (
    GROUP,
    NS,
    PLURAL,
    VERSION,
    autoscaler,
    condition,
    pods_metric,
    until,
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def lease_holder(fake: FakeKubeAPI) -> str | None:
    lease = fake.store.try_get("coordination.k8s.io", "v1", "leases", "metricscale-autoscaler",
                               namespace="metricscale")
    if lease is None:
        return None
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


async def test_sigterm_releases_the_lease_and_exits_cleanly(autoscaler_api: FakeKubeAPI,
                                                            tmp_path: Path) -> None:
    fake_kube = autoscaler_api
    fake_kube.create_namespace("metricscale")
    fake_kube.create_deployment("web", namespace=NS, replicas=2, labels={"app": "web"})
    fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
        "web", target="web", metrics=[pods_metric("http_requests", "10")]))
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "metricscale", "autoscaler",
        "--kubeconfig", str(fake_kube.write_kubeconfig(tmp_path / "kubeconfig")),
        "--leader-elect=true", "--leader-elect-resource-namespace=metricscale",
        "--leader-elect-lease-duration=2s", "--leader-elect-renew-deadline=1500ms",
        "--leader-elect-retry-period=1s", "--horizontal-pod-autoscaler-sync-period=1s",
        f"--metrics-bind-address=127.0.0.1:{port}", "--log-format=json",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env={"POD_NAME": "autoscaler-0", "PATH": "/usr/bin:/bin"})
    try:
        await until(lambda: bool(lease_holder(fake_kube)), what="the lease taken")
        await until(lambda: condition(fake_kube, "web", "AbleToScale") is not None,
                    what="a reconcile")
        async with aiohttp.ClientSession() as http, \
                http.get(f"http://127.0.0.1:{port}/readyz") as response:
            assert response.status == 200
        process.send_signal(signal.SIGTERM)
        _, stderr = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0
    assert lease_holder(fake_kube) == ""  # released: the standby need not wait it out
    lines = [json.loads(line) for line in stderr.decode().splitlines() if line.strip()]
    assert lines and all("object" in line and "message" in line for line in lines)
    about_web = [line for line in lines if line["object"] == f"{NS}/web"]
    assert about_web and all((line["namespace"], line["name"]) == (NS, "web")
                             for line in about_web)
    messages = [line["message"] for line in lines]
    assert any("released" in message for message in messages)
