"""metrics-server and `metricscale adapter` side by side, both serving metrics.k8s.io.

One control plane and one kubelet stand-in (testbed): the real metrics-server v0.8.0 scrapes
each Node's `/metrics/resource`; a real Prometheus scrapes the stand-in's cAdvisor series and
our adapter answers from it with the default rules, their `rate()` range (and `window`) cut
from 5m to RANGE so that a test's fresh series read true within seconds (README: "a series
younger than the range reads low"). Both see the same counters, which advance exactly by the
usage set, so the same usage gives the same numbers unless the servers treat them differently.

`v1beta1.metrics.k8s.io` can name one server at a time: `through(server)` points it at one and
waits until the aggregator's answers come from it, and the APIService is given back as it was
at the end (other tests of the session may own it). Each server can also be asked directly, as
the aggregator asks it, for answers made at the same moment.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from adapter.rules.defaults import DEFAULT_CONFIG_YAML
from metricscale.core.durations import parse_duration
from metricscale.core.quantity import parse_quantity
from testbed.aggregated import AggregatedServer, Reply, apiservice_given_back
from testbed.controlplane import ControlPlane, KubeError, Kubelet
from testbed.fakes.prometheus import PrometheusServer
from testbed.kubelet import ANNOTATION_PREFIX
from testbed.metrics_server import MetricsServer
from testbed.metricscale_adapter import MetricscaleAdapter
from testbed.processes import wait_until
from tests.differential.metrics_server_differences import Expectations, KubectlRun

__all__ = ["RANGE", "RESOLUTION", "SideBySide", "Usage", "pod_manifest", "side_by_side"]

RESOLUTION = "15s"  # metrics-server's manifest runs with --metric-resolution=15s
RANGE = "10s"
CONFIG = DEFAULT_CONFIG_YAML.replace("[5m]", f"[{RANGE}]").replace("window: 5m",
                                                                     f"window: {RANGE}")
APISERVICE = "v1beta1.metrics.k8s.io"
METRICS = "/apis/metrics.k8s.io/v1beta1"
# Generous bounds on waits for conditions (two 15 s scrapes, a loaded machine).
SETTLE_SECONDS = 240

# container -> (cores, bytes)
Usage = Mapping[str, tuple[str, int]]


def pod_manifest(namespace: str, name: str, *, node: str, usage: Usage | None = None,
                 containers: Sequence[str] | None = None,
                 annotations: Mapping[str, str] | None = None,
                 grace_seconds: int | None = None) -> dict[str, Any]:
    """A bare pod bound to `node` (the stand-in runs it), labelled app=<name>; `usage` is
    the containers' usage from their start (the stand-in's usage annotation)."""
    names = list(containers or usage or ["app"])
    notes = dict(annotations or {})
    if usage:
        notes[ANNOTATION_PREFIX + "usage"] = json.dumps(
            {c: {"cpu": cpu, "memory": memory} for c, (cpu, memory) in usage.items()})
    spec: dict[str, Any] = {"nodeName": node,
                            "containers": [{"name": c, "image": "registry.k8s.io/pause:3.10"}
                                           for c in names]}
    if grace_seconds is not None:
        spec["terminationGracePeriodSeconds"] = grace_seconds
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": name},
                         "annotations": notes},
            "spec": spec}


@dataclass
class SideBySide:
    cluster: ControlPlane
    kubelet: Kubelet
    prometheus: PrometheusServer
    metrics_server: MetricsServer
    adapter: MetricscaleAdapter
    # pod name -> its containers, of the pods made by create() (a pod row of kubectl top sums
    # them, each rounded its own way)
    containers: dict[str, int] = field(default_factory=dict)

    @property
    def expect(self) -> Expectations:
        return Expectations(window=RANGE, resolution=parse_duration(RESOLUTION),
                            containers=dict(self.containers))

    # ---- the aggregator's choice ---------------------------------------------------------

    def _routed_to(self, server: AggregatedServer) -> bool:
        # Our window is RANGE, always; metrics-server's is its scrape interval (~15 s).
        try:
            nodes = self.cluster.get(f"{METRICS}/nodes")
        except (KubeError, OSError):
            return False
        windows = {item.get("window") for item in nodes.get("items") or []}
        if not windows:
            return False
        return windows == {RANGE} if server is self.adapter else RANGE not in windows

    def through(self, server: AggregatedServer) -> None:
        """Points v1beta1.metrics.k8s.io at `server`; returns once answers come from it."""
        if self._routed_to(server):
            return
        server.point()
        self.cluster.wait_apiservice_available("metrics.k8s.io", "v1beta1")
        wait_until(lambda: self._routed_to(server),
                   what=f"the aggregator answering metrics.k8s.io from {server.name}",
                   timeout=SETTLE_SECONDS, children=[c for c in (server.child,) if c],
                   interval=0.2)

    def kubectl(self, server: AggregatedServer, *args: str) -> KubectlRun:
        self.through(server)
        done = self.cluster.kubectl(*args, check=False)
        return KubectlRun(done.returncode, done.stdout, done.stderr)

    def kubectl_both(self, *args: str) -> tuple[KubectlRun, KubectlRun]:
        """The same kubectl command through metrics-server, then through us."""
        return self.kubectl(self.metrics_server, *args), self.kubectl(self.adapter, *args)

    def kubectl_many(self, *commands: Sequence[str]) -> list[tuple[KubectlRun, KubectlRun]]:
        """Each command through metrics-server, then each through us (two switches)."""
        ms = [self.kubectl(self.metrics_server, *command) for command in commands]
        ours = [self.kubectl(self.adapter, *command) for command in commands]
        return list(zip(ms, ours, strict=True))

    # ---- straight to each server --------------------------------------------------------

    def direct_both(self, path: str) -> tuple[Reply, Reply]:
        return self.metrics_server.request(path), self.adapter.request(path)

    # ---- waiting for what the tests compare ----------------------------------------------

    def wait_pods_served(self, namespace: str, expected: Mapping[str, Usage]) -> None:
        """Until both servers serve each pod with its usage (ours within the millicore we
        truncate, metrics-server's within a nanocore) and their memory exactly."""
        path = f"{METRICS}/namespaces/{namespace}/pods"

        def served() -> bool:
            ms, ours = self.direct_both(path)
            if ms.status != 200 or ours.status != 200:
                return False
            return all(_serves(reply.json(), expected, milli=reply is ours)
                       for reply in (ms, ours))

        wait_until(served, what=f"both servers serving {sorted(expected)} in {namespace}",
                   timeout=SETTLE_SECONDS, children=self._children(), interval=0.5)

    def wait_nodes_agree(self) -> None:
        """Until both servers give every node of the stand-in the same memory and CPU within
        a millicore: metrics-server changes only at its scrapes."""
        nodes = set(self.kubelet.node_ports)

        def agree() -> bool:
            ms, ours = self.direct_both(f"{METRICS}/nodes")
            if ms.status != 200 or ours.status != 200:
                return False
            ms_usage = {i["metadata"]["name"]: i["usage"] for i in ms.json()["items"]}
            our_usage = {i["metadata"]["name"]: i["usage"] for i in ours.json()["items"]}
            for node in nodes:
                if node not in ms_usage or node not in our_usage:
                    return False
                if ms_usage[node]["memory"] != our_usage[node]["memory"]:
                    return False
                gap = parse_quantity(ms_usage[node]["cpu"]) - parse_quantity(
                    our_usage[node]["cpu"])
                if not Decimal("-0.000000002") <= gap < Decimal("0.001001"):
                    return False
            return True

        wait_until(agree, what="both servers agreeing on the nodes", timeout=SETTLE_SECONDS,
                   children=self._children(), interval=0.5)

    def _children(self) -> list[Any]:
        return [c for c in (self.metrics_server.child, self.adapter.child) if c is not None]

    def create(self, *objects: Mapping[str, Any]) -> None:
        for obj in objects:
            if obj.get("kind") == "Pod":
                self.containers[obj["metadata"]["name"]] = len(obj["spec"]["containers"])
            self.cluster.apply(obj)


def _serves(answer: Mapping[str, Any], expected: Mapping[str, Usage], *, milli: bool) -> bool:
    items = {i["metadata"]["name"]: i for i in answer.get("items") or []}
    for pod, usage in expected.items():
        item = items.get(pod)
        if item is None:
            return False
        containers = {c["name"]: c["usage"] for c in item.get("containers") or []}
        if set(containers) != set(usage):
            return False
        for name, (cores, memory) in usage.items():
            if parse_quantity(containers[name]["memory"]) != memory:
                return False
            cpu = parse_quantity(containers[name]["cpu"])
            want = Decimal(cores)
            # Ours truncates the rate (a float) to millicores; metrics-server's nanocores are
            # a counter difference over a window, a nanocore off at most.
            if not (want - Decimal("0.001001") <= cpu <= want if milli
                    else abs(cpu - want) <= Decimal("0.000000002")):
                return False
    return True


@contextlib.contextmanager
def side_by_side(cluster: ControlPlane, kubelet: Kubelet, *, prometheus_binary: str,
                 workdir: Path) -> Iterator[SideBySide]:
    with contextlib.ExitStack() as stack:
        prometheus = stack.enter_context(PrometheusServer(binary=prometheus_binary))
        prometheus.add_target(kubelet.address, job="kubelet")
        stack.enter_context(apiservice_given_back(cluster, APISERVICE))
        metrics_server = stack.enter_context(MetricsServer(
            cluster, workdir=workdir / "metrics-server", resolution=RESOLUTION))
        adapter = stack.enter_context(MetricscaleAdapter(
            cluster, workdir=workdir / "adapter", config_text=CONFIG,
            prometheus_url=prometheus.url))
        prometheus.wait_for_scrape(kubelet.address, timeout=120)
        started = time.monotonic()
        world = SideBySide(cluster, kubelet, prometheus, metrics_server, adapter)
        world.wait_nodes_agree()
        print(f"\nmetrics-server and metricscale agree on the nodes after "
              f"{time.monotonic() - started:.0f} s")
        yield world
