"""What users type: `kubectl get --raw` straight at the adapter (a kubeconfig with the adapter's
CA), and through the real aggregator of the session's control plane (APIServices verified by
`caBundle`, reaching the adapter through an ExternalName Service).

The adapter is `metricscale adapter`, the process, under its manifests' RBAC, on the session's
Prometheus (series of an exporter job of the module's own); the pods are real objects in a
namespace of the module's own, and the three metrics APIServices are given back as they were
(other modules of the session may own them).
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from testbed.controlplane import ControlPlane, KubeError
from testbed.fakes.prometheus import ExporterPool, PrometheusServer, count_of
from testbed.metricscale_adapter import MetricscaleAdapter
from testbed.processes import wait_until
from tests.adapter.cluster import (
    GROUP_VERSIONS,
    ModuleCluster,
    Names,
    apiservices_given_back,
    pod_manifest,
    running_status,
)

pytestmark = [pytest.mark.prometheus, pytest.mark.kubectl]

NAMES = Names.unique("kubectl")
SHOP = NAMES.namespace("shop")
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
PODS_PATH = (f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{SHOP}/pods/*/e2e_requests"
             "?labelSelector=app%3Dweb")
EXTERNAL_PATH = f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{SHOP}/queuedepth"
APISERVICES = tuple(f"{version}.{group}" for group, version, _ in GROUP_VERSIONS)
# Bounds on waits for conditions on a loaded machine (processes starting, scrapes, caches).
SETTLE_SECONDS = 180


@dataclass
class World:
    cluster: ControlPlane
    adapter: MetricscaleAdapter
    workdir: Path


@pytest.fixture(scope="module")
def world(control_plane: ControlPlane, cluster: ModuleCluster, prometheus: PrometheusServer,
          exporter_pool: ExporterPool,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    workdir = tmp_path_factory.mktemp("kubectl")
    with exporter_pool.exporter() as exporter:
        exporter.set("e2e_requests", {"namespace": SHOP, "pod": "web-0"}, 1.5)
        exporter.set("e2e_requests", {"namespace": SHOP, "pod": "web-1"}, 2)
        exporter.set("e2e_requests", {"namespace": SHOP, "pod": "db-0"}, 9)
        exporter.set("e2e_queue", {"namespace": SHOP, "queue": "orders"}, 12)
        prometheus.wait_for(f'{{job="{exporter.job}",__name__=~"e2e_.*"}}', count_of(4),
                            timeout=60)
        assert cluster.namespace("shop") == SHOP
        for name, app in (("web-0", "web"), ("web-1", "web"), ("db-0", "db")):
            pod = pod_manifest(name, SHOP, labels={"app": app})
            control_plane.apply(pod)
            # No kubelet runs them (they are never scheduled): their status is a kubelet's.
            control_plane.request("PATCH", f"/api/v1/namespaces/{SHOP}/pods/{name}/status",
                                  {"status": running_status()},
                                  content_type="application/merge-patch+json")
        with MetricscaleAdapter(control_plane, workdir=workdir / "adapter",
                                config_text=CONFIG.format(job=exporter.job),
                                prometheus_url=prometheus.url,
                                namespace=cluster.namespace("adapter")) as adapter:
            world = World(control_plane, adapter, workdir)
            # Ready once its first discovery is done, but its pod cache may lag on a busy
            # machine: until the adapter itself answers for both pods.
            wait_until(lambda: _values_straight(world) == {"web-0": "1500m", "web-1": "2"},
                       what="the adapter serving e2e_requests of the module's pods",
                       timeout=SETTLE_SECONDS, children=[adapter.child] if adapter.child else [],
                       interval=0.2)
            yield world


def _values_straight(world: World) -> dict[str, str] | None:
    path, _, query = PODS_PATH.partition("?")
    reply = world.adapter.request(urllib.parse.quote(path) + "?" + query)
    return values(reply.body.decode()) if reply.status == 200 else None


def kubectl(world: World, kubeconfig: Path, *args: str) -> tuple[int, str, str]:
    """The control plane's kubectl (its own version), with `kubeconfig`."""
    done = world.cluster.kubectl(*args, kubeconfig=kubeconfig, check=False, timeout=60)
    return done.returncode, done.stdout, done.stderr


def adapter_kubeconfig(world: World) -> Path:
    """A kubeconfig whose server is the adapter itself, trusted through its CA (the cluster's,
    which issued its serving certificate). The real adapter authenticates its callers (the
    harness the fake served let everyone in with any token): the admin's client certificate,
    which it verifies against the cluster's client CA and authorizes with a
    SubjectAccessReview, as it does for any user that calls it directly."""
    admin = world.cluster.admin
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "adapter", "cluster": {
            "server": f"https://127.0.0.1:{world.adapter.port}",
            "certificate-authority": str(world.cluster.ca_file)}}],
        "users": [{"name": "admin", "user": {"client-certificate": str(admin.cert),
                                             "client-key": str(admin.key)}}],
        "contexts": [{"name": "adapter", "context": {"cluster": "adapter", "user": "admin"}}],
        "current-context": "adapter"}
    path = world.workdir / "adapter.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def values(output: str) -> dict[str, str]:
    body = json.loads(output)
    return {item["describedObject"]["name"]: item["value"] for item in body["items"]}


def test_kubectl_get_raw_straight_at_the_adapter(world: World) -> None:
    config = adapter_kubeconfig(world)
    code, out, err = kubectl(world, config, "get", "--raw", PODS_PATH)
    assert code == 0, err
    assert values(out) == {"web-0": "1500m", "web-1": "2"}
    code, out, err = kubectl(world, config, "get", "--raw", EXTERNAL_PATH)
    assert code == 0, err
    assert json.loads(out)["items"][0]["metricName"] == "queueDepth"


def test_kubectl_shows_the_status_message_of_an_error(world: World) -> None:
    config = adapter_kubeconfig(world)
    code, _, err = kubectl(
        world, config, "get", "--raw",
        f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{SHOP}/pods/*/nope")
    assert code != 0
    assert "the server could not find the metric nope for pods" in err


def test_kubectl_get_raw_through_the_aggregator(world: World) -> None:
    cluster, adapter = world.cluster, world.adapter
    with apiservices_given_back(cluster, APISERVICES):
        for group, version, priority in GROUP_VERSIONS:
            cluster.register_apiservice(group, version, port=adapter.port,
                                        ca_pem=cluster.ca_file.read_bytes(),
                                        namespace=adapter.namespace, service=adapter.service,
                                        priority=(100, priority))
        for group, version, _ in GROUP_VERSIONS:
            cluster.wait_apiservice_available(group, version, timeout=SETTLE_SECONDS)

        def routed_to_us() -> bool:
            # Available says the adapter answers; the aggregator's proxy may still send a
            # moment longer to whoever had the APIServices before (the cluster is shared).
            try:
                answer = cluster.get(EXTERNAL_PATH)
            except (KubeError, OSError):
                return False
            return [i.get("metricName") for i in answer.get("items") or []] == ["queueDepth"]

        wait_until(routed_to_us, what="the aggregator proxying to the module's adapter",
                   timeout=SETTLE_SECONDS, children=[adapter.child] if adapter.child else [],
                   interval=0.2)
        code, out, err = kubectl(world, cluster.kubeconfig, "get", "--raw", PODS_PATH)
        assert code == 0, err
        assert values(out) == {"web-0": "1500m", "web-1": "2"}
        code, out, err = kubectl(world, cluster.kubeconfig, "get", "--raw",
                                 "/apis/custom.metrics.k8s.io/v1beta1")
        assert code == 0, err
        names = {r["name"] for r in json.loads(out)["resources"]}
        assert "pods/e2e_requests" in names
        code, out, err = kubectl(world, cluster.kubeconfig, "get", "--raw", EXTERNAL_PATH)
        assert code == 0, err
        assert json.loads(out)["items"][0]["value"] == "12"
