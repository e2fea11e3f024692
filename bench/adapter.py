"""Benchmark of `metricscale adapter`: latency and throughput against direct PromQL, and discovery.

Run with `.venv/bin/python bench/adapter.py` (needs prometheus, promtool and kubectl; about
three minutes).

1. Latency: a real Prometheus scrapes one gauge for 100 pods; the fake kube-apiserver holds the
   100 pods; the adapter runs as its own process (`metricscale adapter`, auth disabled, HTTPS,
   no result cache). The same `pods/*` request goes to the adapter, and the PromQL the adapter
   sends for it goes straight to Prometheus (POST /api/v1/query), in turn, one at a time,
   after 50 warm-up requests each: p50/p99 of each. Every target is reached through an
   aiohttp session with the same settings (keep-alive, `limit` = clients, no proxy lookups).
   The floor, measured in the same turns: a minimal aiohttp HTTPS server (its own process, the
   adapter's certificate) that answers a fixed body of the adapter's answer size, with and
   without first sending the same PromQL to Prometheus: what any adapter built on aiohttp
   costs before it does any work of its own. The server processes' own CPU time per request
   (from /proc, adapter and that floor, in alternating blocks) says how much of the gap is the
   adapter's work rather than waiting. Then 32 concurrent clients hit the adapter,
   Prometheus and the floor for a few seconds each: requests per second.
   With `--backends 2` a second adapter process serves the same rule on `default` and on a
   second backend (a `backends:` entry for the same Prometheus), and both of its metrics are
   measured in the same turns: a rule on either backend should cost what one backend costs.
   With `--cache-ttl` (default 5s; 0 skips it) a second adapter process started with
   `--prometheus-cache-ttl` is measured the same way and reported apart, labelled: those
   answers can be up to the TTL old, so they are never the headline.
2. Discovery: a second Prometheus is backfilled with promtool with 10^6 series in 1,000 metric
   names; one discovery pass with the shipped default rules runs in a child process, which
   reports the pass's duration and its peak RSS (the whole process: interpreter included).
3. Resource metrics (`--skip-resource`): a third Prometheus is backfilled with promtool with
   two gauges (`bench_cpu`, `bench_memory`) for 10,000 running pods (`--top-pods`) in 100
   namespaces, 1,000 of them (`--resource-pods`) in one; the adapter runs with its own
   resourceRules reading those gauges and a serving certificate from metricscale.pki. The
   namespace's metrics.k8s.io pod list goes to the adapter, and the CPU and memory
   containerQuery it sends go straight to Prometheus, both at once, in turn after 50 warm-up
   requests: p50/p99 of each. Then the all-namespaces list: straight to the adapter, and as
   `kubectl top pods -A` through the fake kube-apiserver's aggregator (an APIService for
   v1beta1.metrics.k8s.io whose caBundle trusts the adapter's certificate): wall times.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import socket
import ssl
import statistics
import sys
import tempfile
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adapter.rules.defaults import CONFIG_GEN_DEFAULTS_YAML  # noqa: E402  (after the path set-up)

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
                              resource=GroupResource("pods"), namespace="bench",
                              names=sorted(pods), metric_selector=Selector()).promql


async def _start_adapter(*, config: Path, prometheus_url: str, kubeconfig: Path, port: int,
                         cert_dir: Path, extra: tuple[str, ...] = ()) -> Any:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "metricscale", "adapter", "--config", str(config),
        "--prometheus-url", prometheus_url, "--kubeconfig", str(kubeconfig),
        "--secure-port", str(port), "--bind-address", "127.0.0.1",
        "--cert-dir", str(cert_dir), "--insecure-disable-auth", "--log-level", "error", *extra,
        cwd=str(ROOT), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)


async def _stop(process: Any) -> None:
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
        await process.wait()


def _client_session(clients: int, context: ssl.SSLContext | None) -> aiohttp.ClientSession:
    """The one client configuration every target is measured with (keep-alive, no env)."""
    connector = aiohttp.TCPConnector(ssl=context if context is not None else True,
                                     limit=clients)
    return aiohttp.ClientSession(connector=connector, trust_env=False)


async def latency_part(*, pods: int, requests: int, clients: int, seconds: float,
                       cache_ttl: str, workdir: Path, backends: int = 1) -> dict[str, Any]:
    from tests.fakes import kube_objects
    from tests.fakes.exporter import Exporter
    from tests.fakes.kube_api import FakeKubeAPI
    from tests.fakes.prometheus import PrometheusServer

    names = [f"pod-{index:03d}" for index in range(pods)]
    promql = _direct_promql(names)
    with PrometheusServer() as prometheus, Exporter(job="bench") as exporter:
        for index, name in enumerate(names):
            exporter.set("bench_requests", {"namespace": "bench", "pod": name}, index + 0.5)
        prometheus.add_target(exporter)
        await prometheus.wait_for_async("bench_requests", lambda s: len(s) == pods, timeout=60)
        async with FakeKubeAPI(workdir=workdir / "kube") as kube:
            now = datetime.now(UTC)
            for name in names:
                kube.create("", "v1", "pods", kube_objects.pod(
                    name, namespace="bench", now=now, labels={"app": "bench"}))
            config = workdir / "pods.yaml"
            config.write_text(PODS_CONFIG)
            kubeconfig = kube.write_kubeconfig(workdir / "kubeconfig")
            cert_dir = workdir / "certs"
            port = _free_port()
            process = await _start_adapter(config=config, prometheus_url=prometheus.url,
                                           kubeconfig=kubeconfig, port=port, cert_dir=cert_dir)
            floor = two = None
            two_port = _free_port()
            if backends == 2:
                config_two = workdir / "two-backends.yaml"
                config_two.write_text(TWO_BACKENDS_CONFIG.format(url=prometheus.url))
                two = await _start_adapter(config=config_two, prometheus_url=prometheus.url,
                                           kubeconfig=kubeconfig, port=two_port,
                                           cert_dir=workdir / "certs-two")
            try:
                await _wait_for_file(cert_dir / "apiserver.crt")
                context = ssl.create_default_context(cafile=str(cert_dir / "apiserver.crt"))
                async with contextlib.AsyncExitStack() as stack, \
                        _client_session(clients, context) as adapter_session, \
                        _client_session(clients, None) as direct_session, \
                        _client_session(clients, context) as floor_session:
                    adapter = _Target(adapter_session, f"https://127.0.0.1:{port}")
                    await _wait_ready(adapter_session, adapter.url, process=process)
                    body_bytes = await _check_answer(adapter, pods=pods)
                    floor_port = _free_port()
                    floor = await asyncio.create_subprocess_exec(
                        sys.executable, __file__, "--floor-child", str(floor_port),
                        str(cert_dir / "apiserver.crt"), str(cert_dir / "apiserver.key"),
                        prometheus.url, str(body_bytes), cwd=str(ROOT),
                        stdin=asyncio.subprocess.PIPE)
                    assert floor.stdin is not None
                    floor.stdin.write(promql.encode())
                    floor.stdin.close()
                    floor_url = f"https://127.0.0.1:{floor_port}"
                    await _wait_ok(floor_session, floor_url + "/fixed", process=floor)
                    extra: dict[str, Callable[[], Awaitable[None]]] = {}
                    if two is not None:
                        cert_two = workdir / "certs-two" / "apiserver.crt"
                        await _wait_for_file(cert_two)
                        two_session = _client_session(clients, ssl.create_default_context(
                            cafile=str(cert_two)))
                        stack.push_async_callback(two_session.close)
                        two_url = f"https://127.0.0.1:{two_port}"
                        await _wait_ready(two_session, two_url, process=two)
                        for name, path in (("two_backends_default", ADAPTER_PATH),
                                           ("two_backends_second", SECOND_BACKEND_PATH)):
                            target = _Target(two_session, two_url, path)
                            await _check_answer(target, pods=pods)
                            extra[name] = target.get
                    result = await _measure(
                        adapter, direct_session, floor_session, floor_url=floor_url,
                        prometheus_url=prometheus.url, promql=promql, requests=requests,
                        clients=clients, seconds=seconds, extra=extra)
                    result["server_cpu"] = await _server_cpu(
                        adapter, process.pid, floor_session, floor_url, floor.pid,
                        requests=requests)
            finally:
                await _stop(process)
                if two is not None:
                    await _stop(two)
                if floor is not None:
                    await _stop(floor)
            result.update(pods=pods, requests=requests, clients=clients, body_bytes=body_bytes)
            if cache_ttl not in ("", "0"):
                result["cached"] = await _measure_cached(
                    config=config, prometheus_url=prometheus.url, kubeconfig=kubeconfig,
                    cert_dir=cert_dir, cache_ttl=cache_ttl, pods=pods, requests=requests,
                    clients=clients, seconds=seconds)
            return result


ADAPTER_PATH = ("/apis/custom.metrics.k8s.io/v1beta2/namespaces/bench/pods/%2A/bench_requests"
                "?labelSelector=app%3Dbench")
SECOND_BACKEND_PATH = ADAPTER_PATH.replace("/bench_requests?", "/bench_requests_second?")
# What the HPA controller sends.
ADAPTER_HEADERS = {"Accept": "application/vnd.kubernetes.protobuf, */*"}


@dataclass(frozen=True)
class _Target:
    session: aiohttp.ClientSession
    url: str
    path: str = ADAPTER_PATH

    async def get(self) -> None:
        async with self.session.get(URL(self.url + self.path, encoded=True),
                                    headers=ADAPTER_HEADERS) as response:
            body = await response.read()
            if response.status != 200:
                raise RuntimeError(f"adapter answered {response.status}: {body[:200]!r}")


async def _check_answer(adapter: _Target, *, pods: int) -> int:
    async with adapter.session.get(URL(adapter.url + adapter.path, encoded=True),
                                   headers=ADAPTER_HEADERS) as response:
        body = await response.read()
    answer = json.loads(body)
    if len(answer["items"]) != pods:
        raise RuntimeError(f"expected {pods} items, the adapter sent {len(answer['items'])}")
    return len(body)


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


async def _shared_and_cached(adapter: _Target) -> tuple[float, float]:
    async with adapter.session.get(adapter.url + "/metrics") as response:
        text = await response.text()

    def total(prefix: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(prefix + "{"))

    return (total("metricscale_prometheus_requests_shared_total"),
            total("metricscale_prometheus_cache_hits_total"))


async def _measure(adapter: _Target, direct_session: aiohttp.ClientSession,
                   floor_session: aiohttp.ClientSession, *, floor_url: str,
                   prometheus_url: str, promql: str, requests: int, clients: int,
                   seconds: float,
                   extra: dict[str, Callable[[], Awaitable[None]]] | None = None,
                   ) -> dict[str, Any]:
    async def direct() -> None:
        form = {"query": promql, "time": f"{time.time():.3f}"}
        async with direct_session.post(f"{prometheus_url}/api/v1/query", data=form) as response:
            body = await response.read()
            if response.status != 200:
                raise RuntimeError(f"Prometheus answered {response.status}: {body[:200]!r}")

    def floor(path: str) -> Callable[[], Awaitable[None]]:
        async def call() -> None:
            async with floor_session.get(floor_url + path, headers=ADAPTER_HEADERS) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"the floor server answered {response.status}")
        return call

    latency = await _alternate({"adapter": adapter.get, "direct": direct,
                                "floor_forward": floor("/forward"),
                                "floor_fixed": floor("/fixed"), **(extra or {})},
                               requests=requests)
    throughput = {name: await _throughput(call, clients=clients, seconds=seconds)
                  for name, call in (("adapter", adapter.get), ("direct", direct),
                                     ("floor_forward", floor("/forward")))}
    shared, _ = await _shared_and_cached(adapter)
    return {**latency, "rps": throughput, "shared_queries": shared}


def _process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _server_cpu(adapter: _Target, adapter_pid: int, floor_session: aiohttp.ClientSession,
                      floor_url: str, floor_pid: int, *, requests: int) -> dict[str, float]:
    """The server processes' own CPU per request (ms), adapter and floor (same PromQL, fixed
    body), in alternating blocks of `requests` sequential requests, three blocks each: what
    each server spends, without the client's and Prometheus' share of the wall time."""
    async def floor_forward() -> None:
        async with floor_session.get(floor_url + "/forward", headers=ADAPTER_HEADERS) as r:
            await r.read()

    spent: dict[str, list[float]] = {"adapter": [], "floor_forward": []}
    for _ in range(3):
        for name, call, pid in (("adapter", adapter.get, adapter_pid),
                                ("floor_forward", floor_forward, floor_pid)):
            before = _process_cpu_seconds(pid)
            for _ in range(requests):
                await call()
            spent[name].append((_process_cpu_seconds(pid) - before) * 1000 / requests)
    return {name: statistics.median(values) for name, values in spent.items()}


async def _measure_cached(*, config: Path, prometheus_url: str, kubeconfig: Path,
                          cert_dir: Path, cache_ttl: str, pods: int, requests: int,
                          clients: int, seconds: float) -> dict[str, Any]:
    """The same request to an adapter started with --prometheus-cache-ttl (a separate run:
    never mixed into the figures above)."""
    port = _free_port()
    process = await _start_adapter(config=config, prometheus_url=prometheus_url,
                                   kubeconfig=kubeconfig, port=port, cert_dir=cert_dir,
                                   extra=("--prometheus-cache-ttl", cache_ttl))
    try:
        context = ssl.create_default_context(cafile=str(cert_dir / "apiserver.crt"))
        async with _client_session(clients, context) as session:
            adapter = _Target(session, f"https://127.0.0.1:{port}")
            await _wait_ready(session, adapter.url, process=process)
            await _check_answer(adapter, pods=pods)
            latency = await _alternate({"adapter": adapter.get}, requests=requests)
            rps = await _throughput(adapter.get, clients=clients, seconds=seconds)
            _, hits = await _shared_and_cached(adapter)
    finally:
        await _stop(process)
    return {"ttl": cache_ttl, "adapter": latency["adapter"], "rps": rps, "cache_hits": hits}


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


def discovery_part(*, metrics: int, series_per_metric: int, workdir: Path) -> dict[str, Any]:
    import subprocess

    from tests.fakes.prometheus import PrometheusServer, recent_timestamps, synthetic_families

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
                        top_runs: int, workdir: Path) -> dict[str, Any]:
    import shutil
    from datetime import timedelta

    from metricscale import pki
    from tests.fakes.kube_api import FakeKubeAPI
    from tests.fakes.prometheus import (
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
            process = await _start_adapter(
                config=config, prometheus_url=server.url, kubeconfig=kubeconfig, port=port,
                cert_dir=workdir / "rcerts",
                extra=("--tls-cert-file", str(cert_file), "--tls-private-key-file",
                       str(key_file)))
            try:
                context = ssl.create_default_context(cafile=str(ca_file))
                async with _client_session(4, context) as adapter_session, \
                        _client_session(4, None) as direct_session:
                    base = f"https://127.0.0.1:{port}"
                    await _wait_ready(adapter_session, base, process=process)

                    async def adapter_get(path: str) -> bytes:
                        """The answer's bytes, unparsed (parsing is the client's cost)."""
                        async with adapter_session.get(base + path) as response:
                            body = await response.read()
                            if response.status != 200:
                                raise RuntimeError(f"adapter answered {response.status}: "
                                                   f"{body[:200]!r}")
                        return body

                    async def until_items(path: str, expected: int) -> None:
                        deadline = time.monotonic() + 60
                        while (found := len(json.loads(await adapter_get(path))["items"])
                               ) != expected:
                            if time.monotonic() > deadline:
                                raise RuntimeError(f"{path}: {found} items, not {expected}")
                            await asyncio.sleep(0.2)

                    ns_path = f"/apis/metrics.k8s.io/v1beta1/namespaces/{RESOURCE_NAMESPACE}/pods"
                    all_path = "/apis/metrics.k8s.io/v1beta1/pods"
                    await until_items(ns_path, pods)
                    await until_items(all_path, len(placed))

                    async def adapter_call() -> None:
                        await adapter_get(ns_path)

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

                    latency = await _alternate({"adapter": adapter_call, "direct": direct_both,
                                                "direct_cpu": lambda: query(cpu_promql),
                                                "direct_memory": lambda: query(memory_promql)},
                                               requests=requests)
                    all_times = []
                    for _ in range(top_runs):
                        started = time.perf_counter()
                        await adapter_get(all_path)
                        all_times.append(time.perf_counter() - started)
                    top: dict[str, Any] = {"adapter": _latency(all_times).__dict__}
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
        return {**latency, "top": top, "pods": pods, "top_pods": len(placed),
                "top_namespaces": len({ns for ns, _ in placed}), "requests": requests,
                "top_runs": top_runs, "create_pods_seconds": create_seconds}
    finally:
        server.close()


# --------------------------------------------------------------------------------------------
# Report


def _report(latency: dict[str, Any] | None, discovery: dict[str, Any] | None,
            resources: dict[str, Any] | None = None) -> str:
    lines = []
    if latency is not None:
        a, d = latency["adapter"], latency["direct"]

        def row(label: str, figures: dict[str, float]) -> str:
            return (f"  {label:<46}{figures['p50_ms']:>8.2f}{figures['p99_ms']:>8.2f}"
                    f"{figures['mean_ms']:>8.2f}")

        rps = latency["rps"]
        lines += [
            f"pods/* request for {latency['pods']} pods ({latency['body_bytes']:,} bytes), "
            f"{latency['requests']} requests each, one at a time, in turn:",
            f"  {'':<46}{'p50 ms':>8}{'p99 ms':>8}{'mean ms':>8}",
            row("adapter (HTTPS, no cache)", a),
            row("the same PromQL straight to Prometheus (POST)", d),
            f"  adapter p50 / direct p50 = {a['p50_ms'] / d['p50_ms']:.2f}x (goal <= 1.2x)",
            "  the floor for any adapter on aiohttp + HTTPS (same client, same certificate):",
            row("  HTTPS handler: the same PromQL, fixed body", latency["floor_forward"]),
            row("  HTTPS handler: fixed body only", latency["floor_fixed"]),
            f"  floor p50 / direct p50 = "
            f"{latency['floor_forward']['p50_ms'] / d['p50_ms']:.2f}x",
            f"  adapter p50 / floor p50 = "
            f"{a['p50_ms'] / latency['floor_forward']['p50_ms']:.2f}x (goal <= 1.15x)",
        ]
        cpu = latency.get("server_cpu")
        if cpu is not None:
            lines.append(
                f"  server CPU per request (median of 3 alternating blocks): adapter "
                f"{cpu['adapter']:.2f} ms, floor (same PromQL, fixed body) "
                f"{cpu['floor_forward']:.2f} ms, "
                f"{cpu['adapter'] - cpu['floor_forward']:+.2f} ms")
        if "two_backends_default" in latency:
            lines += [
                "  a second adapter with two backends (the same Prometheus behind both):",
                row("  rule on `default`", latency["two_backends_default"]),
                row("  rule on the second backend", latency["two_backends_second"]),
                f"  p50 / one-backend adapter p50: default "
                f"{latency['two_backends_default']['p50_ms'] / a['p50_ms']:.2f}x, second "
                f"{latency['two_backends_second']['p50_ms'] / a['p50_ms']:.2f}x",
            ]
        lines += [
            f"{latency['clients']} concurrent clients:",
            f"  adapter {rps['adapter']:.0f} req/s, direct {rps['direct']:.0f} req/s, floor "
            f"(same PromQL, fixed body) {rps['floor_forward']:.0f} req/s "
            f"({latency['shared_queries']:.0f} adapter requests joined a query in flight)",
        ]
        cached = latency.get("cached")
        if cached is not None:
            lines += [
                f"SEPARATE RUN, not the figures above: adapter with --prometheus-cache-ttl="
                f"{cached['ttl']} (answers up to {cached['ttl']} old):",
                row("adapter (HTTPS, result cache)", cached["adapter"]),
                f"  cached p50 / direct p50 above = "
                f"{cached['adapter']['p50_ms'] / d['p50_ms']:.2f}x; {latency['clients']} "
                f"clients: {cached['rps']:.0f} req/s ({cached['cache_hits']:.0f} cache hits)",
            ]
    if discovery is not None:
        lines += [
            f"discovery pass over {discovery['series']:,} series in {discovery['families']:,} "
            "metric names (the default rules):",
            f"  {discovery['seconds']:.2f} s (goal < 10 s), peak RSS "
            f"{discovery['peak_rss_mb']:.0f} MB (goal < 300 MB; {discovery['baseline_rss_mb']:.0f}"
            " MB before the pass)",
            f"  {discovery['series_read']:,} series read, {discovery['custom_metrics']:,} "
            "custom metrics from "
            f"{discovery['series_shapes']:,} series shapes; backfill took "
            f"{discovery['backfill_seconds']:.0f} s",
        ]
    if resources is not None:
        r = resources

        def usage_row(label: str, figures: dict[str, float]) -> str:
            return (f"  {label:<46}{figures['p50_ms']:>8.2f}{figures['p99_ms']:>8.2f}"
                    f"{figures['mean_ms']:>8.2f}")

        slower = max(r["direct_cpu"]["p50_ms"], r["direct_memory"]["p50_ms"])
        slower99 = max(r["direct_cpu"]["p99_ms"], r["direct_memory"]["p99_ms"])
        top = r["top"]
        lines += [
            f"metrics.k8s.io pod list for {r['pods']:,} running pods in one namespace, "
            f"{r['requests']} requests each, one at a time, in turn:",
            f"  {'':<46}{'p50 ms':>8}{'p99 ms':>8}{'mean ms':>8}",
            usage_row("adapter (HTTPS, no cache)", r["adapter"]),
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
            f"{top['adapter']['p50_ms']:.0f} ms, max {top['adapter']['p99_ms']:.0f} ms",
        ]
        if "kubectl_median_seconds" in top:
            lines.append(
                f"  `kubectl top pods -A` through the aggregator: median "
                f"{top['kubectl_median_seconds']:.2f} s (goal < 2 s; runs "
                + ", ".join(f"{t:.2f}" for t in top["kubectl_seconds"]) + " s)")
        else:
            lines.append("  kubectl not found: `kubectl top pods -A` not measured")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--metrics", type=int, default=1000)
    parser.add_argument("--series-per-metric", type=int, default=1000)
    parser.add_argument("--cache-ttl", default="5s",
                        help="also measure, separately, an adapter with this "
                             "--prometheus-cache-ttl (0: skip)")
    parser.add_argument("--backends", type=int, choices=(1, 2), default=1,
                        help="2: also a second adapter with two backends, measured in turn")
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
    with tempfile.TemporaryDirectory(prefix="metricscale-bench-") as directory:
        workdir = Path(directory)
        if not args.skip_latency:
            latency = asyncio.run(latency_part(pods=args.pods, requests=args.requests,
                                               clients=args.clients, seconds=args.seconds,
                                               cache_ttl=args.cache_ttl, workdir=workdir,
                                               backends=args.backends))
        if not args.skip_discovery:
            discovery = discovery_part(metrics=args.metrics,
                                       series_per_metric=args.series_per_metric,
                                       workdir=workdir)
        if not args.skip_resource:
            resources = asyncio.run(resource_part(
                pods=args.resource_pods, top_pods=args.top_pods,
                top_namespaces=args.top_namespaces, requests=args.resource_requests,
                top_runs=args.top_runs, workdir=workdir))
    print(_report(latency, discovery, resources))
    if args.json:
        Path(args.json).write_text(json.dumps({"latency": latency, "discovery": discovery,
                                               "resources": resources},
                                              indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
