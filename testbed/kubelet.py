"""A kubelet stand-in: Ready Nodes, their pods Running and Ready, and the pods' resource series.

Nothing runs containers on the test bed, so this process does the three things of a kubelet
the control plane and the metrics pipelines need, and nothing else:

- registers its Nodes (Ready, with capacity, `InternalIP` 127.0.0.1 and a kubelet port each);
- watches the pods bound to them: marks each Running and Ready (the containers started), and
  deletes a terminating pod at once, as a kubelet does once its containers have stopped;
- serves each pod's usage, set through `PUT /usage`, as the kubelet serves it:
  - cAdvisor-style series on `http://127.0.0.1:<port>/metrics/cadvisor` (also `/metrics`), for
    the test Prometheus to scrape (`container_cpu_usage_seconds_total`, a counter that advances
    by the usage in cores times the time elapsed, so it is exact however busy the machine is;
    `container_memory_working_set_bytes`; the pod cgroup, pause container and node root too);
  - the Resource Metrics endpoint `/metrics/resource` on each Node's own HTTPS port, which is
    what metrics-server scrapes.

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

__all__ = ["KubeletStandIn", "main"]

logger = logging.getLogger("testbed.kubelet")

KUBELET_VERSION = "v1.36.3"
PAUSE_CPU = 0.001
PAUSE_MEMORY = 400 * 1024
NODE_SYSTEM_CPU = 0.1
NODE_SYSTEM_MEMORY = 512 * 1024 * 1024
DEFAULT_MEMORY = 16 * 1024 * 1024


def _now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Usage:
    """A container's CPU counter, exact at any instant: `base + cores * (t - since)`."""

    cores: float = 0.0
    memory: int = DEFAULT_MEMORY
    base: float = 0.0
    since: float = field(default_factory=time.time)
    started: float = field(default_factory=time.time)

    def cpu_seconds(self, at: float) -> float:
        return self.base + self.cores * max(0.0, at - self.since)

    def set_cores(self, cores: float, at: float) -> None:
        self.base = self.cpu_seconds(at)
        self.since = at
        self.cores = cores


@dataclass
class _Pod:
    namespace: str
    name: str
    node: str
    uid: str
    containers: dict[str, _Usage]
    pause: _Usage = field(default_factory=lambda: _Usage(cores=PAUSE_CPU, memory=PAUSE_MEMORY))


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
        self.node_ports: dict[str, int] = {}
        self.node_root: dict[str, _Usage] = {}
        self._ips = (ipaddress.ip_address("10.244.0.0") + i for i in range(2, 1 << 16))
        self._session: aiohttp.ClientSession | None = None
        self._runners: list[web.AppRunner] = []
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
            self.node_root[name] = _Usage(cores=NODE_SYSTEM_CPU, memory=NODE_SYSTEM_MEMORY)
            logger.info("node %s registered (kubelet port %d)", name, port)

    def _node_status(self, port: int) -> dict[str, Any]:
        now = _now_rfc3339()

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
                for pod in listed.get("items", []):
                    await self._pod_changed("MODIFIED", pod)
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

    async def _pod_changed(self, kind: str, pod: dict[str, Any]) -> None:
        metadata = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        node = spec.get("nodeName")
        key = (str(metadata.get("namespace")), str(metadata.get("name")))
        if node not in self.nodes:
            return
        if kind == "DELETED":
            self.pods.pop(key, None)
            return
        if metadata.get("deletionTimestamp"):
            # The containers "stopped" at once: finish the deletion, as the kubelet does.
            self.pods.pop(key, None)
            await self._call("DELETE", f"/api/v1/namespaces/{key[0]}/pods/{key[1]}",
                             {"apiVersion": "v1", "kind": "DeleteOptions",
                              "gracePeriodSeconds": 0,
                              "preconditions": {"uid": metadata.get("uid")}})
            return
        known = self.pods.get(key)
        if known is None or known.uid != metadata.get("uid"):
            known = _Pod(namespace=key[0], name=key[1], node=str(node),
                         uid=str(metadata.get("uid")),
                         containers={str(c["name"]): _Usage()
                                     for c in spec.get("containers", [])})
            self.pods[key] = known
        if not self._running_and_ready(pod):
            await self._mark_running(pod)

    @staticmethod
    def _running_and_ready(pod: dict[str, Any]) -> bool:
        status = pod.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in status.get("conditions") or [])
        return status.get("phase") == "Running" and ready

    async def _mark_running(self, pod: dict[str, Any]) -> None:
        metadata = pod["metadata"]
        now = _now_rfc3339()
        status = pod.get("status") or {}
        ip = status.get("podIP") or str(next(self._ips))
        started = status.get("startTime") or now

        def condition(kind: str) -> dict[str, Any]:
            return {"type": kind, "status": "True", "lastProbeTime": None,
                    "lastTransitionTime": now}

        containers = [{
            "name": c["name"], "image": c.get("image", ""), "imageID": "",
            "containerID": f"testbed://{metadata['uid']}/{c['name']}",
            "ready": True, "started": True, "restartCount": 0,
            "state": {"running": {"startedAt": started}}}
            for c in pod["spec"].get("containers", [])]
        patch = {"status": {
            "phase": "Running", "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": ip, "podIPs": [{"ip": ip}], "startTime": started,
            "conditions": [condition("PodReadyToStartContainers"), condition("Initialized"),
                           condition("ContainersReady"), condition("Ready"),
                           condition("PodScheduled")],
            "containerStatuses": containers}}
        status_code, reply = await self._call(
            "PATCH", f"/api/v1/namespaces/{metadata['namespace']}/pods/{metadata['name']}/status",
            patch, "application/merge-patch+json")
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
        now = time.time()
        names = [str(body["container"])] if body.get("container") else list(pod.containers)
        for name in names:
            usage = pod.containers.get(name)
            if usage is None:
                return web.json_response({"error": f"no container {name}"}, status=404)
            if "cpu" in body:
                usage.set_cores(float(Decimal(str(body["cpu"]))) / len(names), now)
            if "memory" in body:
                usage.memory = int(Decimal(str(body["memory"]))) // len(names)
        return web.json_response({"ok": True})

    async def get_pods(self, _request: web.Request) -> web.Response:
        return web.json_response(sorted(f"{ns}/{name}" for ns, name in self.pods))

    def _series(self, at: float) -> Iterator[tuple[dict[str, str], float, int, str]]:
        """(labels, cpu seconds, memory bytes, node) of every cgroup the kubelet reports."""
        node_totals: dict[str, tuple[float, int]] = {}
        for pod in self.pods.values():
            cgroup = f"/kubepods/{pod.namespace}/{pod.name}"
            cpu_sum, memory_sum = 0.0, 0
            for name, usage in [*pod.containers.items(), ("POD", pod.pause)]:
                seconds = usage.cpu_seconds(at)
                cpu_sum += seconds
                memory_sum += usage.memory
                yield ({"namespace": pod.namespace, "pod": pod.name, "container": name,
                        "id": f"{cgroup}/{name}", "node": pod.node}, seconds, usage.memory,
                       pod.node)
            yield ({"namespace": pod.namespace, "pod": pod.name, "container": "", "id": cgroup,
                    "node": pod.node}, cpu_sum, memory_sum, pod.node)
            cpu, memory = node_totals.get(pod.node, (0.0, 0))
            node_totals[pod.node] = (cpu + cpu_sum, memory + memory_sum)
        for node, root in self.node_root.items():
            cpu, memory = node_totals.get(node, (0.0, 0))
            yield ({"id": "/", "node": node}, root.cpu_seconds(at) + cpu, root.memory + memory,
                   node)

    @staticmethod
    def _labels(labels: dict[str, str]) -> str:
        def escape(value: str) -> str:
            return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

        return ",".join(f'{k}="{escape(v)}"' for k, v in labels.items())

    async def get_cadvisor(self, _request: web.Request) -> web.Response:
        at = time.time()
        cpu = ["# HELP container_cpu_usage_seconds_total Cumulative cpu time consumed in seconds.",
               "# TYPE container_cpu_usage_seconds_total counter"]
        memory = ["# HELP container_memory_working_set_bytes Current working set in bytes.",
                  "# TYPE container_memory_working_set_bytes gauge"]
        for labels, seconds, working_set, _node in self._series(at):
            rendered = self._labels(labels)
            cpu.append(f"container_cpu_usage_seconds_total{{{rendered}}} {seconds:.9f}")
            memory.append(f"container_memory_working_set_bytes{{{rendered}}} {working_set}")
        return web.Response(text="\n".join(cpu + memory) + "\n",
                            content_type="text/plain", charset="utf-8")

    def resource_metrics(self, node: str, at: float) -> str:
        """The kubelet's /metrics/resource for `node` (timestamps in milliseconds)."""
        stamp = int(at * 1000)
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str) -> None:
            lines.append(f"# HELP {name} [STABLE] {help_text}")
            lines.append(f"# TYPE {name} {kind}")

        pods = [p for p in self.pods.values() if p.node == node]
        family("container_cpu_usage_seconds_total", "counter",
               "Cumulative cpu time consumed by the container in core-seconds")
        for pod in pods:
            for name, usage in pod.containers.items():
                labels = self._labels({"container": name, "namespace": pod.namespace,
                                       "pod": pod.name})
                lines.append(f"container_cpu_usage_seconds_total{{{labels}}} "
                             f"{usage.cpu_seconds(at):.9f} {stamp}")
        family("container_memory_working_set_bytes", "gauge",
               "Current working set of the container in bytes")
        for pod in pods:
            for name, usage in pod.containers.items():
                labels = self._labels({"container": name, "namespace": pod.namespace,
                                       "pod": pod.name})
                lines.append(f"container_memory_working_set_bytes{{{labels}}} {usage.memory} "
                             f"{stamp}")
        family("container_start_time_seconds", "gauge",
               "Start time of the container since unix epoch in seconds")
        for pod in pods:
            for name, usage in pod.containers.items():
                labels = self._labels({"container": name, "namespace": pod.namespace,
                                       "pod": pod.name})
                lines.append(f"container_start_time_seconds{{{labels}}} {usage.started:.9f} "
                             f"{stamp}")
        node_cpu = sum(s for labels, s, _m, n in self._series(at)
                       if n == node and labels.get("id") == "/")
        node_memory = sum(m for labels, _s, m, n in self._series(at)
                          if n == node and labels.get("id") == "/")
        family("node_cpu_usage_seconds_total", "counter",
               "Cumulative cpu time consumed by the node in core-seconds")
        lines.append(f"node_cpu_usage_seconds_total {node_cpu:.9f} {stamp}")
        family("node_memory_working_set_bytes", "gauge",
               "Current working set of the node in bytes")
        lines.append(f"node_memory_working_set_bytes {node_memory} {stamp}")
        family("pod_cpu_usage_seconds_total", "counter",
               "Cumulative cpu time consumed by the pod in core-seconds")
        for pod in pods:
            total = sum(u.cpu_seconds(at) for u in [*pod.containers.values(), pod.pause])
            labels = self._labels({"namespace": pod.namespace, "pod": pod.name})
            lines.append(f"pod_cpu_usage_seconds_total{{{labels}}} {total:.9f} {stamp}")
        family("pod_memory_working_set_bytes", "gauge",
               "Current working set of the pod in bytes")
        for pod in pods:
            total_memory = sum(u.memory for u in [*pod.containers.values(), pod.pause])
            labels = self._labels({"namespace": pod.namespace, "pod": pod.name})
            lines.append(f"pod_memory_working_set_bytes{{{labels}}} {total_memory} {stamp}")
        family("scrape_error", "gauge",
               "1 if there was an error while getting container metrics, 0 otherwise")
        lines.append("scrape_error 0")
        return "\n".join(lines) + "\n"

    # ---- serving ----------------------------------------------------------------------------

    async def start(self, ready_file: Path) -> None:
        self._session = aiohttp.ClientSession()
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
        ready_file.write_text(json.dumps({"control_port": self.control_port,
                                          "node_ports": self.node_ports}))

    def _resource_handler(self, node: str) -> Any:
        async def handler(_request: web.Request) -> web.Response:
            return web.Response(text=self.resource_metrics(node, time.time()),
                                content_type="text/plain", charset="utf-8")
        return handler

    async def close(self) -> None:
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
                             nodes=args.nodes.split(","), serving_context=serving)
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
    parser.add_argument("--ready-file", required=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(_amain(parser.parse_args()))


if __name__ == "__main__":
    main()
