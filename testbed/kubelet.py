"""A kubelet stand-in: Ready Nodes, their pods Running and Ready, and the pods' resource series.

Nothing runs containers on the test bed, so this process does the three things of a kubelet
the control plane and the metrics pipelines need, and nothing else:

- registers its Nodes (Ready, with capacity, `InternalIP` 127.0.0.1 and a kubelet port each);
- watches the pods bound to them: marks each Running and Ready (the containers started), and
  deletes a terminating pod at once, as a kubelet does once its containers have stopped;
- serves each pod's usage, set through `PUT /usage` or the pod's annotations, as the kubelet
  serves it:
  - cAdvisor-style series on `http://127.0.0.1:<port>/metrics/cadvisor` (also `/metrics`), for
    the test Prometheus to scrape (`container_cpu_usage_seconds_total`, a counter that advances
    by the usage in cores times the time elapsed, so it is exact however busy the machine is;
    `container_memory_working_set_bytes`; the pod cgroup, pause container and node root too),
    each sample with its time, as cAdvisor writes them;
  - the Resource Metrics endpoint `/metrics/resource` on each Node's own HTTPS port, which is
    what metrics-server scrapes, in the kubelet's format (kubernetes v1.36
    `pkg/kubelet/metrics/collectors/resource_metrics.go` through component-base's registry):
    families sorted by name, `[STABLE]`/`[ALPHA]` in the help, series sorted by their labels,
    values as Go's `strconv.FormatFloat(v, 'g', -1, 64)` (`6.7108864e+07`), millisecond
    timestamps on the CPU, memory and swap samples and none on `container_start_time_seconds`
    and `resource_scrape_error`; the pause container is not a container there.

Every answer samples the counters at the millisecond it stamps, so a value and its time always
agree (a real kubelet samples on cAdvisor's housekeeping, every 10-15 s, and its times lag the
request by up to that). A container's CPU counter starts at 0 and stays there until usage is
given: metrics-server leaves out a pod while any of its containers' counter is 0.

Pod annotations steer what a test needs from a kubelet (read when the pod is first seen):

- `testbed.metricscale.io/usage`: `{"<container>": {"cpu": "0.25", "memory": 67108864}}`, the
  usage from the container's start (so the counter is linear from 0 at the start time);
- `testbed.metricscale.io/stats: none`: the pod runs (Running and Ready) but the kubelet
  reports no stats for it, as before cAdvisor's first housekeeping of a new container;
- `testbed.metricscale.io/phase: Pending | Succeeded | Failed`: the containers never start, or
  ran to an end (exit 0 or 1); no stats either way;
- `testbed.metricscale.io/ignores-sigterm: "true"`: on deletion the containers run on, and are
  reported, until the grace period ends (the pod's `deletionTimestamp`), as an application
  that ignores SIGTERM; without it a deleted pod's containers stop at once.

Run: `python -m testbed.kubelet --server URL --ca CA --cert CRT --key KEY --nodes a,b
--serving-cert CRT --serving-key KEY --ready-file FILE`; it writes its control port to the
ready file once the Nodes are registered.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import logging
import math
import signal
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

__all__ = ["ANNOTATION_PREFIX", "KubeletStandIn", "go_float", "main"]

logger = logging.getLogger("testbed.kubelet")

KUBELET_VERSION = "v1.36.3"
NANO = 1_000_000_000
PAUSE_NANOCORES = 1_000_000  # 0.001 cores
PAUSE_MEMORY = 400 * 1024
NODE_SYSTEM_NANOCORES = 100_000_000  # 0.1 cores
NODE_SYSTEM_MEMORY = 512 * 1024 * 1024
DEFAULT_MEMORY = 16 * 1024 * 1024

ANNOTATION_PREFIX = "testbed.metricscale.io/"
USAGE_ANNOTATION = ANNOTATION_PREFIX + "usage"
STATS_ANNOTATION = ANNOTATION_PREFIX + "stats"
PHASE_ANNOTATION = ANNOTATION_PREFIX + "phase"
SIGTERM_ANNOTATION = ANNOTATION_PREFIX + "ignores-sigterm"
_NOT_RUNNING_PHASES = ("Pending", "Succeeded", "Failed")
# Status writes in flight at once (a bulk creation of thousands of pods).
_CONCURRENT_STATUS_WRITES = 16


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _rfc3339(ms: int) -> str:
    return datetime.fromtimestamp(ms // 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _nanocores(cores: Any) -> int:
    return max(0, int(Decimal(str(cores)) * NANO))


def go_float(value: float) -> str:
    """A sample value as the Prometheus text format writes it (`expfmt.writeFloat`: 1, 0, -1,
    NaN and the infinities spelled out, else `strconv.FormatFloat(v, 'g', -1, 64)`: the
    shortest digits that read back exactly, in exponent form when the exponent is below -4 or
    at least 6)."""
    if value in (0.0, 1.0, -1.0):
        return str(int(value))
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    sign, digit_tuple, exponent = Decimal(repr(value)).normalize().as_tuple()
    assert isinstance(exponent, int)
    digits = "".join(map(str, digit_tuple))
    point = len(digits) + exponent  # where the decimal point falls in `digits`
    minus = "-" if sign else ""
    power = point - 1
    if power < -4 or power >= 6:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{minus}{mantissa}e{'-' if power < 0 else '+'}{abs(power):02d}"
    if point <= 0:
        return f"{minus}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{minus}{digits}{'0' * (point - len(digits))}"
    return f"{minus}{digits[:point]}.{digits[point:]}"


@dataclass
class _Usage:
    """A container's CPU counter in nanoseconds, exact at any millisecond:
    `base_ns + nanocores * (t - since_ms) / 1000`."""

    nanocores: int = 0
    memory: int = DEFAULT_MEMORY
    base_ns: int = 0
    since_ms: int = field(default_factory=_now_ms)

    def cpu_ns(self, at_ms: int) -> int:
        return self.base_ns + self.nanocores * max(0, at_ms - self.since_ms) // 1000

    def set_nanocores(self, nanocores: int, at_ms: int) -> None:
        self.base_ns = self.cpu_ns(at_ms)
        self.since_ms = at_ms
        self.nanocores = nanocores


@dataclass
class _Pod:
    namespace: str
    name: str
    node: str
    uid: str
    started_ms: int
    containers: dict[str, _Usage]
    pause: _Usage
    phase: str = "Running"  # what the kubelet makes of it: Running, or an annotation's phase
    reports: bool = True  # whether its containers' stats are served
    finishing: bool = False  # deleted, running on until its grace period ends

    @property
    def running(self) -> bool:
        return self.phase == "Running"

    @property
    def reported(self) -> bool:
        return self.running and self.reports

    def all_usages(self) -> list[_Usage]:
        return [*self.containers.values(), self.pause]


def _pod_from(metadata: dict[str, Any], spec: dict[str, Any], node: str) -> _Pod:
    started = _now_ms()
    annotations = metadata.get("annotations") or {}
    containers = {str(c["name"]): _Usage(since_ms=started) for c in spec.get("containers", [])}
    raw = annotations.get(USAGE_ANNOTATION)
    if raw:
        try:
            wanted = json.loads(raw)
        except ValueError:
            logger.warning("pod %s/%s: %s is not JSON", metadata.get("namespace"),
                           metadata.get("name"), USAGE_ANNOTATION)
            wanted = {}
        for name, usage in (wanted or {}).items():
            container = containers.get(str(name))
            if container is None or not isinstance(usage, dict):
                continue
            if "cpu" in usage:
                container.nanocores = _nanocores(usage["cpu"])
            if "memory" in usage:
                container.memory = int(Decimal(str(usage["memory"])))
    phase = str(annotations.get(PHASE_ANNOTATION) or "Running")
    if phase not in _NOT_RUNNING_PHASES:
        phase = "Running"
    return _Pod(namespace=str(metadata.get("namespace")), name=str(metadata.get("name")),
                node=node, uid=str(metadata.get("uid")), started_ms=started,
                containers=containers,
                pause=_Usage(nanocores=PAUSE_NANOCORES, memory=PAUSE_MEMORY, since_ms=started),
                phase=phase, reports=annotations.get(STATS_ANNOTATION) != "none")


def _deletion_ms(metadata: dict[str, Any]) -> int:
    stamp = str(metadata.get("deletionTimestamp"))
    when = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


class KubeletStandIn:
    def __init__(self, *, server: str, api_context: ssl.SSLContext, nodes: list[str],
                 serving_context: ssl.SSLContext, cpu: str = "8", memory: str = "32Gi",
                 max_pods: int = 250) -> None:
        self.server = server.rstrip("/")
        self.api_context = api_context
        self.serving_context = serving_context
        self.nodes = nodes
        self.capacity = {"cpu": cpu, "memory": memory, "pods": str(max_pods)}
        self.pods: dict[tuple[str, str], _Pod] = {}
        self.by_node: dict[str, dict[tuple[str, str], _Pod]] = {node: {} for node in nodes}
        self.node_ports: dict[str, int] = {}
        self.node_root: dict[str, _Usage] = {}
        self._ips = (ipaddress.ip_address("10.244.0.0") + i for i in range(2, 1 << 16))
        self._session: aiohttp.ClientSession | None = None
        self._runners: list[web.AppRunner] = []
        self._writes = asyncio.Semaphore(_CONCURRENT_STATUS_WRITES)
        self._writing: set[tuple[str, str, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.control_port = 0

    # ---- the API server -----------------------------------------------------------------

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None
        return self._session

    async def _call(self, method: str, path: str, body: Any = None,
                    content_type: str = "application/json") -> tuple[int, Any]:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        async with self.session.request(method, self.server + path, data=data,
                                        headers=headers, ssl=self.api_context) as reply:
            text = await reply.read()
            return reply.status, (json.loads(text) if text else None)

    async def register_nodes(self) -> None:
        for name in self.nodes:
            port = self.node_ports[name]
            node = {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {
                    "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "test"}},
                "status": self._node_status(port)}
            status, reply = await self._call("POST", "/api/v1/nodes", node)
            if status == 409:
                status, reply = await self._call(
                    "PATCH", f"/api/v1/nodes/{name}/status",
                    {"status": self._node_status(port)}, "application/merge-patch+json")
            if status >= 300:
                raise RuntimeError(f"registering node {name}: {status} {reply}")
            # Admission taints a new Node not-ready; node-lifecycle (not run here) would lift
            # the taint once the Node reports Ready, which it does from the start.
            status, reply = await self._call("PATCH", f"/api/v1/nodes/{name}",
                                             {"spec": {"taints": None}},
                                             "application/merge-patch+json")
            if status >= 300:
                raise RuntimeError(f"untainting node {name}: {status} {reply}")
            self.node_root[name] = _Usage(nanocores=NODE_SYSTEM_NANOCORES,
                                          memory=NODE_SYSTEM_MEMORY)
            logger.info("node %s registered (kubelet port %d)", name, port)

    def _node_status(self, port: int) -> dict[str, Any]:
        now = _rfc3339(_now_ms())

        def condition(kind: str, status: str, reason: str) -> dict[str, str]:
            return {"type": kind, "status": status, "reason": reason, "message": reason,
                    "lastHeartbeatTime": now, "lastTransitionTime": now}

        return {
            "capacity": dict(self.capacity), "allocatable": dict(self.capacity),
            "conditions": [condition("Ready", "True", "KubeletReady"),
                           condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                           condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                           condition("PIDPressure", "False", "KubeletHasSufficientPID")],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
            "nodeInfo": {"kubeletVersion": KUBELET_VERSION, "architecture": "amd64",
                         "operatingSystem": "linux", "osImage": "metricscale test bed",
                         "containerRuntimeVersion": "none://0", "kernelVersion": "",
                         "machineID": "", "systemUUID": "", "bootID": "",
                         "kubeProxyVersion": ""}}

    async def watch_pods(self) -> None:
        """List then watch the pods on our nodes, for ever (re-listing after a dropped watch)."""
        while True:
            try:
                status, listed = await self._call("GET", "/api/v1/pods")
                if status != 200:
                    raise RuntimeError(f"listing pods: {status} {listed}")
                present = set()
                for pod in listed.get("items", []):
                    metadata = pod.get("metadata") or {}
                    present.add((str(metadata.get("namespace")), str(metadata.get("name"))))
                    await self._pod_changed("MODIFIED", pod)
                for key in [key for key in self.pods if key not in present]:
                    self._forget(key)
                version = listed["metadata"]["resourceVersion"]
                url = (f"{self.server}/api/v1/pods?watch=1&resourceVersion={version}"
                       "&allowWatchBookmarks=true&timeoutSeconds=300")
                async with self.session.get(url, ssl=self.api_context,
                                            timeout=aiohttp.ClientTimeout(total=None)) as reply:
                    async for line in reply.content:
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        if event.get("type") in {"ADDED", "MODIFIED", "DELETED"}:
                            await self._pod_changed(event["type"], event["object"])
                        elif event.get("type") == "ERROR":
                            break
            except (aiohttp.ClientError, RuntimeError, ValueError) as error:
                logger.warning("pod watch: %s; listing again", error)
                await asyncio.sleep(0.5)

    def _forget(self, key: tuple[str, str]) -> None:
        gone = self.pods.pop(key, None)
        if gone is not None:
            self.by_node[gone.node].pop(key, None)
            root = self.node_root.get(gone.node)
            if root is not None and gone.running:
                # The node's counter is its root cgroup's: the CPU a pod used stays in it after
                # the pod is gone, as on a real node, so the counter never goes back (a rate
                # over a window in which another pod left would read low otherwise).
                root.base_ns += sum(u.cpu_ns(_now_ms()) for u in gone.all_usages())

    def _spawn(self, work: Any) -> None:
        task: asyncio.Task[None] = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _pod_changed(self, kind: str, pod: dict[str, Any]) -> None:
        metadata = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        node = spec.get("nodeName")
        key = (str(metadata.get("namespace")), str(metadata.get("name")))
        if node not in self.nodes:
            return
        if kind == "DELETED":
            self._forget(key)
            return
        known = self.pods.get(key)
        if known is None or known.uid != metadata.get("uid"):
            if metadata.get("deletionTimestamp"):
                await self._finish_deletion(key, metadata)
                return
            known = _pod_from(metadata, spec, str(node))
            self._forget(key)
            self.pods[key] = known
            self.by_node[known.node][key] = known
        if metadata.get("deletionTimestamp"):
            annotations = metadata.get("annotations") or {}
            if annotations.get(SIGTERM_ANNOTATION) == "true" and known.running:
                if not known.finishing:
                    # The containers run on until the grace period ends, then stop.
                    known.finishing = True
                    self._spawn(self._finish_at(key, metadata, _deletion_ms(metadata)))
                return
            # The containers "stopped" at once: finish the deletion, as the kubelet does.
            self._forget(key)
            await self._finish_deletion(key, metadata)
            return
        if not self._status_is(pod, known.phase):
            self._write_status(pod, known)

    async def _finish_at(self, key: tuple[str, str], metadata: dict[str, Any],
                         at_ms: int) -> None:
        await asyncio.sleep(max(0.0, (at_ms - _now_ms()) / 1000))
        self._forget(key)
        await self._finish_deletion(key, metadata)

    async def _finish_deletion(self, key: tuple[str, str], metadata: dict[str, Any]) -> None:
        await self._call("DELETE", f"/api/v1/namespaces/{key[0]}/pods/{key[1]}",
                         {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                          "preconditions": {"uid": metadata.get("uid")}})

    @staticmethod
    def _status_is(pod: dict[str, Any], phase: str) -> bool:
        status = pod.get("status") or {}
        if status.get("phase") != phase:
            return False
        if phase != "Running":
            return True
        return any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in status.get("conditions") or [])

    def _write_status(self, pod: dict[str, Any], known: _Pod) -> None:
        marker = (known.namespace, known.name, known.uid)
        if marker in self._writing:
            return
        self._writing.add(marker)

        async def write() -> None:
            try:
                async with self._writes:
                    await self._patch_status(pod, known)
            finally:
                self._writing.discard(marker)

        self._spawn(write())

    async def _patch_status(self, pod: dict[str, Any], known: _Pod) -> None:
        metadata = pod["metadata"]
        now = _rfc3339(_now_ms())
        status = pod.get("status") or {}
        ip = status.get("podIP") or str(next(self._ips))
        started = status.get("startTime") or _rfc3339(known.started_ms)

        def condition(kind: str, value: bool = True, reason: str | None = None
                      ) -> dict[str, Any]:
            found: dict[str, Any] = {"type": kind, "status": "True" if value else "False",
                                     "lastProbeTime": None, "lastTransitionTime": now}
            if reason:
                found["reason"] = reason
            return found

        names = [c["name"] for c in pod["spec"].get("containers", [])]
        patch: dict[str, Any]
        if known.phase == "Running":
            containers = [{
                "name": name, "image": "", "imageID": "",
                "containerID": f"testbed://{metadata['uid']}/{name}",
                "ready": True, "started": True, "restartCount": 0,
                "state": {"running": {"startedAt": started}}} for name in names]
            conditions = [condition("PodReadyToStartContainers"), condition("Initialized"),
                          condition("ContainersReady"), condition("Ready"),
                          condition("PodScheduled")]
        elif known.phase == "Pending":
            containers = [{
                "name": name, "image": "", "imageID": "", "ready": False, "started": False,
                "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}
                for name in names]
            conditions = [condition("PodReadyToStartContainers", False), condition("Initialized"),
                          condition("ContainersReady", False, "ContainersNotReady"),
                          condition("Ready", False, "ContainersNotReady"),
                          condition("PodScheduled")]
        else:
            code = 0 if known.phase == "Succeeded" else 1
            containers = [{
                "name": name, "image": "", "imageID": "",
                "containerID": f"testbed://{metadata['uid']}/{name}",
                "ready": False, "started": False, "restartCount": 0,
                "state": {"terminated": {"exitCode": code,
                                         "reason": "Completed" if code == 0 else "Error",
                                         "startedAt": started, "finishedAt": now}}}
                for name in names]
            conditions = [condition("PodReadyToStartContainers", False), condition("Initialized"),
                          condition("ContainersReady", False, "PodCompleted"),
                          condition("Ready", False, "PodCompleted"), condition("PodScheduled")]
        patch = {"status": {
            "phase": known.phase, "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": ip, "podIPs": [{"ip": ip}], "startTime": started,
            "conditions": conditions, "containerStatuses": containers}}
        try:
            status_code, reply = await self._call(
                "PATCH",
                f"/api/v1/namespaces/{metadata['namespace']}/pods/{metadata['name']}/status",
                patch, "application/merge-patch+json")
        except aiohttp.ClientError as error:
            logger.warning("pod %s/%s status: %s", metadata["namespace"], metadata["name"],
                           error)
            return
        if status_code >= 300 and status_code != 404:
            logger.warning("pod %s/%s status: %s %s", metadata["namespace"], metadata["name"],
                           status_code, reply)

    # ---- usage ----------------------------------------------------------------------------

    async def put_usage(self, request: web.Request) -> web.Response:
        """`{"namespace", "pod", "cpu": cores, "memory": bytes}`: the pod's usage, spread
        evenly over its containers; a `container` field sets one container only."""
        body = await request.json()
        key = (str(body["namespace"]), str(body["pod"]))
        pod = self.pods.get(key)
        if pod is None:
            return web.json_response({"error": f"no pod {key[0]}/{key[1]} on these nodes"},
                                     status=404)
        now = _now_ms()
        names = [str(body["container"])] if body.get("container") else list(pod.containers)
        for name in names:
            usage = pod.containers.get(name)
            if usage is None:
                return web.json_response({"error": f"no container {name}"}, status=404)
            if "cpu" in body:
                usage.set_nanocores(_nanocores(body["cpu"]) // len(names), now)
            if "memory" in body:
                usage.memory = int(Decimal(str(body["memory"]))) // len(names)
        return web.json_response({"ok": True})

    async def get_pods(self, _request: web.Request) -> web.Response:
        return web.json_response(sorted(f"{ns}/{name}" for ns, name in self.pods))

    def _series(self, at_ms: int) -> Iterator[tuple[dict[str, str], int, int]]:
        """(labels, cpu nanoseconds, memory bytes) of every cgroup cAdvisor reports."""
        for node in self.nodes:
            root = self.node_root.get(node)
            if root is None:
                continue
            node_cpu, node_memory = root.cpu_ns(at_ms), root.memory
            for pod in self.by_node[node].values():
                if not pod.running:
                    continue
                cpu_sum = sum(u.cpu_ns(at_ms) for u in pod.all_usages())
                memory_sum = sum(u.memory for u in pod.all_usages())
                node_cpu += cpu_sum
                node_memory += memory_sum
                if not pod.reports:
                    continue
                cgroup = f"/kubepods/{pod.namespace}/{pod.name}"
                for name, usage in [*pod.containers.items(), ("POD", pod.pause)]:
                    yield ({"namespace": pod.namespace, "pod": pod.name, "container": name,
                            "id": f"{cgroup}/{name}", "node": node}, usage.cpu_ns(at_ms),
                           usage.memory)
                yield ({"namespace": pod.namespace, "pod": pod.name, "container": "",
                        "id": cgroup, "node": node}, cpu_sum, memory_sum)
            yield {"id": "/", "node": node}, node_cpu, node_memory

    @staticmethod
    def _labels(labels: dict[str, str]) -> str:
        def escape(value: str) -> str:
            return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

        return ",".join(f'{k}="{escape(v)}"' for k, v in labels.items())

    async def get_cadvisor(self, _request: web.Request) -> web.Response:
        at = _now_ms()
        cpu = ["# HELP container_cpu_usage_seconds_total Cumulative cpu time consumed in seconds.",
               "# TYPE container_cpu_usage_seconds_total counter"]
        memory = ["# HELP container_memory_working_set_bytes Current working set in bytes.",
                  "# TYPE container_memory_working_set_bytes gauge"]
        for labels, cpu_ns, working_set in self._series(at):
            rendered = self._labels(labels)
            cpu.append(f"container_cpu_usage_seconds_total{{{rendered}}} "
                       f"{go_float(cpu_ns / NANO)} {at}")
            memory.append(f"container_memory_working_set_bytes{{{rendered}}} "
                          f"{go_float(float(working_set))} {at}")
        return web.Response(text="\n".join(cpu + memory) + "\n",
                            content_type="text/plain", charset="utf-8")

    def resource_metrics(self, node: str, at_ms: int) -> str:
        """The kubelet's /metrics/resource for `node` (see the module docstring)."""
        lines: list[str] = []

        def family(name: str, kind: str, stability: str, help_text: str,
                   samples: list[str]) -> None:
            if samples:  # the registry leaves out a family without samples
                lines.append(f"# HELP {name} [{stability}] {help_text}")
                lines.append(f"# TYPE {name} {kind}")
                lines.extend(samples)

        pods = sorted((p for p in self.by_node.get(node, {}).values() if p.running),
                      key=lambda p: (p.namespace, p.name))
        reported = [p for p in pods if p.reports]
        containers = sorted(((name, pod, usage) for pod in reported
                             for name, usage in pod.containers.items()),
                            key=lambda c: (c[0], c[1].namespace, c[1].name))

        def labels(name: str, pod: _Pod) -> str:
            return self._labels({"container": name, "namespace": pod.namespace,
                                 "pod": pod.name})

        def pod_labels(pod: _Pod) -> str:
            return self._labels({"namespace": pod.namespace, "pod": pod.name})

        stamp = str(at_ms)
        family("container_cpu_usage_seconds_total", "counter", "STABLE",
               "Cumulative cpu time consumed by the container in core-seconds",
               [f"container_cpu_usage_seconds_total{{{labels(n, p)}}} "
                f"{go_float(u.cpu_ns(at_ms) / NANO)} {stamp}" for n, p, u in containers])
        family("container_memory_working_set_bytes", "gauge", "STABLE",
               "Current working set of the container in bytes",
               [f"container_memory_working_set_bytes{{{labels(n, p)}}} "
                f"{go_float(float(u.memory))} {stamp}" for n, p, u in containers])
        family("container_start_time_seconds", "gauge", "STABLE",
               "Start time of the container since unix epoch in seconds",
               [f"container_start_time_seconds{{{labels(n, p)}}} "
                f"{go_float(p.started_ms / 1000)}" for n, p, _u in containers])
        family("container_swap_usage_bytes", "gauge", "ALPHA",
               "Current amount of the container swap usage in bytes. Reported only on "
               "non-windows systems",
               [f"container_swap_usage_bytes{{{labels(n, p)}}} 0 {stamp}"
                for n, p, _u in containers])
        root = self.node_root.get(node)
        if root is not None:
            node_cpu = root.cpu_ns(at_ms) + sum(u.cpu_ns(at_ms) for p in pods
                                                for u in p.all_usages())
            node_memory = root.memory + sum(u.memory for p in pods for u in p.all_usages())
            family("node_cpu_usage_seconds_total", "counter", "STABLE",
                   "Cumulative cpu time consumed by the node in core-seconds",
                   [f"node_cpu_usage_seconds_total {go_float(node_cpu / NANO)} {stamp}"])
            family("node_memory_working_set_bytes", "gauge", "STABLE",
                   "Current working set of the node in bytes",
                   [f"node_memory_working_set_bytes {go_float(float(node_memory))} {stamp}"])
            family("node_swap_usage_bytes", "gauge", "ALPHA",
                   "Current swap usage of the node in bytes. Reported only on non-windows "
                   "systems", [f"node_swap_usage_bytes 0 {stamp}"])
        family("pod_cpu_usage_seconds_total", "counter", "STABLE",
               "Cumulative cpu time consumed by the pod in core-seconds",
               [f"pod_cpu_usage_seconds_total{{{pod_labels(p)}}} "
                f"{go_float(sum(u.cpu_ns(at_ms) for u in p.all_usages()) / NANO)} {stamp}"
                for p in reported])
        family("pod_memory_working_set_bytes", "gauge", "STABLE",
               "Current working set of the pod in bytes",
               [f"pod_memory_working_set_bytes{{{pod_labels(p)}}} "
                f"{go_float(float(sum(u.memory for u in p.all_usages())))} {stamp}"
                for p in reported])
        family("pod_swap_usage_bytes", "gauge", "ALPHA",
               "Current amount of the pod swap usage in bytes. Reported only on non-windows "
               "systems", [f"pod_swap_usage_bytes{{{pod_labels(p)}}} 0 {stamp}"
                           for p in reported])
        family("resource_scrape_error", "gauge", "STABLE",
               "1 if there was an error while getting container metrics, 0 otherwise",
               ["resource_scrape_error 0"])
        return "\n".join(lines) + "\n"

    # ---- serving ----------------------------------------------------------------------------

    async def start(self, ready_file: Path) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=_CONCURRENT_STATUS_WRITES + 4))
        control = web.Application()
        control.router.add_put("/usage", self.put_usage)
        control.router.add_get("/pods", self.get_pods)
        control.router.add_get("/metrics", self.get_cadvisor)
        control.router.add_get("/metrics/cadvisor", self.get_cadvisor)
        runner = web.AppRunner(control, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self._runners.append(runner)
        self.control_port = _bound_port(runner)
        for node in self.nodes:
            app = web.Application()
            app.router.add_get("/metrics/resource", self._resource_handler(node))
            app.router.add_get("/healthz", _ok)
            node_runner = web.AppRunner(app, access_log=None)
            await node_runner.setup()
            await web.TCPSite(node_runner, "127.0.0.1", 0,
                              ssl_context=self.serving_context).start()
            self._runners.append(node_runner)
            self.node_ports[node] = _bound_port(node_runner)
        await self.register_nodes()
        await asyncio.to_thread(ready_file.write_text, json.dumps(
            {"control_port": self.control_port, "node_ports": self.node_ports}))

    def _resource_handler(self, node: str) -> Any:
        async def handler(_request: web.Request) -> web.Response:
            return web.Response(text=self.resource_metrics(node, _now_ms()),
                                content_type="text/plain", charset="utf-8",
                                headers={"X-Content-Type-Options": "nosniff"})
        return handler

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for runner in self._runners:
            await runner.cleanup()
        if self._session is not None:
            await self._session.close()


async def _ok(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


def _bound_port(runner: web.AppRunner) -> int:
    server = runner.server
    assert server is not None
    for site in runner.sites:
        sockets = getattr(site, "_server", None)
        if sockets is not None:
            return int(sockets.sockets[0].getsockname()[1])
    raise RuntimeError("site has no socket")


async def _amain(args: argparse.Namespace) -> None:
    api_context = ssl.create_default_context(cafile=args.ca)
    api_context.load_cert_chain(args.cert, args.key)
    serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    serving.load_cert_chain(args.serving_cert, args.serving_key)
    kubelet = KubeletStandIn(server=args.server, api_context=api_context,
                             nodes=args.nodes.split(","), serving_context=serving,
                             max_pods=args.max_pods)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await kubelet.start(Path(args.ready_file))
    watcher = asyncio.create_task(kubelet.watch_pods())
    await stop.wait()
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher
    await kubelet.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m testbed.kubelet")
    parser.add_argument("--server", required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--serving-cert", required=True)
    parser.add_argument("--serving-key", required=True)
    parser.add_argument("--nodes", default="node-a,node-b")
    parser.add_argument("--max-pods", type=int, default=250)
    parser.add_argument("--ready-file", required=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(_amain(parser.parse_args()))


if __name__ == "__main__":
    main()
