"""`metricscale demo`: the main job on one machine, with the project's own test doubles.

It starts a real Prometheus scraping a small built-in exporter of per-pod request counters,
and the fake Kubernetes API server (tests/fakes) holding the matching pods, then shows what
`kubectl` prints for them. The demo needs a source checkout, because the fake cluster lives
in tests/fakes; `make demo` runs it from one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

_CHECKOUT = Path(__file__).resolve().parent.parent
DEMO_NAMESPACE = "demo"
DEMO_APP = "web"
DEMO_PODS = ("web-7c9d5-abcde", "web-7c9d5-fghij", "web-7c9d5-klmno")
# Requests per second each pod serves while the demo runs.
_RATES = {DEMO_PODS[0]: 3, DEMO_PODS[1]: 5, DEMO_PODS[2]: 7}


class DemoError(Exception):
    """The demo cannot run here; the message says what is missing."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", type=Path, default=Path(".demo"),
                        help="where the demo writes its kubeconfig and logs (default: .demo)")
    parser.add_argument("--kubectl", default=None,
                        help="kubectl binary (default: kubectl on the PATH)")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        kubectl = args.kubectl or shutil.which("kubectl")
        if not kubectl:
            raise DemoError("kubectl was not found on the PATH (or pass --kubectl)")
        workdir = args.workdir.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        asyncio.run(_demo(workdir=workdir, kubectl=kubectl))
    except DemoError as error:
        print(f"metricscale demo: {error}", file=sys.stderr)
        return 1
    return 0


def _import_doubles() -> Any:
    """The test doubles live in the source tree, not in the installed package."""
    if not (_CHECKOUT / "tests" / "fakes" / "kube_api.py").is_file():
        raise DemoError("the demo needs a source checkout of metricscale (tests/fakes); "
                        "run it with `make demo` from the repository")
    if str(_CHECKOUT) not in sys.path:
        sys.path.insert(0, str(_CHECKOUT))
    import tests.fakes.exporter as exporter
    import tests.fakes.kube_api as kube_api
    import tests.fakes.prometheus as prometheus

    return exporter, kube_api, prometheus


async def _kubectl(kubectl: str, kubeconfig: Path, *arguments: str) -> str:
    process = await asyncio.create_subprocess_exec(
        kubectl, "--kubeconfig", str(kubeconfig), *arguments,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await process.communicate()
    if process.returncode != 0:
        raise DemoError(f"kubectl {' '.join(arguments)} failed: {err.decode().strip()}")
    return out.decode()


def _banner(text: str) -> None:
    print(f"\n=== {text}", flush=True)


async def _count_requests(exporter: Any, seconds: Sequence[int]) -> None:
    """Serve traffic: every second each pod's counter grows by its rate."""
    for _ in seconds:
        for pod, rate in _RATES.items():
            exporter.inc("http_requests_total",
                         {"namespace": DEMO_NAMESPACE, "pod": pod}, rate)
        await asyncio.sleep(1)


async def _demo(*, workdir: Path, kubectl: str) -> None:
    exporter_module, kube_module, prometheus_module = _import_doubles()
    if prometheus_module.find_prometheus() is None:
        raise DemoError("prometheus was not found: install Debian's package "
                        "(`make demo` does) or set PROMETHEUS=/path/to/prometheus")
    kubeconfig = workdir / "kubeconfig"

    _banner("starting Prometheus and a built-in exporter of per-pod request counters")
    with prometheus_module.PrometheusServer() as prometheus, \
            exporter_module.Exporter(job="demo") as exporter:
        for pod in DEMO_PODS:
            exporter.set("http_requests_total", {"namespace": DEMO_NAMESPACE, "pod": pod}, 0)
        prometheus.add_target(exporter)
        print(f"Prometheus {prometheus.url} scrapes {exporter.url} every second")
        traffic = asyncio.create_task(_count_requests(exporter, range(3600)))
        try:
            await prometheus.wait_for_scrape_async(exporter, timeout=60.0)

            _banner("starting the fake Kubernetes API server with the matching pods")
            async with kube_module.FakeKubeAPI(workdir=workdir / "kube") as kube:
                kube.create_namespace(DEMO_NAMESPACE)
                kube.create_deployment(DEMO_APP, namespace=DEMO_NAMESPACE,
                                       replicas=len(DEMO_PODS), labels={"app": DEMO_APP})
                for pod in DEMO_PODS:
                    kube.create_pod(pod, namespace=DEMO_NAMESPACE, labels={"app": DEMO_APP})
                kube.write_kubeconfig(kubeconfig)
                print(f"API server {kube.url}; kubeconfig {kubeconfig}")

                path = f"/api/v1/namespaces/{DEMO_NAMESPACE}/pods"
                _banner(f"kubectl --kubeconfig {kubeconfig} get --raw {path}")
                raw = await _kubectl(kubectl, kubeconfig, "get", "--raw", path)
                print(json.dumps(json.loads(raw), indent=2))

                _banner("what Prometheus holds for those pods (requests per second)")
                await asyncio.sleep(3)
                samples = await prometheus.query_async(
                    f'sum by (pod) (rate(http_requests_total{{namespace="{DEMO_NAMESPACE}"}}[1m]))')
                for sample in sorted(samples, key=lambda s: s.labels.get("pod", "")):
                    print(f"  {sample.labels.get('pod', '?'):<20} {sample.value}")
        finally:
            traffic.cancel()
            await asyncio.gather(traffic, return_exceptions=True)
    _banner("done: Prometheus and the fake API server are stopped")
