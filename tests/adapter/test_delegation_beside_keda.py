"""Living beside KEDA: our adapter in front, a KEDA-like metrics server behind it.

kube-apiserver's aggregator (the session's real control plane) proxies
`external.metrics.k8s.io` to our adapter (registered as it is in production); our rules serve
`queueLength`, and every other external metric goes to the KEDA double
(testbed/fakes/keda_metrics.py) with `--delegate-external-to`. The HPA's own token asks
through the aggregator for both sides' metrics; the double records what it received.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from testbed.fakes.keda_metrics import KedaMetricsServer, identity_of
from testbed.fakes.prometheus import ExporterPool, PrometheusServer
from tests.adapter.auth_support import (
    AGGREGATED_ACCEPT,
    EXTERNAL,
    HPA_ACCEPT,
    Env,
    Reply,
    auth_environment,
    make_pki,
)
from tests.adapter.cluster import ModuleCluster, grant_paths

pytestmark = [pytest.mark.prometheus, pytest.mark.asyncio(loop_scope="module")]

HPA_USER = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
DELEGATION_CN = "metricscale-delegation"


@dataclass
class World:
    env: Env
    keda: KedaMetricsServer
    hpa_token: str

    @property
    def shop(self) -> str:
        return self.env.seeded.shop

    @property
    def keda_metric(self) -> str:
        return (f"{EXTERNAL}/namespaces/{self.shop}/s0-prometheus?labelSelector="
                "scaledobject.keda.sh%2Fname%3Dweb")

    @property
    def our_metric(self) -> str:
        return f"{EXTERNAL}/namespaces/{self.shop}/queuelength?labelSelector=queue%3Dorders"

    @property
    def admin(self) -> tuple[Path, Path]:
        admin = self.env.control_plane.admin
        return admin.cert, admin.key

    async def hpa_get(self, path: str) -> Reply:
        return await self.env.through_aggregator(path, token=self.hpa_token, accept=HPA_ACCEPT)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(cluster: ModuleCluster, tmp_path_factory: pytest.TempPathFactory,
                prometheus: PrometheusServer, exporter_pool: ExporterPool,
                ) -> AsyncIterator[World]:
    workdir = tmp_path_factory.mktemp("adapter-delegation")
    shop = cluster.names.namespace("shop")  # the namespace auth_environment makes
    control_plane = cluster.control_plane
    role = f"metricscale-test-metrics-{cluster.names.prefix}"
    grant_paths(control_plane, role, users=["metrics-reader"], paths=["/metrics"])
    cluster.cleanup.add(*({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
                           "metadata": {"name": role}}
                          for kind in ("ClusterRole", "ClusterRoleBinding")))
    # KEDA's own PKI: its serving CA, and the request-header CA it trusts for front proxies.
    keda_pki = make_pki(workdir / "keda-pki")
    client_cert, client_key = keda_pki.client_pair("delegation", keda_pki.proxy_ca,
                                                   user=DELEGATION_CN)
    keda = KedaMetricsServer(
        cert_file=keda_pki.serving_cert, key_file=keda_pki.serving_key,
        request_header_ca_pem=keda_pki.proxy_ca.certificate_pem,
        allowed_names=(DELEGATION_CN,),
        # A clash: KEDA also has a `queuelength`; ours must answer it.
        values={(shop, "web", "s0-prometheus"): "17",
                (shop, "web", "queuelength"): "1"})
    async with keda:
        args = ["--delegate-external-to", keda.url,
                "--delegate-ca-file", str(keda_pki.serving_ca_file),
                "--delegate-client-cert-file", str(client_cert),
                "--delegate-client-key-file", str(client_key)]
        async with auth_environment(cluster, workdir / "env", prometheus=prometheus,
                                    exporter_pool=exporter_pool, args=args) as env:
            # The HPA's own token: its bootstrap role lets it read external metrics.
            token = control_plane.service_account_token("kube-system",
                                                        "horizontal-pod-autoscaler")
            yield World(env, keda, token)


def metric_requests(keda: KedaMetricsServer, metric: str) -> int:
    return len(keda.requests_for(f"/{metric}"))


async def test_an_hpa_reads_our_metric_through_the_aggregator_and_ours_wins_the_clash(
        world: World) -> None:
    before = metric_requests(world.keda, "queuelength")
    reply = await world.hpa_get(world.our_metric)
    assert reply.status == 200, reply
    body = reply.json()
    assert body["kind"] == "ExternalMetricValueList"
    assert [(item["metricName"], item["value"]) for item in body["items"]] == \
        [("queueLength", "1200")]
    assert metric_requests(world.keda, "queuelength") == before  # never asked


async def test_an_hpa_reads_kedas_metric_through_the_aggregator_unchanged(
        world: World) -> None:
    reply = await world.hpa_get(world.keda_metric)
    assert reply.status == 200, reply
    assert reply.header("Content-Type") == "application/json"
    body = reply.json()
    assert (body["kind"], body["apiVersion"]) == ("ExternalMetricValueList",
                                                  "external.metrics.k8s.io/v1beta1")
    assert [(item["metricName"], item["value"], item["metricLabels"])
            for item in body["items"]] == [("s0-prometheus", "17", None)]
    seen = world.keda.requests_for("/s0-prometheus")[-1]
    assert seen.path == \
        f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{world.shop}/s0-prometheus"
    assert seen.query == "labelSelector=scaledobject.keda.sh%2Fname%3Dweb"


async def test_the_delegate_sees_the_callers_identity_and_our_front_proxy_certificate(
        world: World) -> None:
    reply = await world.hpa_get(world.keda_metric)
    assert reply.status == 200, reply
    seen = world.keda.requests_for("/s0-prometheus")[-1]
    assert seen.client_cn == DELEGATION_CN
    user, groups, extra = identity_of(seen)
    assert user == HPA_USER
    assert groups == ["system:serviceaccounts", "system:serviceaccounts:kube-system",
                      "system:authenticated"]
    # The key percent-encoded as kube-apiserver sends it; the value is the token's ID.
    assert list(extra) == ["authentication.kubernetes.io%2fcredential-id"]
    assert [value.startswith("JTI=") for value in
            extra["authentication.kubernetes.io%2fcredential-id"]] == [True]
    assert seen.header_values("Authorization") == []  # the caller's token stays with us
    assert seen.header_values("Accept") == [HPA_ACCEPT]


async def test_kedas_own_errors_come_back_unchanged(world: World) -> None:
    # KEDA answers a missing ScaledObject selector with a 500 whose reason is empty.
    reply = await world.hpa_get(f"{EXTERNAL}/namespaces/{world.shop}/s0-prometheus")
    assert reply.status == 500, reply
    body: dict[str, Any] = reply.json()
    assert body["message"] == "scaledObject name is not specified"
    assert "reason" not in body
    reply = await world.hpa_get(f"{EXTERNAL}/namespaces/{world.shop}/s1-rabbitmq"
                                "?labelSelector=scaledobject.keda.sh%2Fname%3Dweb")
    assert reply.status == 500, reply
    assert reply.json()["message"].endswith("no matching metrics found for s1-rabbitmq")


async def test_discovery_lists_ours_then_the_delegates(world: World) -> None:
    reply = await world.env.through_aggregator(EXTERNAL, cert=world.admin)
    assert reply.status == 200, reply
    names = [resource["name"] for resource in reply.json()["resources"]]
    assert names == ["queueLength", "externalmetric"]
    aggregated = await world.env.as_proxy("/apis", user="system:kube-aggregator",
                                          groups=("system:masters",),
                                          headers=[("Accept", AGGREGATED_ACCEPT)])
    assert aggregated.status == 200, aggregated
    external = next(group for group in aggregated.json()["items"]
                    if group["metadata"]["name"] == "external.metrics.k8s.io")
    listed = [resource["resource"] for resource in external["versions"][0]["resources"]]
    assert listed == ["queueLength", "externalmetric"]


async def test_the_delegate_down_is_a_503_for_its_metrics_only(world: World) -> None:
    await world.keda.stop()
    try:
        reply = await world.hpa_get(world.keda_metric)
        assert reply.status == 503, reply
        body = reply.json()
        assert (body["kind"], body["code"], body["reason"]) == ("Status", 503,
                                                                "ServiceUnavailable")
        assert "s0-prometheus" in body["message"]
        assert "127.0.0.1" not in body["message"]  # the delegate's address stays in our log
        ours = await world.hpa_get(world.our_metric)
        assert ours.status == 200, ours
        listed = await world.env.through_aggregator(EXTERNAL, cert=world.admin)
        assert listed.status == 200, listed
        assert [r["name"] for r in listed.json()["resources"]] == ["queueLength"]
        metrics = await world.env.as_proxy("/metrics", user="metrics-reader")
        assert ('metricscale_delegated_requests_total{group="external.metrics.k8s.io",'
                'outcome="unavailable",request="metric"}') in metrics.text
        assert ('metricscale_delegated_requests_total{group="external.metrics.k8s.io",'
                'outcome="unavailable",request="discovery"}') in metrics.text
    finally:
        await world.keda.start()  # on the same port
    reply = await world.hpa_get(world.keda_metric)
    assert reply.status == 200, reply
