"""Benchmark of `metricscale adapter` against prometheus-adapter, direct PromQL and a floor.

Run with `.venv/bin/python bench/adapter.py` (needs prometheus, promtool and kubectl, and `make
peers` for the real control plane and prometheus-adapter v0.12.0; about ten minutes). One run
measures every target side by side, in turn, so that all of them see the same background load;
`--skip-peer` leaves prometheus-adapter out, `--skip-latency`, `--skip-discovery` and
`--skip-resource` leave out a part; `--variant "NAME DIR [FLAG ...]"` adds ours again from another
source tree (a lever alone: the tree before the levers plus that lever's diff) to every part.

1. Latency (a real control plane, testbed.ControlPlane): a real Prometheus scrapes one gauge
   for 100 pods, which exist as Pods in the control plane. `metricscale adapter` and the real
   prometheus-adapter run as processes on the same rule, each under its own manifests' RBAC
   (testbed), delegating authentication and authorization to kube-apiserver, and are asked
   directly over HTTPS as the aggregator asks: the front-proxy client certificate,
   `X-Remote-User` and `X-Remote-Group`, and the HPA's Accept. The same `pods/*` request goes
   to each, and the PromQL ours sends for it goes straight to Prometheus (POST /api/v1/query),
   in turn, one at a time, after 50 warm-up requests each: p50/p99 of each. Every target is
   reached through an aiohttp session with the same settings (keep-alive, `limit` = clients,
   no proxy lookups). The floor, measured in the same turns: a minimal aiohttp HTTPS server
   (its own process, our serving certificate) that answers a fixed body of our answer's size,
   with and without first sending the same PromQL to Prometheus: what any adapter built on
   aiohttp costs before it does any work of its own. Each server process's own CPU time per
   request (from /proc, in alternating blocks) says how much of a gap is work rather than
   waiting. Then 32 concurrent clients hit each target for a few seconds, in three alternating
   rounds: requests per second (median). RSS of each server after the runs.
   prometheus-adapter runs with `--client-qps=1000 --client-burst=1000`: it lists the pods
   from kube-apiserver on every `*` request, and its client's own throttle (5/s by default)
   would otherwise pace it. Its relist interval is set to ours (1m).
   With `--backends 2` a second adapter process serves the same rule on `default` and on a
   second backend (a `backends:` entry for the same Prometheus), and both of its metrics are
   measured in the same turns: a rule on either backend should cost what one backend costs.
   With `--cache-ttl` (default 5s; 0 skips it) another adapter process started with
   `--prometheus-cache-ttl` is measured the same way and reported apart, labelled: those
   answers can be up to the TTL old, so they are never the headline.
2. Discovery: a second Prometheus is backfilled with promtool with 10^6 series in 1,000 metric
   names. Each server is started on prometheus-adapter's default rules (its `config-gen`
   output) with that Prometheus, and the time from its start to its first complete listing
   (`/apis/custom.metrics.k8s.io/v1beta1` polled until every one of the 1,000 names is
   listed) and its peak RSS (`VmHWM` of /proc status, read then) are taken; ours and
   prometheus-adapter alternate, `--discovery-rounds` (2) each, medians reported. Also one
   pass of ours alone, in a child process (the pass's own duration and that process's peak
   RSS, interpreter included), as before.
3. Resource metrics (`--skip-resource`; the fake kube-apiserver): a third Prometheus is
   backfilled with promtool with two gauges (`bench_cpu`, `bench_memory`) for 10,000 running
   pods (`--top-pods`) in 100 namespaces, 1,000 of them (`--resource-pods`) in one; the
   adapter runs with its own resourceRules reading those gauges and a serving certificate from
   metricscale.pki. The namespace's metrics.k8s.io pod list goes to the adapter, and the CPU
   and memory containerQuery it sends go straight to Prometheus, both at once, in turn after 50
   warm-up requests: p50/p99 of each. Then the all-namespaces list: straight to the adapter,
   and as `kubectl top pods -A` through the fake kube-apiserver's aggregator (an APIService
   for v1beta1.metrics.k8s.io whose caBundle trusts the adapter's certificate): wall times.
   (`bench/resource_metrics.py` compares `kubectl top pods -A` with metrics-server on the real
   control plane.)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import re
import resource
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (after the path set-up)
from adapter.rules.defaults import CONFIG_GEN_DEFAULTS_YAML  # noqa: E402
from testbed.aggregated import AggregatedServer  # noqa: E402
from testbed.binaries import find_peer  # noqa: E402
from testbed.controlplane import ControlPlane, ControlPlaneMissing, KubeError  # noqa: E402
from testbed.metricscale_adapter import MetricscaleAdapter  # noqa: E402
from testbed.processes import Child, wait_until  # noqa: E402

PODS_CONFIG = """
rules:
- seriesQuery: 'bench_requests'
  resources:
    overrides:
      namespace: {resource: namespace}
      pod: {resource: pod}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
"""

# `--backends 2`: the same rule on `default` and on a second backend (the same Prometheus, so
# only the adapter's side differs), served by a second adapter process.
TWO_BACKENDS_CONFIG = """
backends:
- name: second
  url: {url}
rules:
- seriesQuery: 'bench_requests'
  resources:
    overrides:
      namespace: {{resource: namespace}}
      pod: {{resource: pod}}
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)'
- seriesQuery: 'bench_requests'
  backend: second
  name: {{matches: "^bench_requests$", as: "bench_requests_second"}}
  resources:
    overrides:
      namespace: {{resource: namespace}}
      pod: {{resource: pod}}
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)'
"""

BENCH_NAMESPACE = "bench"
OURS = "metricscale"
PEER = "prometheus-adapter"
# The identity the aggregator passes on (a cluster admin: both servers' reviews allow it and
# cache the answer for 10 s).
CALLER = {"X-Remote-User": "metricscale-bench", "X-Remote-Group": "system:masters"}
CUSTOM_V1BETA1 = "/apis/custom.metrics.k8s.io/v1beta1"


# --------------------------------------------------------------------------------------------
# Helpers


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


@dataclass(frozen=True)
class Latency:
    p50_ms: float
    p99_ms: float
    mean_ms: float


def _latency(samples: list[float]) -> Latency:
    return Latency(p50_ms=_percentile(samples, 0.5) * 1000,
                   p99_ms=_percentile(samples, 0.99) * 1000,
                   mean_ms=statistics.fmean(samples) * 1000)


async def _throughput(call: Callable[[], Awaitable[None]], *, clients: int,
                      seconds: float) -> float:
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await call()
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    return done / (time.perf_counter() - started)


def _memory_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (the peak) of a process, in MB."""
    found = {"rss_mb": 0.0, "peak_rss_mb": 0.0}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            found["rss_mb"] = int(line.split()[1]) / 1024
        elif line.startswith("VmHWM:"):
            found["peak_rss_mb"] = int(line.split()[1]) / 1024
    return found


def _pid_of_prometheus(config_file: Path) -> int:
    """The Prometheus process started with `config_file` (its command line names it)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(config_file) in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    return int(entry.name)
            except OSError:
                continue
    raise RuntimeError("Prometheus' process not found")


def _apiserver_pid(cluster: ControlPlane) -> int:
    return next(c.process.pid for c in cluster.children if c.name == "kube-apiserver")


def _load_average() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


# --------------------------------------------------------------------------------------------
# The servers on the real control plane


def _peer_rbac(namespace: str, account: str) -> list[dict[str, Any]]:
    """prometheus-adapter's deploy/manifests RBAC (v0.12): the resource reader, the
    auth-delegator binding and the extension-apiserver-authentication reader binding, for
    `account` in `namespace` (cluster-scoped names suffixed with the namespace)."""
    rbac = "rbac.authorization.k8s.io"
    subject = [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    reader = f"prometheus-adapter-{namespace}"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": account, "namespace": namespace}},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRole", "metadata": {"name": reader},
         "rules": [{"apiGroups": [""], "resources": ["nodes", "namespaces", "pods", "services"],
                    "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": reader},
         "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": reader},
         "subjects": subject},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": f"{reader}:system:auth-delegator"},
         "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": "system:auth-delegator"},
         "subjects": subject},
        {"apiVersion": f"{rbac}/v1", "kind": "RoleBinding",
         "metadata": {"name": f"{reader}-auth-reader", "namespace": "kube-system"},
         "roleRef": {"apiGroup": rbac, "kind": "Role",
                     "name": "extension-apiserver-authentication-reader"},
         "subjects": subject},
    ]


class _Timed:
    """Records when the process was started (`spawned`, monotonic) and lets the caller skip the
    wait until it answers (`wait=False`: the discovery part polls the listing itself)."""

    spawned = 0.0
    wait = True
    checkout: Path | None = None  # another source tree to run (`--variant`)
    child: Child | None = None

    def _run(self, argv: Any, *, env: dict[str, str] | None = None) -> Any:
        self.spawned = time.monotonic()
        if self.checkout is None:
            return super()._run(argv, env=env)  # type: ignore[misc]
        # `python -m metricscale` imports the packages of its working directory first.
        assert isinstance(self, AggregatedServer)
        self.child = Child(self.name, argv, log=self.workdir / f"{self.name}.log", env=env,
                           cwd=self.checkout)
        return self.child

    def wait_answering(self, path: str, *, timeout: float = 120) -> None:
        if self.wait:
            super().wait_answering(path, timeout=timeout)  # type: ignore[misc]


class OurAdapter(_Timed, MetricscaleAdapter):
    """`metricscale adapter` under its manifests' RBAC (testbed.metricscale_adapter)."""


class PeerAdapter(_Timed, AggregatedServer):
    """The real prometheus-adapter (v0.12.0, `make peers`) under its deploy manifests' RBAC,
    with the service account's token for listing, authentication and authorization."""

    def __init__(self, cluster: ControlPlane, *, workdir: Path, config_text: str,
                 prometheus_url: str, namespace: str = "bench-peer",
                 relist_interval: str = "1m", extra_args: tuple[str, ...] = ()) -> None:
        super().__init__(cluster, name="prometheus-adapter", namespace=namespace,
                         service="prometheus-adapter", workdir=workdir)
        self.config = workdir / "peer-config.yaml"
        self.config.write_text(config_text)
        self.prometheus_url = prometheus_url
        self.relist_interval = relist_interval
        self.extra_args = extra_args

    def start(self) -> None:
        binary = find_peer("prometheus-adapter")
        if binary is None:
            raise ControlPlaneMissing("prometheus-adapter not found (make peers builds it)")
        self.ensure_namespace()
        for obj in _peer_rbac(self.namespace, "prometheus-adapter"):
            self.cluster.apply(obj)
        kubeconfig = self.kubeconfig_of("prometheus-adapter")
        self._run([
            str(binary), f"--secure-port={self.port}", "--bind-address=127.0.0.1",
            f"--tls-cert-file={self.cert}", f"--tls-private-key-file={self.key}",
            f"--lister-kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}", f"--config={self.config}",
            f"--prometheus-url={self.prometheus_url}",
            f"--metrics-relist-interval={self.relist_interval}", "--profiling=false",
            "--client-qps=1000", "--client-burst=1000", *self.extra_args])
        self.wait_answering("/readyz")

    def __enter__(self) -> PeerAdapter:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _start_ours(cluster: ControlPlane, *, workdir: Path, config_text: str, prometheus_url: str,
                namespace: str, relist_interval: str = "1m", extra: tuple[str, ...] = (),
                wait: bool = True, variant: Variant | None = None) -> OurAdapter:
    server = OurAdapter(cluster, workdir=workdir, config_text=config_text,
                        prometheus_url=prometheus_url, namespace=namespace,
                        relist_interval=relist_interval,
                        extra_args=("--log-level=error", *extra,
                                    *(variant.flags if variant else ())))
    server.wait = wait
    server.checkout = variant.checkout if variant else None
    server.start()
    return server


@dataclass(frozen=True)
class Variant:
    """`--variant "NAME DIR [FLAG ...]"`: ours again, from the source tree DIR (`.` for this
    one) with extra flags, measured in the same turns as a target of its own (levers)."""

    name: str
    checkout: Path
    flags: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Variant:
        import shlex

        name, directory, *flags = shlex.split(text)
        checkout = Path(directory).resolve()
        if not (checkout / "adapter").is_dir():
            raise argparse.ArgumentTypeError(f"{directory}: not a metricscale source tree")
        return cls(name, checkout, tuple(flags))

    @property
    def namespace(self) -> str:
        return "bench-v-" + "".join(c if c.isalnum() else "-" for c in self.name.lower())


def _start_peer(cluster: ControlPlane, *, workdir: Path, config_text: str, prometheus_url: str,
                relist_interval: str = "1m", extra: tuple[str, ...] = (),
                wait: bool = True) -> PeerAdapter:
    server = PeerAdapter(cluster, workdir=workdir, config_text=config_text,
                         prometheus_url=prometheus_url, relist_interval=relist_interval,
                         extra_args=extra)
    server.wait = wait
    server.start()
    return server


def _client_context(cluster: ControlPlane) -> ssl.SSLContext:
    """What the aggregator presents: the front-proxy client certificate; it trusts the
    cluster's CA, which signed every server's certificate here."""
    context = ssl.create_default_context(cafile=str(cluster.ca_file))
    context.load_cert_chain(str(cluster.front_proxy_client.cert),
                            str(cluster.front_proxy_client.key))
    return context


# --------------------------------------------------------------------------------------------
# Part 1: latency and throughput


async def _wait_for_file(path: Path) -> None:
    deadline = time.monotonic() + 60
    while not await asyncio.to_thread(path.exists):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear in 60 s")
        await asyncio.sleep(0.05)


async def _wait_ready(session: aiohttp.ClientSession, url: str, *, process: Any) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.returncode is not None:
            raise RuntimeError("the adapter exited before it was ready")
        try:
            async with session.get(url + "/readyz") as response:
                if response.status == 200:
                    return
        except (aiohttp.ClientError, OSError):
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError("the adapter did not become ready in 60 s")


def _direct_promql(pods: list[str]) -> str:
    """The PromQL the adapter sends for the request, built by the adapter's own code."""
    from adapter.rules.config import parse_config
    from adapter.rules.query import build_custom_query
    from adapter.rules.resources import GroupResource, ResourceMapper, builtin_catalog
    from metricscale.core.selectors import Selector

    rule = parse_config(PODS_CONFIG).rules[0]
    mapper = ResourceMapper.build(template=rule.resources.label_template,
                                  overrides=rule.resources.overrides, catalog=builtin_catalog())
    return build_custom_query(rule=rule, mapper=mapper, series="bench_requests",
                              resource=GroupResource("pods"), namespace=BENCH_NAMESPACE,
                              names=sorted(pods), metric_selector=Selector()).promql


async def _start_adapter(*, config: Path, prometheus_url: str, kubeconfig: Path, port: int,
                         cert_dir: Path, extra: tuple[str, ...] = (), cwd: Path = ROOT) -> Any:
    """`metricscale adapter` on the fake kube-apiserver, auth off (the resource part)."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "metricscale", "adapter", "--config", str(config),
        "--prometheus-url", prometheus_url, "--kubeconfig", str(kubeconfig),
        "--secure-port", str(port), "--bind-address", "127.0.0.1",
        "--cert-dir", str(cert_dir), "--insecure-disable-auth", "--log-level", "error", *extra,
        cwd=str(cwd), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)


async def _stop(process: Any) -> None:
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
        await process.wait()


def _client_session(clients: int, context: ssl.SSLContext | None) -> aiohttp.ClientSession:
    """The one client configuration every target is measured with (keep-alive, no env)."""
    connector = aiohttp.TCPConnector(ssl=context if context is not None else True,
                                     limit=clients)
    return aiohttp.ClientSession(connector=connector, trust_env=False)


def _create_bench_pods(cluster: ControlPlane, names: list[str]) -> None:
    """The pods the request names, as Pods of the control plane (Pending: nothing runs them;
    both servers select them by label)."""
    cluster.apply({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": BENCH_NAMESPACE}})

    def default_account() -> bool:
        try:
            cluster.get(f"/api/v1/namespaces/{BENCH_NAMESPACE}/serviceaccounts/default")
        except KubeError:
            return False
        return True

    wait_until(default_account, what="the bench namespace's default service account",
               timeout=120, children=cluster.children, interval=0.1)
    for name in names:
        cluster.apply({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": name, "namespace": BENCH_NAMESPACE,
                                    "labels": {"app": "bench"}},
                       "spec": {"automountServiceAccountToken": False,
                                "containers": [{"name": "app",
                                                "image": "registry.k8s.io/pause:3.10"}]}})


ADAPTER_PATH = ("/apis/custom.metrics.k8s.io/v1beta2/namespaces/bench/pods/%2A/bench_requests"
                "?labelSelector=app%3Dbench")
SECOND_BACKEND_PATH = ADAPTER_PATH.replace("/bench_requests?", "/bench_requests_second?")
# What the HPA controller sends, and what the aggregator adds.
ADAPTER_HEADERS = {"Accept": "application/vnd.kubernetes.protobuf, */*"}
AGGREGATED_HEADERS = {**ADAPTER_HEADERS, **CALLER}


@dataclass(frozen=True)
class _Target:
    session: aiohttp.ClientSession
    url: str
    path: str = ADAPTER_PATH
    headers: dict[str, str] = field(default_factory=lambda: dict(ADAPTER_HEADERS))

    async def get(self) -> None:
        async with self.session.get(URL(self.url + self.path, encoded=True),
                                    headers=self.headers) as response:
            body = await response.read()
            if response.status != 200:
                raise RuntimeError(f"{self.url} answered {response.status}: {body[:200]!r}")


async def _answer(target: _Target, *, pods: int) -> tuple[int, str]:
    """The measured answer's size and type; its items counted from the JSON answer."""
    async with target.session.get(URL(target.url + target.path, encoded=True),
                                  headers=target.headers) as response:
        body = await response.read()
        content_type = response.headers.get("Content-Type", "").split(";")[0]
        if response.status != 200:
            raise RuntimeError(f"{target.url} answered {response.status}: {body[:200]!r}")
    headers = {**target.headers, "Accept": "application/json"}
    async with target.session.get(URL(target.url + target.path, encoded=True),
                                  headers=headers) as response:
        items = len(json.loads(await response.read()).get("items") or [])
    if items != pods:
        raise RuntimeError(f"expected {pods} items, {target.url} sent {items}")
    return len(body), content_type


async def _until_answers(target: _Target, *, pods: int) -> None:
    """Until the target answers the request for every pod (pods seen, series scraped)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            await _answer(target, pods=pods)
            return
        except (RuntimeError, aiohttp.ClientError, OSError, ValueError):
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.2)


async def _wait_ok(session: aiohttp.ClientSession, url: str, *, process: Any) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.returncode is not None:
            raise RuntimeError(f"the server behind {url} exited")
        try:
            async with session.get(url) as response:
                if response.status == 200:
                    return
        except (aiohttp.ClientError, OSError):
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not answer in 60 s")


async def _alternate(calls: dict[str, Callable[[], Awaitable[None]]], *,
                     requests: int) -> dict[str, dict[str, float]]:
    """Warm up each call 50 times, then time them in turn, one request at a time, so that
    all of them see the same background noise."""
    for _ in range(50):
        for call in calls.values():
            await call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(requests):
        for name, call in calls.items():
            started = time.perf_counter()
            await call()
            times[name].append(time.perf_counter() - started)
    return {name: _latency(samples).__dict__ for name, samples in times.items()}


async def _shared_and_cached(session: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    async with session.get(url + "/metrics", headers=CALLER) as response:
        text = await response.text()

    def total(prefix: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(prefix + "{"))

    return (total("metricscale_prometheus_requests_shared_total"),
            total("metricscale_prometheus_cache_hits_total"))


def _process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _server_cpu(calls: dict[str, tuple[Callable[[], Awaitable[None]], int]], *,
                      requests: int, shared: dict[str, int],
                      blocks: int = 20) -> dict[str, dict[str, float]]:
    """Each server process's own CPU per request (ms): `requests` sequential requests to each,
    in `blocks` short blocks that alternate between the servers (a change of the machine's
    load falls on all of them alike), the CPU of all blocks added up (/proc counts in 10 ms
    ticks: a block alone is too short to read). The processes of `shared` (Prometheus,
    kube-apiserver) are read over each block too: what each server makes them spend (their
    background work included)."""
    spent: dict[str, dict[str, float]] = {
        name: {what: 0.0 for what in ("server", *shared)} for name in calls}
    per_block = max(1, requests // blocks)
    for _ in range(blocks):
        for name, (call, pid) in calls.items():
            pids = {"server": pid, **shared}
            before = {what: _process_cpu_seconds(each) for what, each in pids.items()}
            for _ in range(per_block):
                await call()
            for what, each in pids.items():
                spent[name][what] += _process_cpu_seconds(each) - before[what]
    total = per_block * blocks
    return {name: {what: seconds * 1000 / total for what, seconds in by_process.items()}
            for name, by_process in spent.items()}


def latency_part(cluster: ControlPlane, *, pods: int, requests: int, clients: int,
                 seconds: float, cache_ttl: str, workdir: Path, backends: int = 1,
                 peer: bool = True, variants: tuple[Variant, ...] = ()) -> dict[str, Any]:
    from testbed.fakes.exporter import Exporter
    from testbed.fakes.prometheus import PrometheusServer

    names = [f"pod-{index:03d}" for index in range(pods)]
    promql = _direct_promql(names)
    servers: list[AggregatedServer] = []
    with PrometheusServer(parent_dir=str(workdir)) as prometheus, \
            Exporter(job="bench") as exporter:
        for index, name in enumerate(names):
            exporter.set("bench_requests", {"namespace": BENCH_NAMESPACE, "pod": name},
                         index + 0.5)
        prometheus.add_target(exporter)
        _create_bench_pods(cluster, names)
        prometheus.wait_for("bench_requests", lambda s: len(s) == pods, timeout=60)
        try:
            ours = _start_ours(cluster, workdir=workdir / "ours", config_text=PODS_CONFIG,
                               prometheus_url=prometheus.url, namespace="bench-ours")
            servers.append(ours)
            others: dict[str, AggregatedServer] = {}
            if peer:
                others[PEER] = _start_peer(cluster, workdir=workdir / "peer",
                                           config_text=PODS_CONFIG,
                                           prometheus_url=prometheus.url)
            for variant in variants:
                others[variant.name] = _start_ours(
                    cluster, workdir=workdir / variant.namespace, config_text=PODS_CONFIG,
                    prometheus_url=prometheus.url, namespace=variant.namespace,
                    variant=variant)
            if backends == 2:
                others["two_backends"] = _start_ours(
                    cluster, workdir=workdir / "two", namespace="bench-two",
                    config_text=TWO_BACKENDS_CONFIG.format(url=prometheus.url),
                    prometheus_url=prometheus.url)
            servers += others.values()
            result = asyncio.run(_measure_latency(
                cluster, ours=ours, others=others, variants=tuple(v.name for v in variants),
                prometheus_url=prometheus.url,
                promql=promql, pods=pods, requests=requests, clients=clients, seconds=seconds,
                shared_pids={"prometheus": _pid_of_prometheus(prometheus.config_file),
                             "kube-apiserver": _apiserver_pid(cluster)}))
            for server in servers:
                server.stop()
            servers.clear()
            if cache_ttl not in ("", "0"):
                cached = _start_ours(cluster, workdir=workdir / "cached",
                                     namespace="bench-cached", config_text=PODS_CONFIG,
                                     prometheus_url=prometheus.url,
                                     extra=(f"--prometheus-cache-ttl={cache_ttl}",))
                servers.append(cached)
                result["cached"] = asyncio.run(_measure_cached(
                    cluster, cached, ttl=cache_ttl, pods=pods, requests=requests,
                    clients=clients, seconds=seconds))
        finally:
            for server in servers:
                server.stop()
    result.update(pods=pods, requests=requests, clients=clients)
    return result


async def _measure_latency(cluster: ControlPlane, *, ours: OurAdapter,
                           others: dict[str, AggregatedServer], variants: tuple[str, ...],
                           prometheus_url: str,
                           promql: str, pods: int, requests: int, clients: int,
                           seconds: float, shared_pids: dict[str, int]) -> dict[str, Any]:
    context = _client_context(cluster)
    floor: Any = None
    async with contextlib.AsyncExitStack() as stack:
        def session() -> aiohttp.ClientSession:
            opened = _client_session(clients, context)
            stack.push_async_callback(opened.close)
            return opened

        def target(server: AggregatedServer, path: str = ADAPTER_PATH) -> _Target:
            return _Target(session(), f"https://127.0.0.1:{server.port}", path,
                           dict(AGGREGATED_HEADERS))

        targets = {OURS: target(ours)}
        for name in variants:
            targets[name] = target(others[name])
        if PEER in others:
            targets[PEER] = target(others[PEER])
        extra: dict[str, Callable[[], Awaitable[None]]] = {}
        if "two_backends" in others:
            for name, path in (("two_backends_default", ADAPTER_PATH),
                               ("two_backends_second", SECOND_BACKEND_PATH)):
                extra[name] = target(others["two_backends"], path).get
                await _until_answers(target(others["two_backends"], path), pods=pods)
        answers = {}
        for name, chosen in targets.items():
            await _until_answers(chosen, pods=pods)
            answers[name] = await _answer(chosen, pods=pods)
        body_bytes = answers[OURS][0]
        floor_port = _free_port()
        floor = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--floor-child", str(floor_port), str(ours.cert),
            str(ours.key), prometheus_url, str(body_bytes), cwd=str(ROOT),
            stdin=asyncio.subprocess.PIPE)
        stack.push_async_callback(_stop, floor)
        assert floor.stdin is not None
        floor.stdin.write(promql.encode())
        floor.stdin.close()
        floor_url = f"https://127.0.0.1:{floor_port}"
        floor_session = session()
        await _wait_ok(floor_session, floor_url + "/fixed", process=floor)
        direct_session = _client_session(clients, None)
        stack.push_async_callback(direct_session.close)

        async def direct() -> None:
            form = {"query": promql, "time": f"{time.time():.3f}"}
            async with direct_session.post(f"{prometheus_url}/api/v1/query",
                                           data=form) as response:
                body = await response.read()
                if response.status != 200:
                    raise RuntimeError(f"Prometheus answered {response.status}: "
                                       f"{body[:200]!r}")

        def floor_call(path: str) -> Callable[[], Awaitable[None]]:
            async def call() -> None:
                async with floor_session.get(floor_url + path,
                                             headers=AGGREGATED_HEADERS) as response:
                    await response.read()
                    if response.status != 200:
                        raise RuntimeError(f"the floor server answered {response.status}")
            return call

        calls = {**{name: chosen.get for name, chosen in targets.items()}, "direct": direct,
                 "floor_forward": floor_call("/forward"), "floor_fixed": floor_call("/fixed")}
        load_before = _load_average()
        latency = await _alternate({**calls, **extra}, requests=requests)
        pids = {OURS: ours.pid, **{name: others[name].pid for name in variants},
                "floor_forward": floor.pid}
        if PEER in others:
            pids[PEER] = others[PEER].pid
        server_cpu = await _server_cpu({name: (calls[name], pid) for name, pid in pids.items()},
                                       requests=2 * requests, shared=shared_pids)
        rps: dict[str, list[float]] = {name: [] for name in (*targets, "direct",
                                                             "floor_forward")}
        for _ in range(3):
            for name in rps:
                rps[name].append(await _throughput(calls[name], clients=clients,
                                                   seconds=seconds))
        shared, _ = await _shared_and_cached(targets[OURS].session, targets[OURS].url)
        memory = {name: _memory_mb(pid) for name, pid in pids.items()}
        load_after = _load_average()
    return {"latency": latency, "rps": {name: statistics.median(v) for name, v in rps.items()},
            "rps_rounds": rps, "server_cpu": server_cpu, "memory": memory,
            "answers": {name: {"bytes": size, "content_type": kind}
                        for name, (size, kind) in answers.items()},
            "shared_queries": shared, "body_bytes": body_bytes, "variants": list(variants),
            "load": [load_before, load_after]}


async def _measure_cached(cluster: ControlPlane, server: OurAdapter, *, ttl: str, pods: int,
                          requests: int, clients: int, seconds: float) -> dict[str, Any]:
    """The same request to an adapter started with --prometheus-cache-ttl (a separate run:
    never mixed into the figures above)."""
    async with _client_session(clients, _client_context(cluster)) as session:
        target = _Target(session, f"https://127.0.0.1:{server.port}",
                         headers=dict(AGGREGATED_HEADERS))
        await _until_answers(target, pods=pods)
        latency = await _alternate({"adapter": target.get}, requests=requests)
        rps = await _throughput(target.get, clients=clients, seconds=seconds)
        _, hits = await _shared_and_cached(session, target.url)
    return {"ttl": ttl, "adapter": latency["adapter"], "rps": rps, "cache_hits": hits}


def floor_child(port: str, cert: str, key: str, prometheus_url: str, body_bytes: str) -> None:
    """Runs in its own process: the least any Python adapter must do, on the same stack.

    `/fixed` answers a fixed body of the adapter's answer size over HTTPS; `/forward` first
    sends the request's PromQL (read from stdin) to Prometheus with one keep-alive aiohttp
    session, reads the answer, and then sends the fixed body: no parsing, no rendering.
    """
    from aiohttp import web

    promql = sys.stdin.read()
    body = b"{" + b" " * (int(body_bytes) - 2) + b"}"
    session_key = web.AppKey("session", aiohttp.ClientSession)

    async def fixed(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, content_type="application/json")

    query = urllib.parse.urlencode({"query": promql}).encode()
    headers = {"Content-Type": "application/x-www-form-urlencoded"}

    async def forward(request: web.Request) -> web.StreamResponse:
        # The leanest way to send it with aiohttp: the form encoded once, a body of bytes, no
        # cookie jar (FormData and the default jar cost ~100 µs more a request).
        form = query + f"&time={time.time():.3f}".encode()
        async with request.app[session_key].post(f"{prometheus_url}/api/v1/query", data=form,
                                                 headers=headers) as response:
            await response.read()
        return web.Response(body=body, content_type="application/json")

    async def client(app: web.Application) -> AsyncIterator[None]:
        async with aiohttp.ClientSession(trust_env=False,
                                         cookie_jar=aiohttp.DummyCookieJar()) as session:
            app[session_key] = session
            yield

    app = web.Application()
    app.cleanup_ctx.append(client)
    app.router.add_get("/fixed", fixed)
    app.router.add_get("/forward", forward)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    web.run_app(app, host="127.0.0.1", port=int(port), ssl_context=context, access_log=None,
                print=None, handle_signals=True)


# --------------------------------------------------------------------------------------------
# Part 2: discovery over 10^6 series


# --------------------------------------------------------------------------------------------
# Part 2: discovery over 10^6 series


def _peak_rss_mb() -> float:
    """This process's own peak RSS in MB.

    Linux's `ru_maxrss` survives exec, so a child started by the bench would report at least
    the bench's own RSS at the fork; `VmHWM` is the peak of this process's memory alone.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def discovery_child(prometheus_url: str, config_path: str, max_age: str) -> None:
    """Runs in its own process: one discovery pass; prints JSON with time and peak RSS."""
    from prometheus_client import CollectorRegistry

    from adapter.prometheus.client import PrometheusClient
    from adapter.prometheus.relisting import relist_once
    from adapter.rules.config import parse_config
    from adapter.rules.resources import builtin_catalog
    from adapter.settings import PrometheusSettings
    from metricscale.core.durations import parse_go_duration

    config = parse_config(Path(config_path).read_text())
    baseline = _peak_rss_mb()

    class CountingLister:
        """The client, counting the label sets it streams (to show the pass read them all)."""

        def __init__(self, client: PrometheusClient) -> None:
            self.client = client
            self.count = 0

        async def series(self, matches: Any, **kwargs: Any) -> AsyncIterator[dict[str, str]]:
            async for labels in self.client.series(matches, **kwargs):
                self.count += 1
                yield labels

    async def one_pass() -> dict[str, Any]:
        settings = PrometheusSettings(url=prometheus_url, timeout=120)
        async with PrometheusClient(settings, registry=CollectorRegistry()) as client:
            counting = CountingLister(client)
            started = time.perf_counter()
            registry = await relist_once(datetime.now(UTC), config=config, lister=counting,
                                         catalog=builtin_catalog(),
                                         max_age=parse_go_duration(max_age))
            elapsed = time.perf_counter() - started
        return {"seconds": elapsed, "custom_metrics": registry.stats.custom_metrics,
                "series_shapes": registry.stats.series_shapes, "series_read": counting.count}

    result = asyncio.run(one_pass())
    result["peak_rss_mb"] = _peak_rss_mb()
    result["baseline_rss_mb"] = baseline
    print(json.dumps(result))



def _listed_names(server: AggregatedServer) -> int:
    """How many distinct metric names the server's custom metrics discovery lists."""
    try:
        reply = server.request(CUSTOM_V1BETA1, timeout=30)
    except OSError:
        return 0
    if reply.status != 200:
        return 0
    resources = reply.json().get("resources") or []
    return len({str(item.get("name", "")).partition("/")[2] for item in resources})


def _first_listing(server: _Timed, *, names: int, timeout: float = 600) -> dict[str, float]:
    """Seconds from the process's start until its discovery lists `names` metric names, and
    its memory then (the peak is the pass's)."""
    assert isinstance(server, AggregatedServer)
    child = server.child
    assert child is not None
    deadline = time.monotonic() + timeout
    while (found := _listed_names(server)) < names:
        child.check_running()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{server.name} listed {found} of {names} names in "
                               f"{timeout:.0f} s")
        time.sleep(0.1)
    seconds = time.monotonic() - server.spawned
    return {"seconds": seconds, **_memory_mb(server.pid), "names": float(found)}


def discovery_part(cluster: ControlPlane | None, *, metrics: int, series_per_metric: int,
                   workdir: Path, rounds: int, peer: bool,
                   variants: tuple[Variant, ...] = ()) -> dict[str, Any]:
    from testbed.fakes.prometheus import PrometheusServer, recent_timestamps, synthetic_families

    server = PrometheusServer(parent_dir=str(workdir))
    try:
        backfill = server.backfill(synthetic_families(
            metric_count=metrics, series_per_metric=series_per_metric,
            timestamps=recent_timestamps(2, span=60)))
        started = time.monotonic()
        server.start()
        start_seconds = time.monotonic() - started
        config = workdir / "default-rules.yaml"
        config.write_text(CONFIG_GEN_DEFAULTS_YAML)
        child = subprocess.run(
            [sys.executable, __file__, "--discovery-child", server.url, str(config), "10m"],
            capture_output=True, text=True, check=True, cwd=str(ROOT))
        result: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
        result.update(series=backfill.series, families=backfill.families,
                      backfill_seconds=backfill.write_seconds + backfill.load_seconds,
                      prometheus_start_seconds=start_seconds)
        if cluster is None:
            return result
        # Both with one pass in the run (relist 10m) over the last 20 minutes (the backfill's
        # samples are a few minutes old by now).
        starters: dict[str, Callable[[Path], _Timed]] = {
            OURS: lambda where: _start_ours(
                cluster, workdir=where, config_text=CONFIG_GEN_DEFAULTS_YAML,
                prometheus_url=server.url, namespace="bench-discovery", relist_interval="10m",
                extra=("--metrics-max-age=20m",), wait=False)}
        for variant in variants:
            starters[variant.name] = functools.partial(
                lambda where, chosen: _start_ours(
                    cluster, workdir=where, config_text=CONFIG_GEN_DEFAULTS_YAML,
                    prometheus_url=server.url, namespace="bench-discovery-" + chosen.namespace,
                    relist_interval="10m", extra=("--metrics-max-age=20m",), wait=False,
                    variant=chosen), chosen=variant)
        if peer:
            starters[PEER] = lambda where: _start_peer(
                cluster, workdir=where, config_text=CONFIG_GEN_DEFAULTS_YAML,
                prometheus_url=server.url, relist_interval="10m",
                extra=("--metrics-max-age=20m",), wait=False)
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in starters}
        for index in range(rounds):
            order = list(starters) if index % 2 == 0 else list(reversed(starters))
            for name in order:
                started_server = starters[name](workdir / f"discovery-{name}-{index}")
                try:
                    runs[name].append(_first_listing(started_server, names=metrics))
                finally:
                    assert isinstance(started_server, AggregatedServer)
                    started_server.stop()
        result["servers"] = {
            name: {key: statistics.median(run[key] for run in found)
                   for key in ("seconds", "rss_mb", "peak_rss_mb")} | {"runs": found}
            for name, found in runs.items()}
        return result
    finally:
        server.close()


# --------------------------------------------------------------------------------------------
# Part 3: resource metrics (metrics.k8s.io: kubectl top)


RESOURCE_CONFIG = """
rules: []
resourceRules:
  cpu:
    containerQuery: 'sum(bench_cpu{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
    nodeQuery: 'sum(bench_node_cpu{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
    resources:
      overrides:
        node: {resource: node}
        namespace: {resource: namespace}
        pod: {resource: pod}
    containerLabel: container
  memory:
    containerQuery: 'sum(bench_memory{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
    nodeQuery: 'sum(bench_node_memory{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
    resources:
      overrides:
        node: {resource: node}
        namespace: {resource: namespace}
        pod: {resource: pod}
    containerLabel: container
  window: 1m
"""
RESOURCE_NAMESPACE = "res"


def _resource_pods(*, pods: int, top_pods: int, top_namespaces: int) -> list[tuple[str, str]]:
    """(namespace, pod): `pods` in RESOURCE_NAMESPACE and the rest of `top_pods` spread over
    `top_namespaces` - 1 others (the all-namespaces list then holds `top_pods` in all)."""
    placed = [(RESOURCE_NAMESPACE, f"pod-{index:04d}") for index in range(pods)]
    others = max(1, top_namespaces - 1)
    placed += [(f"top-{index % others:03d}", f"pod-{index:05d}")
               for index in range(max(0, top_pods - pods))]
    return placed


def _direct_usage_promql(names: list[str]) -> tuple[str, str]:
    """The CPU and memory containerQuery the adapter sends, built by the adapter's own code."""
    from adapter.http.usage import usage_labels
    from adapter.rules.config import parse_config
    from adapter.rules.query import build_pod_usage_query

    rules = parse_config(RESOURCE_CONFIG).resource_rules
    assert rules is not None
    cpu, memory = (build_pod_usage_query(rule=rule, labels=usage_labels(rule),
                                         namespace=RESOURCE_NAMESPACE, pods=sorted(names))
                   for rule in (rules.cpu, rules.memory))
    return cpu, memory


async def _run_timed(*command: str) -> float:
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, stderr = await process.communicate()
    elapsed = time.perf_counter() - started
    if process.returncode != 0:
        raise RuntimeError(f"{command[0]} failed: {stderr.decode()[:500]}")
    return elapsed


async def resource_part(*, pods: int, top_pods: int, top_namespaces: int, requests: int,
                        top_runs: int, workdir: Path,
                        variants: tuple[Variant, ...] = ()) -> dict[str, Any]:
    import shutil
    from datetime import timedelta

    from metricscale import pki
    from testbed.fakes.kube_api import FakeKubeAPI
    from testbed.fakes.prometheus import (
        MetricFamily,
        PrometheusServer,
        SeriesSamples,
        recent_timestamps,
    )

    kubectl = shutil.which("kubectl")
    placed = _resource_pods(pods=pods, top_pods=top_pods, top_namespaces=top_namespaces)
    stamps = recent_timestamps(2, span=30)

    def family(name: str, value: Callable[[int], float]) -> MetricFamily:
        return MetricFamily(name=name, type="gauge", series=[
            SeriesSamples({"namespace": ns, "pod": pod, "container": "app", "node": "node-1"},
                          [(stamp, value(index)) for stamp in stamps])
            for index, (ns, pod) in enumerate(placed)])

    server = PrometheusServer(parent_dir=str(workdir))
    try:
        server.backfill([family("bench_cpu", lambda i: 0.001 * (i % 500 + 1)),
                         family("bench_memory", lambda i: float((i % 500 + 1) * 1024 * 1024))])
        server.start()
        cpu_promql, memory_promql = _direct_usage_promql(
            [pod for ns, pod in placed if ns == RESOURCE_NAMESPACE])
        async with FakeKubeAPI(workdir=workdir / "rkube",
                               availability_max_backoff=0.5) as kube:
            created = time.perf_counter()
            for ns, pod in placed:
                kube.create_pod(pod, namespace=ns, phase="Running")
            create_seconds = time.perf_counter() - created
            tls = workdir / "rtls"
            tls.mkdir()
            now = datetime.now(UTC) - timedelta(minutes=5)
            ca = pki.generate_ca(common_name="bench-ca", now=now, validity=timedelta(days=1))
            leaf = pki.issue_serving_certificate(
                ca, common_name="metricscale-adapter",
                dns_names=("localhost", "metricscale-adapter.metricscale.svc"),
                ip_addresses=("127.0.0.1",), now=now, validity=timedelta(days=1))
            ca_file = pki.write_certificate(tls / "ca.crt", ca.certificate)
            cert_file = pki.write_certificate(tls / "tls.crt", leaf.certificate)
            key_file = pki.write_private_key(tls / "tls.key", leaf.private_key)
            config = workdir / "resource.yaml"
            config.write_text(RESOURCE_CONFIG)
            kubeconfig = kube.write_kubeconfig(workdir / "rkubeconfig")
            port = _free_port()
            tls_flags = ("--tls-cert-file", str(cert_file), "--tls-private-key-file",
                         str(key_file))
            process = await _start_adapter(
                config=config, prometheus_url=server.url, kubeconfig=kubeconfig, port=port,
                cert_dir=workdir / "rcerts", extra=tls_flags)
            others: dict[str, tuple[Any, int]] = {}
            for variant in variants:
                other_port = _free_port()
                others[variant.name] = (await _start_adapter(
                    config=config, prometheus_url=server.url, kubeconfig=kubeconfig,
                    port=other_port, cert_dir=workdir / f"rcerts-{variant.namespace}",
                    extra=(*tls_flags, *variant.flags), cwd=variant.checkout), other_port)
            try:
                context = ssl.create_default_context(cafile=str(ca_file))
                async with _client_session(4, context) as adapter_session, \
                        _client_session(4, None) as direct_session:
                    base = f"https://127.0.0.1:{port}"
                    await _wait_ready(adapter_session, base, process=process)

                    for other, other_port in others.values():
                        await _wait_ready(adapter_session, f"https://127.0.0.1:{other_port}",
                                          process=other)

                    async def adapter_get(path: str, at: str = base) -> bytes:
                        """The answer's bytes, unparsed (parsing is the client's cost)."""
                        async with adapter_session.get(at + path) as response:
                            body = await response.read()
                            if response.status != 200:
                                raise RuntimeError(f"adapter answered {response.status}: "
                                                   f"{body[:200]!r}")
                        return body

                    async def until_items(path: str, expected: int, at: str = base) -> None:
                        deadline = time.monotonic() + 60
                        while (found := len(json.loads(await adapter_get(path, at))["items"])
                               ) != expected:
                            if time.monotonic() > deadline:
                                raise RuntimeError(f"{path}: {found} items, not {expected}")
                            await asyncio.sleep(0.2)

                    ns_path = f"/apis/metrics.k8s.io/v1beta1/namespaces/{RESOURCE_NAMESPACE}/pods"
                    all_path = "/apis/metrics.k8s.io/v1beta1/pods"
                    bases = {"adapter": base, **{name: f"https://127.0.0.1:{other_port}"
                                                 for name, (_, other_port) in others.items()}}
                    answers = set()
                    for at in bases.values():
                        await until_items(ns_path, pods, at)
                        await until_items(all_path, len(placed), at)
                        # the same bytes from every variant, but for the times of the answer
                        answers.add(re.sub(rb'"(creationTimestamp|timestamp)":"[^"]*"', b"",
                                           await adapter_get(ns_path, at)))

                    def list_call(at: str) -> Callable[[], Awaitable[None]]:
                        async def call() -> None:
                            await adapter_get(ns_path, at)
                        return call

                    async def query(promql: str) -> None:
                        form = {"query": promql, "time": f"{time.time():.3f}"}
                        async with direct_session.post(f"{server.url}/api/v1/query",
                                                       data=form) as response:
                            body = await response.read()
                            if response.status != 200:
                                raise RuntimeError(f"Prometheus answered {response.status}: "
                                                   f"{body[:200]!r}")

                    async def direct_both() -> None:
                        await asyncio.gather(query(cpu_promql), query(memory_promql))

                    calls = {name: list_call(at) for name, at in bases.items()}
                    latency = await _alternate({**calls, "direct": direct_both,
                                                "direct_cpu": lambda: query(cpu_promql),
                                                "direct_memory": lambda: query(memory_promql)},
                                               requests=requests)
                    pids = {"adapter": process.pid,
                            **{name: other.pid for name, (other, _) in others.items()}}
                    server_cpu = await _server_cpu(
                        {name: (calls[name], pid) for name, pid in pids.items()},
                        requests=requests, shared={}, blocks=10)
                    all_times: dict[str, list[float]] = {name: [] for name in bases}
                    for _ in range(top_runs):
                        for name, at in bases.items():
                            started = time.perf_counter()
                            await adapter_get(all_path, at)
                            all_times[name].append(time.perf_counter() - started)
                    top: dict[str, Any] = {name: _latency(times).__dict__
                                           for name, times in all_times.items()}
                    if kubectl is not None:
                        kube.create_apiservice(
                            group="metrics.k8s.io", version="v1beta1",
                            service_namespace="metricscale", service_name="metricscale-adapter",
                            ca_bundle=pki.certificate_pem(ca.certificate))
                        kube.set_service_endpoint("metricscale", "metricscale-adapter",
                                                  "127.0.0.1", port)
                        await kube.wait_for_apiservice("v1beta1.metrics.k8s.io")
                        cluster = kube.write_kubeconfig(workdir / "rcluster.kubeconfig")
                        command = (kubectl, "--kubeconfig", str(cluster), "top", "pods", "-A")
                        await _run_timed(*command)  # warm-up (kubectl's discovery cache)
                        runs = [await _run_timed(*command) for _ in range(top_runs)]
                        top["kubectl_seconds"] = runs
                        top["kubectl_median_seconds"] = statistics.median(runs)
            finally:
                await _stop(process)
                for other, _ in others.values():
                    await _stop(other)
        return {**latency, "top": top, "pods": pods, "top_pods": len(placed),
                "variants": list(others), "same_answers": len(answers) == 1,
                "server_cpu": {name: cpu["server"] for name, cpu in server_cpu.items()},
                "top_namespaces": len({ns for ns, _ in placed}), "requests": requests,
                "top_runs": top_runs, "create_pods_seconds": create_seconds}
    finally:
        server.close()



# --------------------------------------------------------------------------------------------
# Report


_KINDS = {"application/json": "JSON", "application/vnd.kubernetes.protobuf": "protobuf"}


def _ratio(value: float, against: float) -> str:
    return f"{value / against:.2f}x" if against else "-"


def _table(latency: dict[str, Any] | None, discovery: dict[str, Any] | None) -> list[str]:
    """One table, a column per target."""
    variants = [(name, name) for name in (latency or {}).get("variants", [])]
    columns = [(OURS, "metricscale"), *variants, (PEER, "prom-adapter"),
               ("direct", "PromQL direct"), ("floor_forward", "floor+PromQL"),
               ("floor_fixed", "floor fixed")]
    have = set()
    if latency is not None:
        have |= set(latency["latency"])
    if discovery is not None:
        have |= set(discovery.get("servers", {})) | {OURS}
        if latency is None:
            variants = [(name, name) for name in discovery.get("servers", {})
                        if name not in (OURS, PEER)]
            columns[1:1] = variants
    columns = [(key, title) for key, title in columns if key in have]
    rows: list[tuple[str, dict[str, str]]] = []
    if latency is not None:
        lat, rps, cpu = latency["latency"], latency["rps"], latency["server_cpu"]
        memory, answers = latency["memory"], latency["answers"]
        for label, key in (("p50 ms, one at a time", "p50_ms"), ("p99 ms", "p99_ms"),
                           ("mean ms", "mean_ms")):
            rows.append((label, {name: f"{figures[key]:.2f}" for name, figures in lat.items()}))
        rows.append((f"req/s, {latency['clients']} clients",
                     {name: f"{value:.0f}" for name, value in rps.items()}))
        for label, what in (("server CPU ms/request", "server"),
                            ("  Prometheus CPU ms/request", "prometheus"),
                            ("  kube-apiserver CPU ms/request", "kube-apiserver")):
            rows.append((label, {name: f"{value[what]:.2f}" for name, value in cpu.items()}))
        rows.append(("server RSS MB after the runs",
                     {name: f"{value['rss_mb']:.0f}" for name, value in memory.items()}))
        rows.append(("answer bytes (type)",
                     {name: f"{value['bytes']:,} " + _KINDS.get(value["content_type"], "?")
                      for name, value in answers.items()}))
    if discovery is not None:
        servers = discovery.get("servers", {})
        rows.append(("discovery: s to full listing",
                     {name: f"{value['seconds']:.1f}" for name, value in servers.items()}))
        rows.append(("discovery: peak RSS MB",
                     {name: f"{value['peak_rss_mb']:.0f}" for name, value in servers.items()}))
        rows.append(("discovery pass alone, s (MB)",
                     {OURS: f"{discovery['seconds']:.1f} ({discovery['peak_rss_mb']:.0f})"}))
    width = max(len(label) for label, _ in rows) + 2
    lines = [" " * width + "".join(f"{title:>16}" for _, title in columns)]
    for label, cells in rows:
        lines.append(f"{label:<{width}}" + "".join(f"{cells.get(key, '-'):>16}"
                                                   for key, _ in columns))
    return lines


def _report(latency: dict[str, Any] | None, discovery: dict[str, Any] | None,
            resources: dict[str, Any] | None = None) -> str:
    lines = []
    if latency is not None or discovery is not None:
        lines += _table(latency, discovery)
    if latency is not None:
        lat, rps, cpu = latency["latency"], latency["rps"], latency["server_cpu"]
        ours, direct, floor = lat[OURS], lat["direct"], lat["floor_forward"]
        lines += [
            f"pods/* request for {latency['pods']} pods, {latency['requests']} requests each, "
            "one at a time, in turn; each adapter asked as the aggregator asks (front-proxy "
            f"certificate, X-Remote-User/-Group); load {latency['load'][0]} -> "
            f"{latency['load'][1]}",
        ]
        if PEER in lat:
            peer = lat[PEER]
            lines += [
                f"  ours p50 / prometheus-adapter p50 = {_ratio(ours['p50_ms'], peer['p50_ms'])} "
                "(goal <= 1.2x); p99 "
                f"{_ratio(ours['p99_ms'], peer['p99_ms'])}",
                f"  ours req/s / prometheus-adapter req/s = {_ratio(rps[OURS], rps[PEER])} "
                "(goal >= 1x)",
                f"  server CPU per request: ours {cpu[OURS]['server']:.2f} ms, "
                f"prometheus-adapter {cpu[PEER]['server']:.2f} ms, the floor "
                f"{cpu['floor_forward']['server']:.2f} ms",
            ]
        lines += [
            f"  ours p50 / direct p50 = {_ratio(ours['p50_ms'], direct['p50_ms'])}; floor p50 / "
            f"direct p50 = {_ratio(floor['p50_ms'], direct['p50_ms'])}; ours p50 / floor p50 = "
            f"{_ratio(ours['p50_ms'], floor['p50_ms'])}",
            f"  {latency['shared_queries']:.0f} of our requests joined a query in flight "
            f"under {latency['clients']} clients",
        ]
        if "two_backends_default" in lat:
            lines.append(
                "  a second adapter with two backends (the same Prometheus behind both): p50 "
                f"rule on `default` {lat['two_backends_default']['p50_ms']:.2f} ms, on the "
                f"second {lat['two_backends_second']['p50_ms']:.2f} ms ("
                f"{_ratio(lat['two_backends_default']['p50_ms'], ours['p50_ms'])} and "
                f"{_ratio(lat['two_backends_second']['p50_ms'], ours['p50_ms'])} of ours)")
        cached = latency.get("cached")
        if cached is not None:
            lines += [
                f"SEPARATE RUN, not the figures above: adapter with --prometheus-cache-ttl="
                f"{cached['ttl']} (answers up to {cached['ttl']} old): p50 "
                f"{cached['adapter']['p50_ms']:.2f} ms, p99 {cached['adapter']['p99_ms']:.2f} "
                f"ms; {latency['clients']} clients: {cached['rps']:.0f} req/s "
                f"({cached['cache_hits']:.0f} cache hits)",
            ]
    if discovery is not None:
        lines += [
            f"discovery over {discovery['series']:,} series in {discovery['families']:,} "
            "metric names (prometheus-adapter's default rules; backfill took "
            f"{discovery['backfill_seconds']:.0f} s):",
        ]
        servers = discovery.get("servers", {})
        if OURS in servers and PEER in servers:
            ours_d, peer_d = servers[OURS], servers[PEER]
            lines += [
                "  from start to the first complete listing (median of "
                f"{len(ours_d['runs'])} alternating runs each): ours "
                f"{_ratio(ours_d['seconds'], peer_d['seconds'])} of prometheus-adapter's time "
                f"(goal <= 1x), {_ratio(ours_d['peak_rss_mb'], peer_d['peak_rss_mb'])} of its "
                "peak RSS (goal <= 1x)",
            ]
        if servers:
            lines.append("  runs (s, peak MB): " + "; ".join(
                f"{'ours' if name == OURS else name} " + ", ".join(
                    f"{run['seconds']:.1f}/{run['peak_rss_mb']:.0f}" for run in found["runs"])
                for name, found in servers.items()))
        lines += [
            f"  ours, one pass alone in a child process: {discovery['seconds']:.2f} s (goal "
            f"< 10 s), peak RSS {discovery['peak_rss_mb']:.0f} MB (goal < 300 MB; "
            f"{discovery['baseline_rss_mb']:.0f} MB before the pass); "
            f"{discovery['series_read']:,} series read, {discovery['custom_metrics']:,} "
            f"custom metrics from {discovery['series_shapes']:,} series shapes",
        ]
    if resources is not None:
        lines += _resource_report(resources)
    return "\n".join(lines)


def _resource_report(r: dict[str, Any]) -> list[str]:
    def usage_row(label: str, figures: dict[str, float]) -> str:
        return (f"  {label:<46}{figures['p50_ms']:>8.2f}{figures['p99_ms']:>8.2f}"
                f"{figures['mean_ms']:>8.2f}")

    slower = max(r["direct_cpu"]["p50_ms"], r["direct_memory"]["p50_ms"])
    slower99 = max(r["direct_cpu"]["p99_ms"], r["direct_memory"]["p99_ms"])
    top = r["top"]
    variants = r.get("variants", [])
    cpu = r.get("server_cpu", {})
    lines = [
        f"metrics.k8s.io pod list for {r['pods']:,} running pods in one namespace, "
        f"{r['requests']} requests each, one at a time, in turn (the fake kube-apiserver):",
        f"  {'':<46}{'p50 ms':>8}{'p99 ms':>8}{'mean ms':>8}{'CPU ms':>8}",
        usage_row("adapter (HTTPS, no cache)", r["adapter"]) + f"{cpu.get('adapter', 0):>8.1f}",
        *(usage_row(f"  variant {name}", r[name]) + f"{cpu.get(name, 0):>8.1f}"
          for name in variants),
        usage_row("CPU + memory containerQuery, in parallel", r["direct"]),
        usage_row("  CPU containerQuery alone", r["direct_cpu"]),
        usage_row("  memory containerQuery alone", r["direct_memory"]),
        f"  adapter / both direct in parallel: p50 "
        f"{r['adapter']['p50_ms'] / r['direct']['p50_ms']:.2f}x, p99 "
        f"{r['adapter']['p99_ms'] / r['direct']['p99_ms']:.2f}x (goal <= 1.3x)",
        f"  adapter / slower single query: p50 {r['adapter']['p50_ms'] / slower:.2f}x, "
        f"p99 {r['adapter']['p99_ms'] / slower99:.2f}x",
        f"all-namespaces pod list, {r['top_pods']:,} running pods in "
        f"{r['top_namespaces']} namespaces ({r['top_runs']} runs):",
        f"  adapter alone (GET /apis/metrics.k8s.io/v1beta1/pods): p50 "
        f"{top['adapter']['p50_ms']:.0f} ms, max {top['adapter']['p99_ms']:.0f} ms"
        + "".join(f"; variant {name} p50 {top[name]['p50_ms']:.0f} ms" for name in variants),
    ]
    if variants:
        lines.insert(-2, "  the variants' answers are the same bytes as ours (but for their "
                     f"times): {r['same_answers']}")
    if "kubectl_median_seconds" in top:
        lines.append(
            f"  `kubectl top pods -A` through the aggregator: median "
            f"{top['kubectl_median_seconds']:.2f} s (goal < 2 s; runs "
            + ", ".join(f"{t:.2f}" for t in top["kubectl_seconds"]) + " s)")
    else:
        lines.append("  kubectl not found: `kubectl top pods -A` not measured")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--metrics", type=int, default=1000)
    parser.add_argument("--series-per-metric", type=int, default=1000)
    parser.add_argument("--discovery-rounds", type=int, default=2,
                        help="runs of each server's first listing, alternating (default 2)")
    parser.add_argument("--cache-ttl", default="5s",
                        help="also measure, separately, an adapter with this "
                             "--prometheus-cache-ttl (0: skip)")
    parser.add_argument("--backends", type=int, choices=(1, 2), default=1,
                        help="2: also a second adapter with two backends, measured in turn")
    parser.add_argument("--skip-peer", action="store_true",
                        help="leave prometheus-adapter out")
    parser.add_argument("--variant", type=Variant.parse, action="append", default=[],
                        metavar='"NAME DIR [FLAG ...]"',
                        help="also ours from the source tree DIR with extra flags, in the same "
                             "turns (every part; repeatable): a lever alone")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--skip-discovery", action="store_true")
    parser.add_argument("--skip-resource", action="store_true")
    parser.add_argument("--resource-pods", type=int, default=1000)
    parser.add_argument("--resource-requests", type=int, default=200)
    parser.add_argument("--top-pods", type=int, default=10000)
    parser.add_argument("--top-namespaces", type=int, default=100)
    parser.add_argument("--top-runs", type=int, default=5)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--discovery-child", nargs=3, metavar=("URL", "CONFIG", "MAX_AGE"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--floor-child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.discovery_child:
        discovery_child(*args.discovery_child)
        return 0
    if args.floor_child:
        floor_child(*args.floor_child)
        return 0
    os.environ.setdefault("PYTHONHASHSEED", "0")
    latency = discovery = resources = None
    load_before = _load_average()
    with tempfile.TemporaryDirectory(prefix="metricscale-bench-") as directory:
        workdir = Path(directory)
        cluster: ControlPlane | None = None
        try:
            if not (args.skip_latency and args.skip_discovery):
                try:
                    cluster = ControlPlane(workdir=workdir / "cluster")
                except ControlPlaneMissing as error:
                    if not args.skip_latency:
                        raise SystemExit(f"the latency part needs the real control plane: "
                                         f"{error}") from None
                    print(f"{error}: discovery without the servers", file=sys.stderr)
                if cluster is not None:
                    cluster.start()
            peer = not args.skip_peer and find_peer("prometheus-adapter") is not None
            if not args.skip_peer and not peer:
                print("prometheus-adapter not found (make peers): measured without it",
                      file=sys.stderr)
            if not args.skip_latency:
                assert cluster is not None
                latency = latency_part(cluster, pods=args.pods, requests=args.requests,
                                       clients=args.clients, seconds=args.seconds,
                                       cache_ttl=args.cache_ttl, workdir=workdir,
                                       backends=args.backends, peer=peer,
                                       variants=tuple(args.variant))
            if not args.skip_discovery:
                discovery = discovery_part(cluster, metrics=args.metrics,
                                           series_per_metric=args.series_per_metric,
                                           workdir=workdir, rounds=args.discovery_rounds,
                                           peer=peer, variants=tuple(args.variant))
        finally:
            if cluster is not None:
                cluster.stop()
        if not args.skip_resource:
            resources = asyncio.run(resource_part(
                pods=args.resource_pods, top_pods=args.top_pods,
                top_namespaces=args.top_namespaces, requests=args.resource_requests,
                top_runs=args.top_runs, workdir=workdir, variants=tuple(args.variant)))
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, load average "
          f"{load_before} at the start, {_load_average()} at the end")
    print(_report(latency, discovery, resources))
    if args.json:
        Path(args.json).write_text(json.dumps({"latency": latency, "discovery": discovery,
                                               "resources": resources},
                                              indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
