"""`kubectl top` through the real aggregator of the session's control plane, against the
adapter (`metricscale adapter`, the process, under its manifests' RBAC) running the default
rules on a real Prometheus that scrapes a kubelet stand-in's cAdvisor series: kubectl's own Go
decoder is the client here, and kube-apiserver the proxy in between.

The rules are the defaults with the `rate()` range (and `window`) cut from 5m to RANGE: over 5m
a series younger than five minutes reads low (Prometheus divides by the whole range), which a
real cluster's long-lived cAdvisor series never shows but a test's fresh ones would. Every
other byte of the rules is the default's. CPU figures come from counters advancing in real
time and are compared within a tolerance; memory is a gauge and exact.

The cluster is shared with the session's other modules: the pods live in namespaces of the
module's own, on two Nodes of its own that a kubelet stand-in of its own runs (cordoned, so
that the scheduler puts nobody else's pods there), and the Prometheus is the module's own and
scrapes only that stand-in. `v1beta1.metrics.k8s.io` is given back as it was at the end.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from adapter.rules.defaults import DEFAULT_CONFIG_YAML
from metricscale.core.quantity import parse_quantity
from testbed.aggregated import apiservice_given_back
from testbed.controlplane import ControlPlane, KubeError
from testbed.fakes.prometheus import PrometheusServer, count_of
from testbed.kubelet import ANNOTATION_PREFIX
from testbed.metricscale_adapter import MetricscaleAdapter
from testbed.processes import Child, wait_until
from tests.adapter.cluster import ModuleCluster, Names, node_manifest, pod_manifest

pytestmark = [pytest.mark.prometheus, pytest.mark.kubectl]

NAMES = Names.unique("kubectl-top")
MI = 1024 * 1024
TOP_A, TOP_B = NAMES.namespace("top-a"), NAMES.namespace("top-b")
N1, N2 = NAMES.cluster("n1"), NAMES.cluster("n2")
NODES = (N1, N2)
# (namespace, pod, node, {container: (cores, bytes)}): the stand-in's usage of each container.
PODS = [(TOP_A, "web-0", N1, {"app": ("0.25", 64 * MI), "sidecar": ("0.05", 16 * MI)}),
        (TOP_A, "web-1", N2, {"app": ("0.4", 96 * MI)}),
        (TOP_B, "api-0", N1, {"api": ("0.1", 32 * MI)})]
# Ten seconds (not the five the fake allowed): a rate needs two scrapes inside its range, and
# a busy machine delays the 1 s scrapes now and then.
RANGE = "10s"
CONFIG = DEFAULT_CONFIG_YAML.replace("[5m]", f"[{RANGE}]").replace("window: 5m",
                                                                     f"window: {RANGE}")
APISERVICE = "v1beta1.metrics.k8s.io"
METRICS = "/apis/metrics.k8s.io/v1beta1"
# Bounds on waits for conditions on a loaded machine (processes starting, scrapes, caches).
SETTLE_SECONDS = 180


@dataclass
class World:
    cluster: ControlPlane
    adapter: MetricscaleAdapter


def run_kubectl(world: World, *args: str) -> tuple[int, str, str]:
    """The control plane's kubectl, as the admin."""
    done = world.cluster.kubectl(*args, check=False, timeout=60)
    return done.returncode, done.stdout, done.stderr


def table(output: str) -> list[list[str]]:
    """kubectl's columns, header first."""
    return [line.split() for line in output.strip().splitlines()]


def millicores(text: str) -> float:
    return float(text[:-1]) if text.endswith("m") else float(text) * 1000


def mebibytes(text: str) -> float:
    assert text.endswith("Mi"), text
    return float(text[:-2])


def usage_annotation(containers: dict[str, tuple[str, int]]) -> dict[str, str]:
    return {ANNOTATION_PREFIX + "usage": json.dumps(
        {name: {"cpu": cpu, "memory": memory} for name, (cpu, memory) in containers.items()})}


def _served(document: Any) -> bool:
    """Every pod of PODS in `document` (a PodMetricsList of all namespaces) with its
    containers, their memory exact and their CPU settled near the usage given."""
    items = {(i["metadata"]["namespace"], i["metadata"]["name"]): i
             for i in document.get("items") or []}
    for namespace, pod, _, containers in PODS:
        item = items.get((namespace, pod))
        if item is None:
            return False
        found = {c["name"]: c["usage"] for c in item.get("containers") or []}
        if set(found) != set(containers):
            return False
        for name, (cores, memory) in containers.items():
            if parse_quantity(found[name]["memory"]) != memory:
                return False
            if abs(float(parse_quantity(found[name]["cpu"])) - float(cores)) > 0.02:
                return False
    return True


def _pods_gone(cluster: ControlPlane) -> bool:
    return not any(cluster.get(f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}")["items"]
                   for node in NODES)


@pytest.fixture(scope="module")
def world(control_plane: ControlPlane, cluster: ModuleCluster, prometheus_binary: str,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    workdir = tmp_path_factory.mktemp("kubectl-top")
    # A kubelet stand-in of the module's own for its two Nodes (the session's runs node-a and
    # node-b for every module of the worker, whose pods would add to the nodes' figures). The
    # Nodes are made cordoned before it registers them (it takes them over, status and
    # taints): the scheduler never puts anybody else's pod there.
    kubelet_child: Child | None = None
    try:
        for node in NODES:
            control_plane.apply(node_manifest(node))
        kubelet = control_plane.start_kubelet(NODES)
        kubelet_child = next(child for child in control_plane.children
                             if f"--nodes={','.join(NODES)}" in child.argv)
        with PrometheusServer(binary=prometheus_binary) as prometheus, \
                apiservice_given_back(control_plane, APISERVICE):
            prometheus.add_target(kubelet.address, job="kubelet")
            namespaces = {name: cluster.namespace(name) for name in ("top-a", "top-b")}
            assert set(namespaces.values()) == {TOP_A, TOP_B}
            for namespace, pod, node, containers in PODS:
                control_plane.apply(pod_manifest(
                    pod, namespace, node=node, labels={"app": pod},
                    containers=tuple(containers), annotations=usage_annotation(containers)))
            # Ran to its end: Succeeded, and cAdvisor reports nothing of it.
            control_plane.apply(pod_manifest(
                "done-0", TOP_A, node=N1, annotations={ANNOTATION_PREFIX + "phase": "Succeeded"}))
            # Two scrapes of every container's counter (and the nodes' root cgroups) make the
            # rate; RANGE of them make it settle.
            prometheus.wait_for(
                f'rate(container_cpu_usage_seconds_total{{namespace="{TOP_A}",pod="web-0",'
                f'container="app"}}[{RANGE}])',
                lambda samples: len(samples) == 1 and abs(float(samples[0].value) - 0.25) < 0.03,
                timeout=SETTLE_SECONDS)
            prometheus.wait_for(
                f'rate(container_cpu_usage_seconds_total{{id="/"}}[{RANGE}])', count_of(2),
                timeout=SETTLE_SECONDS)
            with MetricscaleAdapter(control_plane, workdir=workdir / "adapter",
                                    config_text=CONFIG, prometheus_url=prometheus.url,
                                    namespace=cluster.namespace("adapter")) as adapter:
                adapter.point()
                control_plane.wait_apiservice_available("metrics.k8s.io", "v1beta1",
                                                        timeout=SETTLE_SECONDS)
                children = [adapter.child] if adapter.child else []

                def served() -> bool:
                    try:
                        return _served(control_plane.get(f"{METRICS}/pods"))
                    except (KubeError, OSError):
                        return False

                # Through the aggregator: the pods cache has them Running, the rates settled.
                wait_until(served, what="the module's pods served through the aggregator",
                           timeout=SETTLE_SECONDS, children=children, interval=0.2)
                yield World(control_plane, adapter)
    finally:
        # The pods first (their kubelet finishes their deletion), then the stand-in and Nodes.
        for namespace in (TOP_A, TOP_B):
            control_plane.delete({"apiVersion": "v1", "kind": "Namespace",
                                  "metadata": {"name": namespace}})
        try:
            if kubelet_child is not None:
                wait_until(lambda: _pods_gone(control_plane), what="the module's pods deleted",
                           timeout=SETTLE_SECONDS, children=[kubelet_child], interval=0.2)
        finally:
            if kubelet_child is not None:
                kubelet_child.stop()
                control_plane.children.remove(kubelet_child)
            for node in NODES:
                control_plane.delete({"apiVersion": "v1", "kind": "Node",
                                      "metadata": {"name": node}})

def test_kubectl_top_pods_in_a_namespace(world: World) -> None:
    code, out, err = run_kubectl(world, "top", "pods", "-n", TOP_A)
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


def test_kubectl_top_pods_with_containers(world: World) -> None:
    code, out, err = run_kubectl(world, "top", "pods", "-n", TOP_A, "--containers")
    assert code == 0, err
    header, *rows = table(out)
    assert header == ["POD", "NAME", "CPU(cores)", "MEMORY(bytes)"]
    assert [(row[0], row[1], row[3]) for row in rows] == [
        ("web-0", "app", "64Mi"), ("web-0", "sidecar", "16Mi"), ("web-1", "app", "96Mi")]


def test_kubectl_top_pods_in_all_namespaces(world: World) -> None:
    code, out, err = run_kubectl(world, "top", "pods", "-A")
    assert code == 0, err
    header, *rows = table(out)
    assert header == ["NAMESPACE", "NAME", "CPU(cores)", "MEMORY(bytes)"]
    # Only the module's pods have series in its Prometheus; the shared cluster's other running
    # pods (other modules', kube-system has none) are left out by the adapter, as before.
    assert [(row[0], row[1]) for row in rows] == [
        (TOP_A, "web-0"), (TOP_A, "web-1"), (TOP_B, "api-0")]


def test_kubectl_top_one_pod_and_a_missing_one(world: World) -> None:
    code, out, err = run_kubectl(world, "top", "pod", "api-0", "-n", TOP_B)
    assert code == 0, err
    [_, row] = table(out)
    assert row[0] == "api-0" and mebibytes(row[2]) == 32
    code, _, err = run_kubectl(world, "top", "pod", "ghost", "-n", TOP_B)
    assert code != 0
    assert 'pods "ghost" not found' in err


def test_kubectl_top_nodes(world: World) -> None:
    code, out, err = run_kubectl(world, "top", "nodes")
    assert code == 0, err
    header, *rows = table(out)
    assert header[:2] == ["NAME", "CPU(cores)"] and "MEMORY(bytes)" in header
    by_name = {row[0]: row for row in rows}
    # The real cluster is shared: kubectl lists every Node, those without metrics (other
    # modules' Nodes, which no series of this module's Prometheus covers) as <unknown>.
    measured = {name for name, row in by_name.items() if row[1] != "<unknown>"}
    assert measured == set(NODES)
    # n1: the stand-in's 0.1 system + web-0 (0.3) + api-0 (0.1) + two pause containers
    # (0.001 each); the Succeeded pod uses nothing.
    assert millicores(by_name[N1][1]) == pytest.approx(502, rel=0.25)
    n1_memory = 512 + 80 + 32 + 2 * 400 / 1024
    assert mebibytes(by_name[N1][3]) == pytest.approx(n1_memory, abs=1)
    assert re.fullmatch(r"\d+%", by_name[N1][2])  # from the Node's allocatable
