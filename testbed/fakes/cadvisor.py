"""cAdvisor's series, as the kubelet's /metrics/cadvisor exposes them, published to an Exporter.

Per container: `container_cpu_usage_seconds_total` (a counter that advances in time by the
container's CPU use, in cores: the exporter's rated counter, exact however seldom anything
here runs) and `container_memory_working_set_bytes` (a gauge), labelled
`namespace`, `pod`, `container`, `id` and `node` (`node` as the common relabelling adds it). As
the real kubelet does, each pod also has a pod-level cgroup series (`container=""`, the sum of
its containers) and the pause container (`container="POD"`), which a correct rule must leave
out, and each node its root cgroup (`id="/"`, no pod labels): the containers on it plus some
system use.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from testbed.fakes.exporter import Exporter

__all__ = ["CAdvisor"]

CPU = "container_cpu_usage_seconds_total"
MEMORY = "container_memory_working_set_bytes"
PAUSE_CPU = 0.001
PAUSE_MEMORY = 400 * 1024


@dataclass
class _Container:
    node: str
    cpu: float  # cores
    memory: int  # bytes


@dataclass
class _Node:
    system_cpu: float = 0.1
    system_memory: int = 512 * 1024 * 1024
    pods: set[tuple[str, str]] = field(default_factory=set)


class CAdvisor:
    """Usage set per container and published at once: each CPU counter advances at its
    series' use (pod cgroups, pause containers and nodes included) until the use changes."""

    def __init__(self, exporter: Exporter) -> None:
        self.exporter = exporter
        self._lock = threading.Lock()
        self._containers: dict[tuple[str, str, str], _Container] = {}
        self._nodes: dict[str, _Node] = {}
        self._task: asyncio.Task[None] | None = None

    # -- what runs where ------------------------------------------------------------------

    def add_node(self, name: str, *, system_cpu: float = 0.1,
                 system_memory: int = 512 * 1024 * 1024) -> None:
        with self._lock:
            node = self._nodes.setdefault(name, _Node())
            node.system_cpu, node.system_memory = system_cpu, system_memory
        self._publish()

    def set_container(self, namespace: str, pod: str, container: str, *, node: str,
                      cpu: float, memory: int) -> None:
        with self._lock:
            self._containers[(namespace, pod, container)] = _Container(node, cpu, memory)
            self._nodes.setdefault(node, _Node()).pods.add((namespace, pod))
        self._publish()

    def set_pod_cpu(self, namespace: str, pod: str, cpu: float) -> None:
        """Spread `cpu` cores evenly over the pod's containers."""
        with self._lock:
            mine = [c for key, c in self._containers.items() if key[:2] == (namespace, pod)]
            for container in mine:
                container.cpu = cpu / len(mine)
        self._publish()

    def remove_pod(self, namespace: str, pod: str) -> None:
        with self._lock:
            for key in [k for k in self._containers if k[:2] == (namespace, pod)]:
                node = self._containers.pop(key).node
                self._nodes[node].pods.discard((namespace, pod))
                self.exporter.remove(CPU, self._labels(key, node))
                self.exporter.remove(MEMORY, self._labels(key, node))
            for container in ("", "POD"):
                for name in (CPU, MEMORY):
                    for node in self._nodes:
                        self.exporter.remove(name, self._labels((namespace, pod, container),
                                                                node))
        self._publish()  # the node's own use goes down

    def pods(self) -> list[tuple[str, str]]:
        with self._lock:
            return sorted({key[:2] for key in self._containers})

    # -- series ---------------------------------------------------------------------------

    @staticmethod
    def _labels(key: tuple[str, str, str], node: str) -> dict[str, str]:
        namespace, pod, container = key
        cgroup = f"/kubepods/{namespace}/{pod}" + (f"/{container}" if container else "")
        return {"namespace": namespace, "pod": pod, "container": container, "id": cgroup,
                "node": node}

    def _usage(self) -> Iterator[tuple[dict[str, str], float, int]]:
        """(labels, cores, bytes) of every series, pod cgroups and pause containers included."""
        pods: dict[tuple[str, str], tuple[str, float, int]] = {}
        for key, container in self._containers.items():
            yield self._labels(key, container.node), container.cpu, container.memory
            node, cpu, memory = pods.get(key[:2], (container.node, 0.0, 0))
            pods[key[:2]] = (node, cpu + container.cpu, memory + container.memory)
        for (namespace, pod), (node, cpu, memory) in pods.items():
            yield self._labels((namespace, pod, "POD"), node), PAUSE_CPU, PAUSE_MEMORY
            yield (self._labels((namespace, pod, ""), node), cpu + PAUSE_CPU,
                   memory + PAUSE_MEMORY)
        for name, node_state in self._nodes.items():
            on_node = [pods[p] for p in node_state.pods if p in pods]
            yield ({"id": "/", "node": name},
                   node_state.system_cpu + sum(cpu + PAUSE_CPU for _, cpu, _ in on_node),
                   node_state.system_memory + sum(m + PAUSE_MEMORY for _, _, m in on_node))

    def _publish(self) -> None:
        with self._lock:
            for labels, cores, memory in self._usage():
                self.exporter.set(MEMORY, labels, memory, type="gauge")
                self.exporter.set_rate(CPU, labels, cores, type="counter")

    def tick(self) -> None:
        """Publish the use again (the CPU counters advance by themselves)."""
        self._publish()

    async def run(self, interval: float = 0.25) -> None:
        while True:
            self.tick()
            await asyncio.sleep(interval)

    async def __aenter__(self) -> CAdvisor:
        self._task = asyncio.create_task(self.run(), name="cadvisor")
        return self

    async def __aexit__(self, *exc: object) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
