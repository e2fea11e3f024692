"""Benchmark: the autoscaler controller over 10,000 autoscalers of 10 pods each.

Run: `.venv/bin/python bench/controller.py [--autoscalers N] [--mode full|stub|both]`.

* `full`: the controller (this process, pinned to one core) against the fake Kubernetes API
  server in a second process (pinned to the other core when there is one). The fake serves the
  Autoscalers, Deployments and pods, and proxies custom.metrics.k8s.io through its aggregator to
  an HTTPS endpoint in its own process that answers every pod's metric. Reported: the first
  pass (every autoscaler reconciled once right after the caches filled, each writing its first
  status), a steady pass (everything reconciled again, nothing to write), reconciles per second,
  Kubernetes API requests per reconcile, CPU seconds of each process, and the controller's RSS.
* `stub`: the same Reconciler, Controller and caches with in-memory doubles of the Kubernetes and
  metrics APIs (no HTTP): what the controller itself costs per reconcile on one core, the
  measure behind upstream's anchor of 5,000 HPAs in about 7.5 s with 5 workers against a
  stubbed API.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import ssl
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the fakes and doubles live under tests/

NS_COUNT = 100
METRIC = "http_requests"


def _pin(core: int) -> None:
    """Run this process on one core (when the machine has it)."""
    cores = list(range(os.cpu_count() or 1))
    if core < len(cores):
        os.sched_setaffinity(0, {cores[core]})


def _rss_mib() -> float:
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _trimmed_rss_mib() -> float:
    """RSS after glibc hands freed heap back (the one-page LIST of every pod is transient)."""
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return _rss_mib()


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _until(check: Callable[[], bool]) -> None:
    """Poll until `check` holds (the benchmark waits on counters other tasks advance)."""
    while True:
        if check():
            return
        await asyncio.sleep(0.01)


def _autoscaler(index: int) -> dict[str, Any]:
    namespace = f"ns-{index % NS_COUNT}"
    return {"apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
            "metadata": {"name": f"app-{index}", "namespace": namespace},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": f"app-{index}"},
                     "minReplicas": 1, "maxReplicas": 100,
                     "metrics": [{"type": "Pods", "pods": {
                         "metric": {"name": METRIC},
                         "target": {"type": "AverageValue", "averageValue": "10"}}}]}}


# --------------------------------------------------------------------------------------------
# The fake API server's process


async def _serve_fake(args: argparse.Namespace) -> None:
    """Seed the fake, serve the metrics endpoint behind its aggregator, print how to reach it,
    and run until standard input closes."""
    from aiohttp import web

    from metricscale import pki
    from testbed.fakes import kube_objects
    from testbed.fakes.kube_api import FakeKubeAPI

    _pin(1)
    workdir = Path(tempfile.mkdtemp(prefix="metricscale-bench-"))
    now = datetime.now(UTC)
    async with FakeKubeAPI(workdir=workdir, availability_max_backoff=0.5) as fake:
        import yaml

        crd = yaml.safe_load((REPO / "manifests" / "autoscaler" / "crd.yaml").read_text())
        fake.create("apiextensions.k8s.io", "v1", "customresourcedefinitions", crd)
        pods_by_namespace: dict[str, dict[str, str]] = {}
        for index in range(args.autoscalers):
            namespace, name = f"ns-{index % NS_COUNT}", f"app-{index}"
            fake.store.create("apps", "v1", "deployments", kube_objects.deployment(
                name, namespace=namespace, replicas=args.pods, now=now, labels={"app": name}))
            for replica in range(args.pods):
                pod = f"{name}-{replica}"
                fake.store.create("", "v1", "pods", kube_objects.pod(
                    pod, namespace=namespace, now=now, labels={"app": name}))
                pods_by_namespace.setdefault(namespace, {})[pod] = name
            fake.store.create("metricscale.dev", "v1alpha1", "autoscalers", _autoscaler(index))
        fake.compact()

        async def metric(request: web.Request) -> web.Response:
            namespace = request.match_info["namespace"]
            app = request.query.get("labelSelector", "").removeprefix("app=")
            stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            items = [{"describedObject": {"kind": "Pod", "namespace": namespace,
                                          "name": f"{app}-{i}", "apiVersion": "/v1"},
                      "metric": {"name": METRIC}, "timestamp": stamp, "windowSeconds": 60,
                      "value": "10"} for i in range(args.pods)]
            return web.json_response({"kind": "MetricValueList",
                                      "apiVersion": "custom.metrics.k8s.io/v1beta2",
                                      "metadata": {}, "items": items})

        async def discovery(request: web.Request) -> web.Response:
            return web.json_response({"kind": "APIResourceList", "apiVersion": "v1",
                                      "groupVersion": "custom.metrics.k8s.io/v1beta2",
                                      "resources": [{"name": f"pods/{METRIC}",
                                                     "singularName": "", "namespaced": True,
                                                     "kind": "MetricValueList",
                                                     "verbs": ["get"]}]})

        ca = pki.generate_ca(common_name="bench-metrics-ca", now=now - timedelta(minutes=5),
                             validity=timedelta(days=1))
        leaf = pki.issue_serving_certificate(ca, common_name="metrics",
                                             dns_names=("metrics.bench.svc",),
                                             ip_addresses=("127.0.0.1",),
                                             now=now - timedelta(minutes=5),
                                             validity=timedelta(days=1))
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(pki.write_certificate(workdir / "m.crt", leaf.certificate)),
                                str(pki.write_private_key(workdir / "m.key", leaf.private_key)))
        app = web.Application()
        app.router.add_get("/apis/custom.metrics.k8s.io/v1beta2", discovery)
        app.router.add_get("/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/pods/"
                           "{name}/{metric}", metric)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
        fake.create_apiservice(group="custom.metrics.k8s.io", version="v1beta2",
                               service_namespace="bench", service_name="metrics",
                               ca_bundle=ca.certificate_pem)
        fake.set_service_endpoint("bench", "metrics", "127.0.0.1",
                                  int(runner.addresses[0][1]))
        await fake.wait_for_apiservice("v1beta2.custom.metrics.k8s.io", within=30)

        async def forget_requests() -> None:
            # The fake records every request for tests; a benchmark's millions would only
            # slow it down (and cost memory).
            while True:
                fake.requests.clear()
                await asyncio.sleep(0.5)

        cleaner = asyncio.create_task(forget_requests())
        print(json.dumps({"url": fake.url, "token": fake.admin_token,
                          "ca": str(fake.ca_file)}), flush=True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.read)
        cleaner.cancel()
        await runner.cleanup()


# --------------------------------------------------------------------------------------------
# Full: the controller against the fake, over HTTP


class GcTimer:
    """Time spent in the garbage collector (gc.callbacks), and full collections counted."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full_collections = 0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._started
        if info.get("generation") == 2:
            self.full_collections += 1

    def __enter__(self) -> GcTimer:
        import gc
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        import gc
        gc.callbacks.remove(self)


@dataclass
class PassResult:
    reconciles: int
    seconds: float
    cpu_seconds: float
    requests: int
    fake_cpu_seconds: float
    gc_seconds: float = 0.0
    full_collections: int = 0

    @property
    def per_second(self) -> float:
        return self.reconciles / self.seconds if self.seconds else 0.0

    @property
    def per_cpu_second(self) -> float:
        return self.reconciles / self.cpu_seconds if self.cpu_seconds else 0.0


async def _run_full(args: argparse.Namespace) -> dict[str, Any]:
    from autoscaler.controller.leader import LeaderElectionConfig
    from autoscaler.decision.settings import Settings
    from autoscaler.server import Options, serve_autoscaler
    from metricscale.kube.config import Configuration

    _pin(0)
    started = time.monotonic()
    fake = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--serve-fake", "--autoscalers", str(args.autoscalers),
        "--pods", str(args.pods), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE)
    assert fake.stdout is not None and fake.stdin is not None
    line = await fake.stdout.readline()
    if not line:
        raise SystemExit("the fake API server did not start")
    where = json.loads(line)
    seeded = time.monotonic() - started
    configuration = Configuration(host=where["url"])
    configuration.ssl_ca_cert = where["ca"]
    configuration.api_key = {"BearerToken": where["token"]}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    options = Options(
        settings=Settings(sync_period=timedelta(hours=1)),
        leader_election=LeaderElectionConfig(enabled=False), concurrent_syncs=args.workers,
        identity="bench", reporting_instance="bench", metrics_bind_address="0",
        # Pages of 500 (the informers' default, as a real controller lists); a generous read
        # timeout for the fake's first LIST of 100,000 pods on a busy machine.
        informer_options={"list_read_timeout": 600.0})
    try:
        async with serve_autoscaler(configuration, options) as server:
            controller, kube = server.controller, server.kube
            synced_at = time.monotonic()
            watching = server.watching
            await _until(lambda: watching.synced
                         and len(watching.keys()) >= args.autoscalers)
            cache_seconds = time.monotonic() - synced_at
            results = []
            profile = None
            for number in range(args.passes):
                if number:
                    controller.enqueue_all(server.watching.keys())
                if args.profile and number == args.passes - 1:
                    import cProfile
                    profile = cProfile.Profile()
                    profile.enable()
                # The first pass began when the caches filled (every autoscaler was queued as
                # it arrived): count it from zero, not from whatever ran before this line.
                before = (controller.reconciled if number else 0, time.monotonic(),
                          time.process_time(), kube.request_count if number else 0,
                          _cpu_seconds(fake.pid))
                target = before[0] + args.autoscalers
                with GcTimer() as gc_timer:
                    await _until(lambda target=target: controller.reconciled >= target)  # type: ignore[misc]
                results.append(PassResult(
                    reconciles=controller.reconciled - before[0],
                    seconds=time.monotonic() - before[1],
                    cpu_seconds=time.process_time() - before[2],
                    requests=kube.request_count - before[3],
                    fake_cpu_seconds=_cpu_seconds(fake.pid) - before[4],
                    gc_seconds=gc_timer.seconds, full_collections=gc_timer.full_collections))
            if profile is not None:
                import pstats
                profile.disable()
                if args.profile_out:
                    profile.dump_stats(args.profile_out)
                pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(40)
            rss = _rss_mib()
            trimmed = _trimmed_rss_mib()
            floor = await _bare_gets(kube, workers=args.workers)
    finally:
        fake.stdin.close()
        with contextlib.suppress(ProcessLookupError):
            await asyncio.wait_for(fake.wait(), 30)
    return {"mode": "full", "autoscalers": args.autoscalers, "pods": args.autoscalers * args.pods,
            "workers": args.workers, "seed_seconds": round(seeded, 1),
            "cache_fill_seconds": round(cache_seconds, 1),
            "passes": [_pass_report(r) for r in results],
            "controller_rss_mib": round(rss, 0),
            "controller_rss_after_trim_mib": round(trimmed, 0),
            "controller_peak_rss_mib": round(_peak_rss_mib(), 0),
            "floor": floor}


async def _bare_gets(kube: Any, *, workers: int, count: int = 5_000) -> dict[str, Any]:
    """The floor under a reconcile: the same two GETs a steady reconcile makes (the scale, and
    the metrics through the aggregator), bare, through the same client, `workers` at a time."""
    paths = {"scale": ("/apis/apps/v1/namespaces/ns-0/deployments/app-0/scale", ()),
             "metrics": (f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/ns-0/pods/*/{METRIC}",
                         (("labelSelector", "app=app-0"),))}
    report: dict[str, Any] = {}
    for label, (path, query) in paths.items():
        remaining = count

        async def worker(path: str = path, query: Any = query) -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await kube.get_json(path, query=query, operation="bench", resource="bench")

        started, cpu = time.monotonic(), time.process_time()
        await asyncio.gather(*(worker() for _ in range(workers)))
        seconds, cpu_seconds = time.monotonic() - started, time.process_time() - cpu
        report[f"{label}_get_cpu_microseconds"] = round(cpu_seconds / count * 1e6)
        report[f"{label}_gets_per_second"] = round(count / seconds)
    return report


def _pass_report(result: PassResult) -> dict[str, Any]:
    return {"reconciles": result.reconciles, "seconds": round(result.seconds, 2),
            "reconciles_per_second": round(result.per_second, 0),
            "controller_cpu_seconds": round(result.cpu_seconds, 2),
            "reconciles_per_controller_cpu_second": round(result.per_cpu_second, 0),
            "fake_api_cpu_seconds": round(result.fake_cpu_seconds, 2),
            "controller_gc_seconds": round(result.gc_seconds, 2),
            "full_gc_collections": result.full_collections,
            "api_requests_per_reconcile": round(result.requests / result.reconciles, 2)
            if result.reconciles else None}


# --------------------------------------------------------------------------------------------
# Stub: the controller with in-memory APIs


async def _run_stub(args: argparse.Namespace) -> dict[str, Any]:
    from autoscaler.controller.reconciler import Reconciler
    from autoscaler.controller.watching import project_pod
    from autoscaler.controller.workqueue import Controller
    from autoscaler.decision.settings import Settings
    from testbed.fakes import kube_objects
    from tests.autoscaler.controller_support import MemoryCaches, MemoryKube, MemoryMetrics

    _pin(0)
    now = datetime.now(UTC)
    caches = MemoryCaches()
    kube = MemoryKube(caches)
    metrics = MemoryMetrics(timestamp=now.strftime("%Y-%m-%dT%H:%M:%SZ"))
    template = kube_objects.pod("template", namespace="ns", now=now, labels={"app": "x"})
    for index in range(args.autoscalers):
        raw = _autoscaler(index)
        namespace, name = raw["metadata"]["namespace"], raw["metadata"]["name"]
        caches.put(raw)
        kube.set_scale(namespace, name, replicas=args.pods, selector=f"app={name}")
        values = metrics.pod_values.setdefault(f"{namespace}/{name}", {})
        for replica in range(args.pods):
            pod = dict(template)
            pod["metadata"] = {"name": f"{name}-{replica}", "namespace": namespace,
                               "labels": {"app": name}}
            caches.add_pod(project_pod(pod))
            values[f"{name}-{replica}"] = "10"

    class PerAutoscalerMetrics(MemoryMetrics):
        async def get_pods_metric(self, *, namespace: str, metric_name: str, pod_selector: str,
                                  metric_selector: Any) -> dict[str, Any]:
            app = pod_selector.removeprefix("app=")
            self.calls.append("pods")
            items = [{"describedObject": {"kind": "Pod", "namespace": namespace, "name": pod,
                                          "apiVersion": "/v1"},
                      "metric": {"name": metric_name}, "timestamp": self.timestamp,
                      "windowSeconds": 60, "value": value}
                     for pod, value in self.pod_values[f"{namespace}/{app}"].items()]
            return {"kind": "MetricValueList", "apiVersion": "custom.metrics.k8s.io/v1beta2",
                    "metadata": {}, "items": items}

    per_app = PerAutoscalerMetrics(pod_values=metrics.pod_values, timestamp=metrics.timestamp)
    reconciler = Reconciler(kube=kube, metrics=per_app, watching=caches, settings=Settings())
    controller = Controller(reconciler, sync_period=timedelta(hours=1), workers=args.workers,
                            exists=lambda key: caches.get(key) is not None)
    keys = list(caches.entries)
    results = []
    task = asyncio.create_task(controller.run())
    try:
        for _ in range(args.passes):
            before = (controller.reconciled, time.monotonic(), time.process_time(),
                      len(kube.calls) + len(per_app.calls))
            controller.enqueue_all(keys)
            target = before[0] + len(keys)
            with GcTimer() as gc_timer:
                await _until(lambda target=target: controller.reconciled >= target)  # type: ignore[misc]
            results.append(PassResult(
                reconciles=controller.reconciled - before[0],
                seconds=time.monotonic() - before[1],
                cpu_seconds=time.process_time() - before[2],
                requests=len(kube.calls) + len(per_app.calls) - before[3],
                fake_cpu_seconds=0.0, gc_seconds=gc_timer.seconds,
                full_collections=gc_timer.full_collections))
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return {"mode": "stub", "autoscalers": args.autoscalers, "pods": args.autoscalers * args.pods,
            "workers": args.workers,
            "passes": [{k: v for k, v in _pass_report(r).items() if k != "fake_api_cpu_seconds"}
                       for r in results],
            "rss_mib": round(_rss_mib(), 0), "rss_after_trim_mib": round(_trimmed_rss_mib(), 0)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--autoscalers", type=int, default=10_000)
    parser.add_argument("--pods", type=int, default=10, help="pods per autoscaler (default 10)")
    parser.add_argument("--workers", type=int, default=5, help="--concurrent-syncs (default 5)")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--mode", choices=("full", "stub", "both"), default="both")
    parser.add_argument("--profile", action="store_true",
                        help="print a profile of the controller's last full-mode pass")
    parser.add_argument("--profile-out", metavar="FILE",
                        help="with --profile, also write the raw pstats to FILE")
    parser.add_argument("--serve-fake", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fake:
        asyncio.run(_serve_fake(args))
        return 0
    reports = []
    if args.mode in ("stub", "both"):
        reports.append(asyncio.run(_run_stub(args)))
        print(json.dumps(reports[-1], indent=2), flush=True)
    if args.mode in ("full", "both"):
        reports.append(asyncio.run(_run_full(args)))
        print(json.dumps(reports[-1], indent=2), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
