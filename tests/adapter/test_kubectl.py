"""What users type: `kubectl get --raw` straight at the adapter (a kubeconfig with the adapter's
CA), and through the fake kube-apiserver's aggregator (APIServices verified by `caBundle`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
import yaml

from testbed.fakes import kube_objects
from testbed.fakes.kube_api import FakeKubeAPI
from testbed.fakes.prometheus import ExporterPool, PrometheusServer
from testbed.fakes.tools import require_tool
from tests.adapter.harness import (
    SERVICE_NAME,
    SERVICE_NAMESPACE,
    RunningAdapter,
    running_adapter,
    wait_for_series,
)

pytestmark = [pytest.mark.prometheus, pytest.mark.kubectl,
              pytest.mark.asyncio(loop_scope="module")]

CONFIG = """
rules:
- seriesQuery: '{{__name__="e2e_requests",job="{job}"}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
      pod: {{resource: pod}}
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)'
externalRules:
- seriesQuery: '{{__name__="e2e_queue",job="{job}"}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
  name:
    as: 'queueDepth'
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (queue)'
"""
PODS_PATH = ("/apis/custom.metrics.k8s.io/v1beta2/namespaces/shop/pods/*/e2e_requests"
             "?labelSelector=app%3Dweb")
EXTERNAL_PATH = "/apis/external.metrics.k8s.io/v1beta1/namespaces/shop/queuedepth"


@dataclass
class World:
    adapter: RunningAdapter
    kube: FakeKubeAPI
    workdir: Path
    kubectl: str


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(prometheus: PrometheusServer, exporter_pool: ExporterPool,
                tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    kubectl = require_tool("kubectl")
    workdir = tmp_path_factory.mktemp("kubectl")
    with exporter_pool.exporter() as exporter:
        exporter.set("e2e_requests", {"namespace": "shop", "pod": "web-0"}, 1.5)
        exporter.set("e2e_requests", {"namespace": "shop", "pod": "web-1"}, 2)
        exporter.set("e2e_requests", {"namespace": "shop", "pod": "db-0"}, 9)
        exporter.set("e2e_queue", {"namespace": "shop", "queue": "orders"}, 12)
        await wait_for_series(prometheus, f'{{job="{exporter.job}",__name__=~"e2e_.*"}}', 4)
        async with FakeKubeAPI(workdir=workdir / "kube", availability_max_backoff=0.5) as kube:
            for name, app in (("web-0", "web"), ("web-1", "web"), ("db-0", "db")):
                kube.create("", "v1", "pods", kube_objects.pod(
                    name, namespace="shop", now=kube.clock(), labels={"app": app}))
            async with running_adapter(
                    workdir=workdir / "adapter", config_text=CONFIG.format(job=exporter.job),
                    prometheus_url=prometheus.url,
                    kubeconfig=kube.write_kubeconfig(workdir / "kubeconfig")) as adapter:
                yield World(adapter, kube, workdir, kubectl)


async def kubectl(world: World, kubeconfig: Path, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        world.kubectl, "--kubeconfig", str(kubeconfig), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(30):
            stdout, stderr = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


def adapter_kubeconfig(world: World) -> Path:
    """A kubeconfig whose server is the adapter itself, trusted through its CA."""
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "adapter", "cluster": {
            "server": world.adapter.url,
            "certificate-authority": str(world.adapter.pair.ca_file)}}],
        # Some credential, or kubectl prompts for a username; the harness lets everyone in.
        "users": [{"name": "nobody", "user": {"token": "any-token"}}],
        "contexts": [{"name": "adapter", "context": {"cluster": "adapter", "user": "nobody"}}],
        "current-context": "adapter"}
    path = world.workdir / "adapter.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def values(output: str) -> dict[str, str]:
    body = json.loads(output)
    return {item["describedObject"]["name"]: item["value"] for item in body["items"]}


async def test_kubectl_get_raw_straight_at_the_adapter(world: World) -> None:
    config = adapter_kubeconfig(world)
    code, out, err = await kubectl(world, config, "get", "--raw", PODS_PATH)
    assert code == 0, err
    assert values(out) == {"web-0": "1500m", "web-1": "2"}
    code, out, err = await kubectl(world, config, "get", "--raw", EXTERNAL_PATH)
    assert code == 0, err
    assert json.loads(out)["items"][0]["metricName"] == "queueDepth"


async def test_kubectl_shows_the_status_message_of_an_error(world: World) -> None:
    config = adapter_kubeconfig(world)
    code, _, err = await kubectl(
        world, config, "get", "--raw",
        "/apis/custom.metrics.k8s.io/v1beta2/namespaces/shop/pods/*/nope")
    assert code != 0
    assert "the server could not find the metric nope for pods" in err


async def test_kubectl_get_raw_through_the_aggregator(world: World) -> None:
    kube = world.kube
    for group, version, priority in (("custom.metrics.k8s.io", "v1beta1", 100),
                                     ("custom.metrics.k8s.io", "v1beta2", 200),
                                     ("external.metrics.k8s.io", "v1beta1", 100)):
        kube.create_apiservice(group=group, version=version, service_namespace=SERVICE_NAMESPACE,
                               service_name=SERVICE_NAME, ca_bundle=world.adapter.pair.ca_pem,
                               version_priority=priority)
    kube.set_service_endpoint(SERVICE_NAMESPACE, SERVICE_NAME, "127.0.0.1", world.adapter.port)
    for name in ("v1beta2.custom.metrics.k8s.io", "v1beta1.custom.metrics.k8s.io",
                 "v1beta1.external.metrics.k8s.io"):
        await kube.wait_for_apiservice(name)
    cluster = kube.write_kubeconfig(world.workdir / "cluster.kubeconfig")
    code, out, err = await kubectl(world, cluster, "get", "--raw", PODS_PATH)
    assert code == 0, err
    assert values(out) == {"web-0": "1500m", "web-1": "2"}
    code, out, err = await kubectl(world, cluster, "get", "--raw",
                                   "/apis/custom.metrics.k8s.io/v1beta1")
    assert code == 0, err
    names = {r["name"] for r in json.loads(out)["resources"]}
    assert "pods/e2e_requests" in names
    code, out, err = await kubectl(world, cluster, "get", "--raw", EXTERNAL_PATH)
    assert code == 0, err
    assert json.loads(out)["items"][0]["value"] == "12"
