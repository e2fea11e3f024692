"""`kubectl top` through the fake aggregator, against the adapter running the default rules on a
real Prometheus fed with cAdvisor's series: kubectl's own Go decoder is the client here.

The rules are the defaults with the `rate()` range (and `window`) cut from 5m to 5s: over 5m
a series younger than five minutes reads low (Prometheus divides by the whole range), which a
real cluster's long-lived cAdvisor series never shows but a test's fresh ones would. Every
other byte of the rules is the default's. CPU figures come from counters advancing in real
time and are compared within a tolerance; memory is a gauge and exact.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from adapter.rules.defaults import DEFAULT_CONFIG_YAML
from testbed.fakes.cadvisor import CAdvisor
from testbed.fakes.kube_api import FakeKubeAPI
from testbed.fakes.prometheus import ExporterPool, PrometheusServer
from testbed.fakes.tools import require_tool
from tests.adapter.harness import (
    SERVICE_NAME,
    SERVICE_NAMESPACE,
    RunningAdapter,
    running_adapter,
)

pytestmark = [pytest.mark.prometheus, pytest.mark.kubectl,
              pytest.mark.asyncio(loop_scope="module")]

MI = 1024 * 1024
# (namespace, pod, node, {container: (cores, bytes)}); names unique to this module, as the
# session's Prometheus is shared and the default rules select by name only.
PODS = [("top-a", "web-0", "top-n1", {"app": (0.25, 64 * MI), "sidecar": (0.05, 16 * MI)}),
        ("top-a", "web-1", "top-n2", {"app": (0.4, 96 * MI)}),
        ("top-b", "api-0", "top-n1", {"api": (0.1, 32 * MI)})]
NODES = ("top-n1", "top-n2")
CONFIG = DEFAULT_CONFIG_YAML.replace("[5m]", "[5s]").replace("window: 5m", "window: 5s")


@dataclass
class World:
    adapter: RunningAdapter
    kube: FakeKubeAPI
    cluster: Path
    kubectl: str


async def run_kubectl(world: World, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        world.kubectl, "--kubeconfig", str(world.cluster), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(30):
            stdout, stderr = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


def table(output: str) -> list[list[str]]:
    """kubectl's columns, header first."""
    return [line.split() for line in output.strip().splitlines()]


def millicores(text: str) -> float:
    return float(text[:-1]) if text.endswith("m") else float(text) * 1000


def mebibytes(text: str) -> float:
    assert text.endswith("Mi"), text
    return float(text[:-2])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(prometheus: PrometheusServer, exporter_pool: ExporterPool,
                tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    kubectl = require_tool("kubectl")
    workdir = tmp_path_factory.mktemp("kubectl-top")
    with exporter_pool.exporter() as exporter:
        cadvisor = CAdvisor(exporter)
        for node in NODES:
            cadvisor.add_node(node, system_cpu=0.2, system_memory=512 * MI)
        for namespace, pod, node, containers in PODS:
            for container, (cores, memory) in containers.items():
                cadvisor.set_container(namespace, pod, container, node=node, cpu=cores,
                                       memory=memory)
        async with cadvisor, FakeKubeAPI(workdir=workdir / "kube",
                                         availability_max_backoff=0.5) as kube:
            for namespace, pod, node, _ in PODS:
                kube.create_pod(pod, namespace=namespace, node_name=node, labels={"app": pod})
            kube.create_pod("done-0", namespace="top-a", node_name="top-n1", phase="Succeeded")
            for node in NODES:
                kube.create("", "v1", "nodes", {
                    "apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
                    "status": {"capacity": {"cpu": "2", "memory": "4Gi", "pods": "110"},
                               "allocatable": {"cpu": "2", "memory": "4Gi", "pods": "110"}}})
            # Five seconds of scrapes make the 5s rate settle.
            await prometheus.wait_for_async(
                'rate(container_cpu_usage_seconds_total{namespace="top-a",pod="web-0",'
                'container="app"}[5s])',
                lambda samples: len(samples) == 1 and abs(float(samples[0].value) - 0.25) < 0.03,
                timeout=30)
            async with running_adapter(
                    workdir=workdir / "adapter", config_text=CONFIG,
                    prometheus_url=prometheus.url,
                    kubeconfig=kube.write_kubeconfig(workdir / "kubeconfig")) as adapter:
                kube.create_apiservice(group="metrics.k8s.io", version="v1beta1",
                                       service_namespace=SERVICE_NAMESPACE,
                                       service_name=SERVICE_NAME,
                                       ca_bundle=adapter.pair.ca_pem)
                kube.set_service_endpoint(SERVICE_NAMESPACE, SERVICE_NAME, "127.0.0.1",
                                          adapter.port)
                await kube.wait_for_apiservice("v1beta1.metrics.k8s.io")
                cluster = kube.write_kubeconfig(workdir / "cluster.kubeconfig")
                yield World(adapter, kube, cluster, kubectl)


async def test_kubectl_top_pods_in_a_namespace(world: World) -> None:
    code, out, err = await run_kubectl(world, "top", "pods", "-n", "top-a")
    assert code == 0, err
    header, *rows = table(out)
    assert header == ["NAME", "CPU(cores)", "MEMORY(bytes)"]
    assert [row[0] for row in rows] == ["web-0", "web-1"]  # the Succeeded pod is not served
    by_name = {row[0]: row for row in rows}
    # Containers only: neither the pod cgroup (container="") nor the pause container counts.
    assert millicores(by_name["web-0"][1]) == pytest.approx(300, rel=0.25)
    assert mebibytes(by_name["web-0"][2]) == 80
    assert millicores(by_name["web-1"][1]) == pytest.approx(400, rel=0.25)
    assert mebibytes(by_name["web-1"][2]) == 96


async def test_kubectl_top_pods_with_containers(world: World) -> None:
    code, out, err = await run_kubectl(world, "top", "pods", "-n", "top-a", "--containers")
    assert code == 0, err
    header, *rows = table(out)
    assert header == ["POD", "NAME", "CPU(cores)", "MEMORY(bytes)"]
    assert [(row[0], row[1], row[3]) for row in rows] == [
        ("web-0", "app", "64Mi"), ("web-0", "sidecar", "16Mi"), ("web-1", "app", "96Mi")]


async def test_kubectl_top_pods_in_all_namespaces(world: World) -> None:
    code, out, err = await run_kubectl(world, "top", "pods", "-A")
    assert code == 0, err
    header, *rows = table(out)
    assert header == ["NAMESPACE", "NAME", "CPU(cores)", "MEMORY(bytes)"]
    assert [(row[0], row[1]) for row in rows] == [
        ("top-a", "web-0"), ("top-a", "web-1"), ("top-b", "api-0")]


async def test_kubectl_top_one_pod_and_a_missing_one(world: World) -> None:
    code, out, err = await run_kubectl(world, "top", "pod", "api-0", "-n", "top-b")
    assert code == 0, err
    [_, row] = table(out)
    assert row[0] == "api-0" and mebibytes(row[2]) == 32
    code, _, err = await run_kubectl(world, "top", "pod", "ghost", "-n", "top-b")
    assert code != 0
    assert 'pods "ghost" not found' in err


async def test_kubectl_top_nodes(world: World) -> None:
    code, out, err = await run_kubectl(world, "top", "nodes")
    assert code == 0, err
    header, *rows = table(out)
    assert header[:2] == ["NAME", "CPU(cores)"] and "MEMORY(bytes)" in header
    by_name = {row[0]: row for row in rows}
    assert set(by_name) == set(NODES)
    # top-n1: 0.2 system + web-0 (0.3) + api-0 (0.1) + two pause containers (0.001 each).
    assert millicores(by_name["top-n1"][1]) == pytest.approx(602, rel=0.25)
    n1_memory = 512 + 80 + 32 + 2 * 400 / 1024
    assert mebibytes(by_name["top-n1"][3]) == pytest.approx(n1_memory, abs=1)
    assert re.fullmatch(r"\d+%", by_name["top-n1"][2])  # from the Node's allocatable
