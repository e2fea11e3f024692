"""Load on a workload's pods, as a load balancer spreads it: evenly over the Ready pods.

A `Load` watches the pods of one label selector through kube-apiserver (no polling) and, each
time the set of Ready pods or the total changes, gives every Ready pod its share: CPU on the
kubelet stand-in (so cAdvisor series, metrics.k8s.io and metrics-server see it) and, if asked,
a per-pod gauge on a test exporter (a Pods custom metric). A pod that leaves loses its series.
It runs in a thread of its own, so a busy test event loop cannot delay it.
"""

from __future__ import annotations

import threading
import urllib.parse
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, Protocol

from testbed.controlplane import ControlPlane, Kubelet
from testbed.watching import ListWatch


class Exporter(Protocol):
    """What a Load needs of a test exporter (testbed.fakes.exporter.Exporter has it)."""

    def set(self, name: str, labels: Mapping[str, str] | None, value: Decimal, *,
            type: Any = None) -> None: ...

    def remove(self, name: str, labels: Mapping[str, str] | None = None) -> None: ...



def _ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or [])


class Load(ListWatch):
    def __init__(self, cluster: ControlPlane, kubelet: Kubelet, *, namespace: str,
                 selector: Mapping[str, str], cpu: Decimal | str | int = 0,
                 exporter: Exporter | None = None, metric: str | None = None,
                 metric_total: Decimal | str | int = 0) -> None:
        self.kubelet = kubelet
        self.namespace = namespace
        self.selector = ",".join(f"{k}={v}" for k, v in selector.items())
        super().__init__(cluster, f"/api/v1/namespaces/{namespace}/pods?"
                         + urllib.parse.urlencode({"labelSelector": self.selector}),
                         name=f"load {self.selector}", retry=0.5)
        self.exporter = exporter
        self.metric = metric
        self._lock = threading.Lock()
        self._cpu = Decimal(cpu)
        self._metric_total = Decimal(metric_total)
        self._pods: dict[str, bool] = {}
        self._published: set[str] = set()

    # ---- what the test sets -------------------------------------------------------------

    def set(self, *, cpu: Decimal | str | int | None = None,
            metric_total: Decimal | str | int | None = None) -> None:
        with self._lock:
            if cpu is not None:
                self._cpu = Decimal(cpu)
            if metric_total is not None:
                self._metric_total = Decimal(metric_total)
        self._publish()

    def ready_pods(self) -> list[str]:
        with self._lock:
            return sorted(name for name, ready in self._pods.items() if ready)

    # ---- the watch ----------------------------------------------------------------------

    def _publish(self) -> None:
        with self._lock:
            ready = sorted(name for name, is_ready in self._pods.items() if is_ready)
            gone = self._published - set(ready)
            cpu_share = self._cpu / len(ready) if ready else Decimal(0)
            metric_share = self._metric_total / len(ready) if ready else Decimal(0)
            self._published = set(ready)
        # Every pod's share of the gauge at once, before the kubelet's round trips: a scrape
        # between two of them would read some pods at the old share and some at the new, a
        # total that is neither (a controller syncing then could step past the target).
        if self.exporter is not None and self.metric:
            for pod in ready:
                self.exporter.set(self.metric, {"namespace": self.namespace, "pod": pod},
                                  metric_share, type="gauge")
            for pod in gone:
                self.exporter.remove(self.metric, {"namespace": self.namespace, "pod": pod})
        for pod in ready:
            self.kubelet.set_usage(self.namespace, pod, cpu=str(cpu_share))

    def listed(self, items: Sequence[Mapping[str, Any]]) -> None:
        with self._lock:
            self._pods = {p["metadata"]["name"]: _ready(p) for p in items}
        self._publish()

    def changed(self, kind: str, obj: Mapping[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return
        with self._lock:
            if kind == "DELETED":
                self._pods.pop(name, None)
            else:
                self._pods[name] = _ready(obj)
        self._publish()

    def __enter__(self) -> Load:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
