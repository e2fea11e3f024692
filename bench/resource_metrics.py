"""`kubectl top pods -A` over 10,000 pods through metrics-server and through metricscale.

Run with `.venv/bin/python bench/resource_metrics.py` (needs `make peers` and Prometheus; about
12 minutes with the default five-minute warm-up). Everything runs in one run, on one machine:

1. A real control plane (testbed: etcd, kube-apiserver with the aggregator, controllers) and
   the kubelet stand-in with `--nodes` Ready nodes (100).
2. `--pods` bare Pods (10,000), bound to the nodes by `spec.nodeName` and spread over
   `--namespaces` namespaces (100), created straight through the API, `--concurrency` (32) at
   once; each carries its usage (the stand-in's annotation: 1-250 millicores, 16-79 MiB) from
   its start. The stand-in marks them Running and Ready (16 status writes at once). Both steps
   are timed.
3. A real Prometheus scraping the stand-in's cAdvisor series every `--scrape-interval` (15s)
   and `metricscale adapter` with the default rules unchanged (`rate(...[5m])`) under its
   manifests' RBAC; the real metrics-server v0.8.0 as upstream's manifest runs it
   (`--metric-resolution=15s`), scraping every node's `/metrics/resource`. The measurement
   starts once both serve every pod and Prometheus has held the pods' series for `--warmup`
   (one rate range, 5m, by default: the steady state's samples per query).
4. `--runs` (7) rounds, alternating which server goes first: `v1beta1.metrics.k8s.io` is
   pointed at the server (not timed), then `kubectl top pods -A` runs through the aggregator and
   its wall time is taken, with the CPU time (utime + stime, /proc) each process used meanwhile:
   the server, Prometheus, kube-apiserver, and kubectl itself. One untimed run per server
   first warms kubectl's discovery cache. Then `--direct` (5) all-namespaces lists straight to
   each server (the aggregator's front-proxy identity): the server's own time, without
   kube-apiserver and kubectl.
5. The floor of our design: the 200 PromQL queries our adapter sends for that list (each
   namespace's CPU and memory `containerQuery`, built by the adapter's own code), sent straight
   to Prometheus with the adapter's concurrency (16 namespaces at once), `--direct` times; and,
   for comparison only, what one CPU and one memory query over every namespace at once would
   cost (not what the adapter or prometheus-adapter send: both query namespace by namespace).
6. Each process's background CPU (metrics-server's scrapes, Prometheus' scrapes, our watches)
   is measured over `--idle` seconds (30) before the runs and taken off the per-answer figures.

The goal (issue 22): ours at most 1.2x metrics-server's `kubectl top pods -A` wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adapter.rules.defaults import DEFAULT_CONFIG_YAML  # noqa: E402
from testbed.aggregated import AggregatedServer, process_usage  # noqa: E402
from testbed.binaries import find_peer  # noqa: E402
from testbed.controlplane import ControlPlane, KubeError  # noqa: E402
from testbed.fakes.prometheus import PrometheusServer, find_prometheus  # noqa: E402
from testbed.kubelet import ANNOTATION_PREFIX  # noqa: E402
from testbed.metrics_server import MetricsServer  # noqa: E402
from testbed.metricscale_adapter import MetricscaleAdapter  # noqa: E402
from testbed.processes import wait_until  # noqa: E402

METRICS = "/apis/metrics.k8s.io/v1beta1"
MI = 1024 * 1024


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass
class Server:
    """One side's measurements."""

    name: str
    server: AggregatedServer
    kubectl_seconds: list[float] = field(default_factory=list)
    kubectl_rows: list[int] = field(default_factory=list)
    direct_seconds: list[float] = field(default_factory=list)
    answer_bytes: int = 0
    cpu: dict[str, list[float]] = field(default_factory=dict)  # process -> CPU s per run
    direct_cpu: list[float] = field(default_factory=list)
    namespace_seconds: list[float] = field(default_factory=list)  # kubectl top pods -n top-000
    background: dict[str, float] = field(default_factory=dict)  # process -> CPU s per s

    def record_cpu(self, process: str, seconds: float) -> None:
        self.cpu.setdefault(process, []).append(seconds)


# --------------------------------------------------------------------------------------------
# Setup


def pod_object(index: int, *, namespaces: int, nodes: int) -> tuple[str, dict[str, Any]]:
    namespace = f"top-{index % namespaces:03d}"
    cpu = f"{(index % 250 + 1) / 1000:.3f}"
    memory = (16 + index % 64) * MI
    return namespace, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"pod-{index:05d}", "namespace": namespace,
                     "labels": {"app": f"app-{index % 10}"},
                     "annotations": {ANNOTATION_PREFIX + "usage": json.dumps(
                         {"app": {"cpu": cpu, "memory": memory}})}},
        "spec": {"nodeName": f"node-{index % nodes:03d}", "automountServiceAccountToken": False,
                 "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]}}


async def create_pods(cluster: ControlPlane, *, pods: int, namespaces: int, nodes: int,
                      concurrency: int) -> None:
    context = ssl.create_default_context(cafile=str(cluster.ca_file))
    context.load_cert_chain(str(cluster.admin.cert), str(cluster.admin.key))
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(pods):
        queue.put_nowait(index)
    connector = aiohttp.TCPConnector(limit=concurrency, ssl=context)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            while not queue.empty():
                index = queue.get_nowait()
                namespace, pod = pod_object(index, namespaces=namespaces, nodes=nodes)
                for attempt in range(20):
                    async with session.post(
                            f"{cluster.server}/api/v1/namespaces/{namespace}/pods",
                            json=pod) as reply:
                        if reply.status in (201, 409):
                            break
                        body = await reply.text()
                        if reply.status not in (429, 500, 503, 504) and attempt > 2:
                            raise RuntimeError(f"creating {namespace}/pod-{index:05d}: "
                                               f"{reply.status} {body[:300]}")
                    await asyncio.sleep(0.2 * (attempt + 1))

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def all_running(cluster: ControlPlane) -> bool:
    selector = urllib.parse.quote("status.phase!=Running")
    listed = cluster.get(f"/api/v1/pods?fieldSelector={selector}&limit=1")
    return not listed.get("items")


def served_pods(server: AggregatedServer) -> int:
    reply = server.request(f"{METRICS}/pods")
    return len(reply.json().get("items") or []) if reply.status == 200 else 0


def pid_of_prometheus(prometheus: PrometheusServer) -> int:
    wanted = str(prometheus.config_file)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if wanted in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    return int(entry.name)
            except OSError:
                continue
    raise RuntimeError("Prometheus' process not found")


# --------------------------------------------------------------------------------------------
# Measuring


def routed_to(cluster: ControlPlane, *, ours: bool) -> bool:
    # Our window is the rules' range (5m0s); metrics-server's its scrape interval.
    try:
        nodes = cluster.get(f"{METRICS}/nodes")
    except (KubeError, OSError):
        return False
    windows = {item.get("window") for item in nodes.get("items") or []}
    return bool(windows) and (windows == {"5m0s"} if ours else "5m0s" not in windows)


def point_at(cluster: ControlPlane, side: Server, *, ours: bool) -> None:
    if routed_to(cluster, ours=ours):
        return
    side.server.point()
    wait_until(lambda: routed_to(cluster, ours=ours), what=f"metrics.k8s.io from {side.name}",
               timeout=300, interval=0.2)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_of(pids: dict[str, int]) -> dict[str, float]:
    return {name: process_usage(pid).cpu_seconds for name, pid in pids.items()}


def kubectl_top(cluster: ControlPlane, *scope: str) -> tuple[float, int, float]:
    """Wall seconds, rows printed and kubectl's own CPU seconds of `kubectl top pods -A`
    (or of another scope)."""
    kubectl = str(find_peer("kubectl"))
    before = children_cpu()
    began = time.monotonic()
    done = subprocess.run([kubectl, f"--kubeconfig={cluster.kubeconfig}", "top", "pods",
                           *(scope or ("-A",))],
                          capture_output=True, text=True, check=False, timeout=600)
    wall = time.monotonic() - began
    if done.returncode != 0:
        raise RuntimeError(f"kubectl top pods {' '.join(scope)}: {done.stderr.strip()}")
    return wall, len(done.stdout.splitlines()) - 1, children_cpu() - before


def measure_background(pids: dict[str, int], seconds: float) -> dict[str, float]:
    before = cpu_of(pids)
    began = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - began
    after = cpu_of(pids)
    return {name: (after[name] - before[name]) / elapsed for name in pids}


def run_rounds(cluster: ControlPlane, sides: list[Server], *, runs: int,
               pids: dict[str, dict[str, int]]) -> None:
    for index, side in enumerate(sides):
        point_at(cluster, side, ours=index == 1)
        kubectl_top(cluster)  # fills kubectl's discovery cache; not timed
    for round_number in range(runs):
        order = list(enumerate(sides))
        if round_number % 2:
            order.reverse()
        for index, side in order:
            point_at(cluster, side, ours=index == 1)
            before = cpu_of(pids[side.name])
            began = time.monotonic()
            wall, rows, kubectl_cpu = kubectl_top(cluster)
            elapsed = time.monotonic() - began
            after = cpu_of(pids[side.name])
            side.kubectl_seconds.append(wall)
            side.kubectl_rows.append(rows)
            side.record_cpu("kubectl", kubectl_cpu)
            for name in pids[side.name]:
                side.record_cpu(name, after[name] - before[name]
                                - side.background.get(name, 0.0) * elapsed)
            one, _, _ = kubectl_top(cluster, "-n", "top-000")
            side.namespace_seconds.append(one)
            log(f"round {round_number + 1}: {side.name} {wall:.2f} s, {rows} rows "
                f"(one namespace: {one:.2f} s)")


def run_direct(sides: list[Server], *, lists: int, pids: dict[str, dict[str, int]]) -> None:
    for side in sides:
        side.server.request(f"{METRICS}/pods")  # warm
        for _ in range(lists):
            name = "server"
            before = process_usage(pids[side.name][name]).cpu_seconds
            began = time.monotonic()
            reply = side.server.request(f"{METRICS}/pods")
            elapsed = time.monotonic() - began
            after = process_usage(pids[side.name][name]).cpu_seconds
            if reply.status != 200:
                raise RuntimeError(f"{side.name}: {reply.status} {reply.body[:300]!r}")
            side.direct_seconds.append(elapsed)
            side.direct_cpu.append(after - before - side.background.get(name, 0.0) * elapsed)
            side.answer_bytes = len(reply.body)


def adapter_queries(*, pods: int, namespaces: int, nodes: int) -> list[tuple[str, str]]:
    """Each namespace's CPU and memory containerQuery as the adapter builds them."""
    from adapter.http.usage import usage_labels
    from adapter.rules.config import parse_config
    from adapter.rules.query import build_pod_usage_query

    rules = parse_config(DEFAULT_CONFIG_YAML).resource_rules
    assert rules is not None
    by_namespace: dict[str, list[str]] = {}
    for index in range(pods):
        namespace, pod = pod_object(index, namespaces=namespaces, nodes=nodes)
        by_namespace.setdefault(namespace, []).append(pod["metadata"]["name"])
    return [(build_pod_usage_query(rule=rules.cpu, labels=usage_labels(rules.cpu),
                                   namespace=namespace, pods=sorted(names)),
             build_pod_usage_query(rule=rules.memory, labels=usage_labels(rules.memory),
                                   namespace=namespace, pods=sorted(names)))
            for namespace, names in sorted(by_namespace.items())]


async def send_queries(url: str, queries: list[tuple[str, str]], *, at: float) -> int:
    """The queries as the adapter sends them for one list (POST, 16 namespaces at once);
    the number of samples answered."""
    limit = asyncio.Semaphore(16)
    samples = 0
    async with aiohttp.ClientSession() as session:

        async def query(promql: str) -> None:
            nonlocal samples
            async with session.post(f"{url}/api/v1/query",
                                    data={"query": promql, "time": f"{at:.3f}"}) as reply:
                body = await reply.json()
                if body.get("status") != "success":
                    raise RuntimeError(f"Prometheus: {body}")
                samples += len(body["data"]["result"])

        async def namespace(cpu: str, memory: str) -> None:
            async with limit:
                await asyncio.gather(query(cpu), query(memory))

        await asyncio.gather(*(namespace(cpu, memory) for cpu, memory in queries))
    return samples


# The default rules' containerQuery for every namespace at once (for comparison only).
ALL_AT_ONCE = [(
    'sum by (namespace,pod,container) (\n  rate(container_cpu_usage_seconds_total'
    '{container!="",container!="POD"}[5m])\n)\n',
    'sum by (namespace,pod,container) (\n  container_memory_working_set_bytes'
    '{container!="",container!="POD"}\n)\n')]


def run_floor(url: str, queries: list[tuple[str, str]], *, times: int, pid: int,
              background: float) -> tuple[list[float], list[float], int]:
    walls: list[float] = []
    cpus: list[float] = []
    samples = asyncio.run(send_queries(url, queries, at=time.time()))  # warm
    for _ in range(times):
        before = process_usage(pid).cpu_seconds
        began = time.monotonic()
        samples = asyncio.run(send_queries(url, queries, at=time.time()))
        elapsed = time.monotonic() - began
        walls.append(elapsed)
        cpus.append(process_usage(pid).cpu_seconds - before - background * elapsed)
    return walls, cpus, samples


# --------------------------------------------------------------------------------------------
# Report


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def report(*, args: argparse.Namespace, setup: list[tuple[str, float]],
           sides: list[Server], rss: dict[str, tuple[int, int]],
           floor: tuple[list[float], list[float], int],
           at_once: tuple[list[float], list[float], int], loads: tuple[str, str]) -> str:
    ms, ours = sides
    lines = [
        "",
        f"kubectl top pods -A over {args.pods:,} pods ({args.namespaces} namespaces, "
        f"{args.nodes} nodes): metrics-server v0.8.0 and metricscale, {args.runs} alternating "
        "rounds",
        f"({os.cpu_count()} CPUs; load average {loads[0]} before the runs, {loads[1]} after: "
        "the whole machine's, other work included)",
        "",
        "setup                                                        seconds",
    ]
    lines += [f"  {what:<58} {seconds:8.1f}" for what, seconds in setup]

    def row(label: str, left: float, right: float, unit: str = "", digits: int = 3,
            ratio: bool = True) -> str:
        shown = f"{right / left:6.2f}x" if ratio and left > 0 else ""
        return (f"  {label:<46} {left:>12.{digits}f}{unit} {right:>12.{digits}f}{unit}  "
                f"{shown}")

    lines += ["", f"  {'':<46} {'metrics-server':>13} {'metricscale':>13}  ratio"]
    ms_wall, our_wall = _median(ms.kubectl_seconds), _median(ours.kubectl_seconds)
    lines.append(row("kubectl top pods -A, wall, median (s)", ms_wall, our_wall))
    lines.append("    runs: metrics-server " + ", ".join(f"{t:.2f}" for t in ms.kubectl_seconds)
                 + " / metricscale " + ", ".join(f"{t:.2f}" for t in ours.kubectl_seconds))
    lines.append(f"    rows printed: {sorted(set(ms.kubectl_rows))} / "
                 f"{sorted(set(ours.kubectl_rows))}")
    lines.append(row(f"kubectl top pods -n top-000 ({args.pods // args.namespaces} pods), "
                     "median (s)", _median(ms.namespace_seconds),
                     _median(ours.namespace_seconds)))
    for name, label in (("server", "server CPU per kubectl run (s)"),
                        ("prometheus", "Prometheus CPU per kubectl run (s)"),
                        ("kube-apiserver", "kube-apiserver CPU per kubectl run (s)"),
                        ("kubectl", "kubectl's own CPU per run (s)")):
        left = _median(ms.cpu.get(name, []))
        right = _median(ours.cpu.get(name, []))
        if name == "prometheus":
            lines.append(f"  {label:<46} {'-':>13} {right:>13.3f}")
        else:
            lines.append(row(label, left, right))
    lines.append(row("all-namespaces list straight to the server (s)",
                     _median(ms.direct_seconds), _median(ours.direct_seconds)))
    lines.append(row("  its server CPU (s)", _median(ms.direct_cpu),
                     _median(ours.direct_cpu)))
    walls, cpus, samples = floor
    label = f"our {2 * args.namespaces} queries straight to Prometheus (s)"
    lines.append(f"  {label:<46} {'-':>13} {_median(walls):>13.3f}  ({samples:,} samples)")
    lines.append(f"  {'  their Prometheus CPU (s)':<46} {'-':>13} {_median(cpus):>13.3f}")
    walls, cpus, samples = at_once
    lines.append(f"  {'(one query pair for all namespaces (s))':<46} {'-':>13} "
                 f"{_median(walls):>13.3f}  ({samples:,} samples)")
    lines.append(f"  {'(  its Prometheus CPU (s))':<46} {'-':>13} {_median(cpus):>13.3f}")
    lines.append(row("answer size (MB)", ms.answer_bytes / 1e6, ours.answer_bytes / 1e6,
                     digits=2))
    lines.append(row("server RSS after the runs (MiB)", rss["metrics-server"][0] / MI,
                     rss["metricscale"][0] / MI, digits=0))
    lines.append(row("server peak RSS (MiB)", rss["metrics-server"][1] / MI,
                     rss["metricscale"][1] / MI, digits=0))
    for side in sides:
        background = ", ".join(f"{name} {rate * 1000:.0f} ms/s"
                               for name, rate in side.background.items())
        lines.append(f"  background CPU while {side.name} idles: {background}")
    ratio = our_wall / ms_wall if ms_wall > 0 else float("nan")
    verdict = "met" if ratio <= 1.2 else "NOT met"
    lines += ["", f"goal: metricscale at most 1.2x metrics-server's wall time: {ratio:.2f}x, "
                  f"{verdict}"]
    return "\n".join(lines)


def vm(pid: int) -> tuple[int, int]:
    rss = peak = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith("VmHWM:"):
            peak = int(line.split()[1]) * 1024
    return rss, peak


# --------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--namespaces", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--direct", type=int, default=5)
    parser.add_argument("--scrape-interval", default="15s")
    parser.add_argument("--warmup", type=float, default=300.0,
                        help="seconds Prometheus holds the series before measuring (5m: one "
                             "rate range of the default rules)")
    parser.add_argument("--idle", type=float, default=30.0)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    prometheus_binary = find_prometheus()
    if prometheus_binary is None:
        sys.exit("prometheus not found ($PROMETHEUS or the PATH)")
    workdir = Path(tempfile.mkdtemp(prefix="metricscale-bench-top-"))
    setup: list[tuple[str, float]] = []
    cluster = ControlPlane(workdir=workdir / "cluster")
    servers: list[AggregatedServer] = []
    prometheus: PrometheusServer | None = None
    try:
        cluster.start()
        assert cluster.startup_seconds is not None
        setup.append(("control plane started", cluster.startup_seconds))

        def timed(what: str, step: Callable[[], Any]) -> Any:
            began = time.monotonic()
            log(what + " ...")
            result = step()
            setup.append((what, time.monotonic() - began))
            return result

        kubelet = timed(f"{args.nodes} nodes registered (the kubelet stand-in)",
                        lambda: cluster.start_kubelet(
                            [f"node-{i:03d}" for i in range(args.nodes)]))
        prometheus = PrometheusServer(binary=prometheus_binary,
                                      scrape_interval=args.scrape_interval)
        prometheus.start()
        prometheus.add_target(kubelet.address, job="kubelet")

        def namespaces() -> None:
            for index in range(args.namespaces):
                cluster.apply({"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": f"top-{index:03d}"}})
            wait_until(lambda: len(cluster.get(
                "/api/v1/serviceaccounts?fieldSelector=metadata.name%3Ddefault")["items"])
                > args.namespaces, what="the namespaces' default service accounts",
                timeout=300, children=cluster.children)

        timed(f"{args.namespaces} namespaces and their default service accounts", namespaces)
        timed(f"{args.pods:,} pods created ({args.concurrency} at once)",
              lambda: asyncio.run(create_pods(cluster, pods=args.pods,
                                              namespaces=args.namespaces, nodes=args.nodes,
                                              concurrency=args.concurrency)))
        created = setup[-1][1]
        setup[-1] = (f"{setup[-1][0]}: {args.pods / created:.0f} pods/s", created)
        timed("all Running (the stand-in's status writes)",
              lambda: wait_until(lambda: all_running(cluster), what="all pods Running",
                                 timeout=1800, children=cluster.children, interval=1.0))
        running_at = time.monotonic()
        metrics_server = MetricsServer(cluster, workdir=workdir / "metrics-server")
        adapter = MetricscaleAdapter(cluster, workdir=workdir / "adapter",
                                     config_text=DEFAULT_CONFIG_YAML,
                                     prometheus_url=prometheus.url, relist_interval="1m")
        servers = [metrics_server, adapter]
        def start_servers() -> None:
            for server in servers:
                server.start()

        timed("metrics-server and metricscale started", start_servers)

        def both_serve() -> bool:
            counts = [served_pods(s) for s in servers]
            log(f"  serving {counts[0]:,} / {counts[1]:,} pods")
            return all(count >= args.pods for count in counts)

        timed("both serving every pod",
              lambda: wait_until(both_serve, what="both serving every pod", timeout=1800,
                                 children=cluster.children, interval=10))
        left = args.warmup - (time.monotonic() - running_at)
        if left > 0:
            timed(f"rest of the warm-up ({args.warmup:.0f} s of series since all Running)",
                  lambda: time.sleep(left))
        apiserver = next(c for c in cluster.children if c.name == "kube-apiserver")
        prometheus_pid = pid_of_prometheus(prometheus)
        sides = [Server("metrics-server", metrics_server), Server("metricscale", adapter)]
        pids = {
            "metrics-server": {"server": metrics_server.pid,
                               "kube-apiserver": apiserver.process.pid},
            "metricscale": {"server": adapter.pid, "prometheus": prometheus_pid,
                            "kube-apiserver": apiserver.process.pid},
        }
        log(f"background CPU over {args.idle:.0f} s ...")
        background = measure_background(
            {"metrics-server": metrics_server.pid, "metricscale": adapter.pid,
             "prometheus": prometheus_pid, "kube-apiserver": apiserver.process.pid},
            args.idle)
        sides[0].background = {"server": background["metrics-server"],
                               "kube-apiserver": background["kube-apiserver"]}
        sides[1].background = {"server": background["metricscale"],
                               "prometheus": background["prometheus"],
                               "kube-apiserver": background["kube-apiserver"]}
        load_before = load_average()
        run_rounds(cluster, sides, runs=args.runs, pids=pids)
        run_direct(sides, lists=args.direct, pids=pids)
        queries = adapter_queries(pods=args.pods, namespaces=args.namespaces, nodes=args.nodes)
        floor = run_floor(prometheus.url, queries, times=args.direct, pid=prometheus_pid,
                          background=background["prometheus"])
        at_once = run_floor(prometheus.url, ALL_AT_ONCE, times=args.direct,
                            pid=prometheus_pid, background=background["prometheus"])
        rss = {"metrics-server": vm(metrics_server.pid), "metricscale": vm(adapter.pid)}
        print(report(args=args, setup=setup, sides=sides, rss=rss, floor=floor, at_once=at_once,
                     loads=(load_before, load_average())))
    finally:
        for server in servers:
            server.stop()
        if prometheus is not None:
            prometheus.close()
        cluster.stop()
        if args.keep:
            print(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
