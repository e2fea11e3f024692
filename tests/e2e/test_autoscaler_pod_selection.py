"""KEP-5325's podSelectionStrategy against the fake API server, the real adapter and a real
Prometheus: with OwnerReferences a Job's pods that share the Deployment's labels and a rollout's
not-Ready surge pods no longer move the size; with LabelSelector (upstream) they do. Every pod's
metric, the Job's and the surge pod's too, comes from Prometheus through the adapter, so it is
the owner-based selection that leaves them out."""

from __future__ import annotations

import asyncio
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from testbed.fakes.exporter import Exporter
from testbed.fakes.kube_api import FakeKubeAPI
from testbed.fakes.kube_http import KubeHTTPClient
from testbed.fakes.prometheus import PrometheusServer
from tests.e2e.test_autoscaler_support import (
    GROUP,
    NS,
    PLURAL,
    VERSION,
    autoscaler,
    controller,
    exporter_publisher,
    holds,
    install_crd,
    pods_metric,
    pods_rule,
    prometheus_adapter,
    replicas_of,
    status_of,
    until,
)

pytestmark = pytest.mark.prometheus

LABELS = {"app": "web"}
SERIES = "mspodsel_rps"
SERVED = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{NS}/pods/*/rps"


def rules(job: str) -> str:
    return "rules:\n" + pods_rule(series_query=f'__name__="{SERIES}"',
                                  prefix="mspodsel_", job=job)


async def adapter_serves(http: KubeHTTPClient, pods: set[str], *, within: float) -> None:
    """Until the adapter's answer for `app=web` (through the aggregator) has `pods`' values: the
    pods the autoscaler must leave out are in what the metrics API returns."""
    deadline = time.monotonic() + within
    served: set[str] = set()
    while True:
        reply = await http.get(SERVED, params={"labelSelector": "app=web"})
        if reply.status == 200:
            served = {item["describedObject"]["name"] for item in reply.json["items"]}
            if pods <= served:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within}s: the adapter serves {sorted(pods)}, "
                                 f"have {reply.status} {sorted(served)}")
        await asyncio.sleep(0.2)


def _replica_set(fake: FakeKubeAPI, name: str, *, revision: int, replicas: int) -> None:
    deployment = fake.store.get("apps", "v1", "deployments", "web", namespace=NS)
    owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
             "uid": deployment["metadata"].get("uid", ""), "controller": True}
    fake.create("apps", "v1", "replicasets", {
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": NS, "labels": dict(LABELS),
                     "annotations": {"deployment.kubernetes.io/revision": str(revision)},
                     "ownerReferences": [owner]},
        "spec": {"replicas": replicas, "selector": {"matchLabels": dict(LABELS)},
                 "template": deployment["spec"]["template"]}})


def _pod(fake: FakeKubeAPI, name: str, *, kind: str, owner: str, ready: bool = True) -> None:
    fake.create_pod(name, namespace=NS, labels=LABELS, ready=ready,
                    owner={"apiVersion": "batch/v1" if kind == "Job" else "apps/v1",
                           "kind": kind, "name": owner})


def _web(fake: FakeKubeAPI) -> None:
    """Deployment web at 2 replicas: ReplicaSet web-1 and its two ready pods."""
    fake.create_deployment("web", namespace=NS, replicas=2, labels=LABELS)
    _replica_set(fake, "web-1", revision=1, replicas=2)
    for pod in ("web-1-a", "web-1-b"):
        _pod(fake, pod, kind="ReplicaSet", owner="web-1")


def _autoscaler(strategy: str) -> dict[str, Any]:
    obj = autoscaler("web", target="web", metrics=[pods_metric("rps", "10")])
    obj["spec"]["podSelectionStrategy"] = strategy
    return obj


@pytest.mark.parametrize(("strategy", "replicas", "ignored"),
                         [("OwnerReferences", 2, 1), ("LabelSelector", 9, None)])
async def test_a_jobs_pods_sharing_the_labels_count_only_with_the_label_selector(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient, tmp_path: Path,
        prometheus: PrometheusServer, exporter: Exporter, strategy: str, replicas: int,
        ignored: int | None) -> None:
    install_crd(fake_kube)
    _web(fake_kube)
    _pod(fake_kube, "migrate-x", kind="Job", owner="migrate")
    # web's pods sit at the target; the Job's pod is busy: (10 + 10 + 70) / 3 = 30.
    exporter_publisher(exporter, SERIES)({"web-1-a": Decimal(10), "web-1-b": Decimal(10),
                                          "migrate-x": Decimal(70)})
    await prometheus.wait_for_async(f'{SERIES}{{job="{exporter.job}"}}',
                                    lambda samples: len(samples) == 3, timeout=30)
    async with prometheus_adapter(fake_kube, tmp_path, prometheus_url=prometheus.url,
                                  rules=rules(exporter.job)):
        await adapter_serves(kube_http, {"web-1-a", "web-1-b", "migrate-x"}, within=15)
        fake_kube.create(GROUP, VERSION, PLURAL, _autoscaler(strategy))
        async with controller(fake_kube):
            await until(lambda: "currentMetrics" in status_of(fake_kube, "web"), within=15,
                        what="a first decision")
            if replicas == 2:
                await until(lambda: status_of(fake_kube, "web").get("ignoredPods") == ignored,
                            within=10, what=f"ignoredPods, have {status_of(fake_kube, 'web')}")
                await holds(lambda: replicas_of(fake_kube, "web") == 2, fake=fake_kube,
                            target="web", for_seconds=1.0, what="the Job's pod moved the size")
            else:
                await until(lambda: replicas_of(fake_kube, "web") == replicas, within=15,
                            what="the Job's pod counts with the label selector")
                # The scale is written before the status.
                await until(lambda: status_of(fake_kube, "web").get("desiredReplicas")
                            == replicas, within=5, what="the status of the scale-up")
                assert "ignoredPods" not in status_of(fake_kube, "web")


async def test_steady_load_during_a_rollout_holds_the_size(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient, tmp_path: Path,
        prometheus: PrometheusServer, exporter: Exporter) -> None:
    install_crd(fake_kube)
    _web(fake_kube)
    publish = exporter_publisher(exporter, SERIES)
    publish({"web-1-a": Decimal(10), "web-1-b": Decimal(10)})
    await prometheus.wait_for_async(f'{SERIES}{{job="{exporter.job}"}}',
                                    lambda samples: len(samples) == 2, timeout=30)
    async with prometheus_adapter(fake_kube, tmp_path, prometheus_url=prometheus.url,
                                  rules=rules(exporter.job)):
        fake_kube.create(GROUP, VERSION, PLURAL, _autoscaler("OwnerReferences"))
        async with controller(fake_kube):
            await until(lambda: status_of(fake_kube, "web").get("ignoredPods") == 0, within=15,
                        what=f"a first decision, have {status_of(fake_kube, 'web')}")
            # The rollout: ReplicaSet web-2 surges one pod, Running but not Ready yet, whose
            # warm-up spike would read as (10 + 10 + 70) / 3 = 30 against a target of 10.
            _replica_set(fake_kube, "web-2", revision=2, replicas=1)
            _pod(fake_kube, "web-2-a", kind="ReplicaSet", owner="web-2", ready=False)
            publish({"web-1-a": Decimal(10), "web-1-b": Decimal(10), "web-2-a": Decimal(70)})
            await adapter_serves(kube_http, {"web-1-a", "web-1-b", "web-2-a"}, within=15)
            await until(lambda: status_of(fake_kube, "web").get("ignoredPods") == 1, within=10,
                        what=f"the surge pod left out, have {status_of(fake_kube, 'web')}")
            await holds(lambda: replicas_of(fake_kube, "web") == 2, fake=fake_kube,
                        target="web", for_seconds=1.5,
                        what="a not-Ready surge pod drove a scale-up")
