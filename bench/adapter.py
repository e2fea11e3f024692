"""Benchmark of `metricscale adapter`: latency and throughput against direct PromQL, and discovery.

Run with `.venv/bin/python bench/adapter.py` (needs prometheus and promtool; about a minute).

1. Latency: a real Prometheus scrapes one gauge for 100 pods; the fake kube-apiserver holds the
   100 pods; the adapter runs as its own process (`metricscale adapter`, auth disabled, HTTPS).
   The same `pods/*` request goes to the adapter, and the PromQL the adapter sends for it goes
   straight to Prometheus (POST /api/v1/query), alternately, one at a time: p50/p99 of each.
   Then 32 concurrent clients hit each for a few seconds: requests per second.
2. Discovery: a second Prometheus is backfilled with promtool with 10^6 series in 1,000 metric
   names; one discovery pass with the shipped default rules runs in a child process, which
   reports the pass's duration and its peak RSS (the whole process: interpreter included).
"""

from __future__ import annotations

import argparse
import asyncio
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
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PODS_CONFIG = """
rules:
- seriesQuery: 'bench_requests'
  resources:
    overrides:
      namespace: {resource: namespace}
      pod: {resource: pod}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
"""

# prometheus-adapter's `config-gen` defaults (what most installations run).
DEFAULT_RULES = """
rules:
- seriesQuery: '{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}'
  seriesFilters: []
  resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}}}
  name: {matches: ^container_(.*)_seconds_total$, as: ''}
  metricsQuery: sum(rate(<<.Series>>{<<.LabelMatchers>>,container!="POD"}[5m])) by (<<.GroupBy>>)
- seriesQuery: '{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}'
  seriesFilters: [{isNot: ^container_.*_seconds_total$}]
  resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}}}
  name: {matches: ^container_(.*)_total$, as: ''}
  metricsQuery: sum(rate(<<.Series>>{<<.LabelMatchers>>,container!="POD"}[5m])) by (<<.GroupBy>>)
- seriesQuery: '{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}'
  seriesFilters: [{isNot: ^container_.*_total$}]
  resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}}}
  name: {matches: ^container_(.*)$, as: ''}
  metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>,container!="POD"}) by (<<.GroupBy>>)
- seriesQuery: '{namespace!="",__name__!~"^container_.*"}'
  seriesFilters: [{isNot: .*_total$}]
  resources: {template: <<.Resource>>}
  name: {matches: '', as: ''}
  metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)
- seriesQuery: '{namespace!="",__name__!~"^container_.*"}'
  seriesFilters: [{isNot: .*_seconds_total}]
  resources: {template: <<.Resource>>}
  name: {matches: ^(.*)_total$, as: ''}
  metricsQuery: sum(rate(<<.Series>>{<<.LabelMatchers>>}[5m])) by (<<.GroupBy>>)
- seriesQuery: '{namespace!="",__name__!~"^container_.*"}'
  seriesFilters: []
  resources: {template: <<.Resource>>}
  name: {matches: ^(.*)_seconds_total$, as: ''}
  metricsQuery: sum(rate(<<.Series>>{<<.LabelMatchers>>}[5m])) by (<<.GroupBy>>)
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


async def _wait_ready(session: aiohttp.ClientSession, url: str, process: Any) -> None:
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
    from adapter.config import parse_config
    from adapter.query import build_custom_query
    from adapter.resources import GroupResource, ResourceMapper, builtin_catalog
    from metricscale.selectors import Selector

    rule = parse_config(PODS_CONFIG).rules[0]
    mapper = ResourceMapper.build(template=rule.resources.label_template,
                                  overrides=rule.resources.overrides, catalog=builtin_catalog())
    return build_custom_query(rule=rule, mapper=mapper, series="bench_requests",
                              resource=GroupResource("pods"), namespace="bench",
                              names=sorted(pods), metric_selector=Selector()).promql


async def latency_part(*, pods: int, requests: int, clients: int, seconds: float,
                       workdir: Path) -> dict[str, Any]:
    from tests.fakes import kube_objects
    from tests.fakes.exporter import Exporter
    from tests.fakes.kube_api import FakeKubeAPI
    from tests.fakes.prometheus import PrometheusServer

    names = [f"pod-{index:03d}" for index in range(pods)]
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
            port = _free_port()
            cert_dir = workdir / "certs"
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "metricscale", "adapter", "--config", str(config),
                "--prometheus-url", prometheus.url,
                "--kubeconfig", str(kube.write_kubeconfig(workdir / "kubeconfig")),
                "--secure-port", str(port), "--bind-address", "127.0.0.1",
                "--cert-dir", str(cert_dir), "--insecure-disable-auth", "--log-level", "error",
                cwd=str(ROOT), stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL)
            try:
                await _wait_for_file(cert_dir / "apiserver.crt")
                context = ssl.create_default_context(cafile=str(cert_dir / "apiserver.crt"))
                connector = aiohttp.TCPConnector(ssl=context, limit=clients)
                async with aiohttp.ClientSession(connector=connector) as adapter_session, \
                        aiohttp.ClientSession(
                            connector=aiohttp.TCPConnector(limit=clients)) as direct_session:
                    adapter_url = f"https://127.0.0.1:{port}"
                    await _wait_ready(adapter_session, adapter_url, process)
                    return await _measure(
                        adapter_session, direct_session, adapter_url=adapter_url,
                        prometheus_url=prometheus.url, promql=_direct_promql(names),
                        pods=pods, requests=requests, clients=clients, seconds=seconds)
            finally:
                if process.returncode is None:
                    process.send_signal(signal.SIGTERM)
                    await process.wait()


async def _measure(adapter_session: aiohttp.ClientSession,
                   direct_session: aiohttp.ClientSession, *, adapter_url: str,
                   prometheus_url: str, promql: str, pods: int, requests: int, clients: int,
                   seconds: float) -> dict[str, Any]:
    path = ("/apis/custom.metrics.k8s.io/v1beta2/namespaces/bench/pods/%2A/bench_requests"
            "?labelSelector=app%3Dbench")
    target = URL(adapter_url + path, encoded=True)
    headers = {"Accept": "application/vnd.kubernetes.protobuf, */*"}

    async def via_adapter() -> None:
        async with adapter_session.get(target, headers=headers) as response:
            body = await response.read()
            if response.status != 200:
                raise RuntimeError(f"adapter answered {response.status}: {body[:200]!r}")

    async def direct() -> None:
        form = {"query": promql, "time": f"{time.time():.3f}"}
        async with direct_session.post(f"{prometheus_url}/api/v1/query", data=form) as response:
            body = await response.read()
            if response.status != 200:
                raise RuntimeError(f"Prometheus answered {response.status}: {body[:200]!r}")

    async with adapter_session.get(target, headers=headers) as response:
        answer = await response.json()
    if len(answer["items"]) != pods:
        raise RuntimeError(f"expected {pods} items, the adapter sent {len(answer['items'])}")
    for _ in range(50):  # warm up both paths (connections, caches)
        await via_adapter()
        await direct()
    adapter_times: list[float] = []
    direct_times: list[float] = []
    for _ in range(requests):  # alternate, so both see the same background noise
        started = time.perf_counter()
        await via_adapter()
        adapter_times.append(time.perf_counter() - started)
        started = time.perf_counter()
        await direct()
        direct_times.append(time.perf_counter() - started)
    adapter_rps = await _throughput(via_adapter, clients=clients, seconds=seconds)
    direct_rps = await _throughput(direct, clients=clients, seconds=seconds)
    async with adapter_session.get(adapter_url + "/metrics") as response:
        metrics_text = await response.text()
    shared = sum(float(line.rsplit(" ", 1)[1]) for line in metrics_text.splitlines()
                 if line.startswith("metricscale_prometheus_requests_shared_total{"))
    return {"pods": pods, "requests": requests, "clients": clients,
            "adapter": _latency(adapter_times).__dict__, "direct": _latency(direct_times).__dict__,
            "adapter_rps": adapter_rps, "direct_rps": direct_rps, "shared_queries": shared}


# --------------------------------------------------------------------------------------------
# Part 2: discovery over 10^6 series


def discovery_child(prometheus_url: str, config_path: str, max_age: str) -> None:
    """Runs in its own process: one discovery pass; prints JSON with time and peak RSS."""
    from prometheus_client import CollectorRegistry

    from adapter.config import parse_config
    from adapter.discovery import relist_once
    from adapter.prometheus import PrometheusClient, PrometheusSettings
    from adapter.resources import builtin_catalog
    from adapter.settings import parse_duration

    config = parse_config(Path(config_path).read_text())
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

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
                                         max_age=parse_duration(max_age))
            elapsed = time.perf_counter() - started
        return {"seconds": elapsed, "custom_metrics": registry.stats.custom_metrics,
                "series_shapes": registry.stats.series_shapes, "series_read": counting.count}

    result = asyncio.run(one_pass())
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["baseline_rss_mb"] = baseline / 1024
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
        config.write_text(DEFAULT_RULES)
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
# Report


def _report(latency: dict[str, Any] | None, discovery: dict[str, Any] | None) -> str:
    lines = []
    if latency is not None:
        a, d = latency["adapter"], latency["direct"]
        ratio = a["p50_ms"] / d["p50_ms"]
        lines += [
            f"pods/* request for {latency['pods']} pods, {latency['requests']} requests each, "
            "one at a time:",
            f"  {'':<26}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}",
            f"  {'adapter (HTTPS)':<26}{a['p50_ms']:>10.2f}{a['p99_ms']:>10.2f}"
            f"{a['mean_ms']:>10.2f}",
            f"  {'PromQL straight to Prom.':<26}{d['p50_ms']:>10.2f}{d['p99_ms']:>10.2f}"
            f"{d['mean_ms']:>10.2f}",
            f"  adapter p50 / direct p50 = {ratio:.2f}x (goal <= 1.2x)",
            f"{latency['clients']} concurrent clients:",
            f"  adapter {latency['adapter_rps']:.0f} req/s, direct {latency['direct_rps']:.0f} "
            f"req/s ({latency['shared_queries']:.0f} adapter requests joined a query in flight)",
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
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--metrics", type=int, default=1000)
    parser.add_argument("--series-per-metric", type=int, default=1000)
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--skip-discovery", action="store_true")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--discovery-child", nargs=3, metavar=("URL", "CONFIG", "MAX_AGE"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.discovery_child:
        discovery_child(*args.discovery_child)
        return 0
    os.environ.setdefault("PYTHONHASHSEED", "0")
    latency = discovery = None
    with tempfile.TemporaryDirectory(prefix="metricscale-bench-") as directory:
        workdir = Path(directory)
        if not args.skip_latency:
            latency = asyncio.run(latency_part(pods=args.pods, requests=args.requests,
                                               clients=args.clients, seconds=args.seconds,
                                               workdir=workdir))
        if not args.skip_discovery:
            discovery = discovery_part(metrics=args.metrics,
                                       series_per_metric=args.series_per_metric,
                                       workdir=workdir)
    print(_report(latency, discovery))
    if args.json:
        Path(args.json).write_text(json.dumps({"latency": latency, "discovery": discovery},
                                              indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
