"""Hostile path segments and selector values over HTTPS against a real Prometheus: never a 5xx.

Names that no Kubernetes object can carry (U+FFFD, `[`, `.*`, control characters, 10 kB) are a
404 before any query is built; selector values are validated as label values (400); the raw
parse-level errors aiohttp answers itself carry no request bytes.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import raw_http
from tests.adapter.test_server_harness import (
    RunningAdapter,
    client_ssl_context,
    running_adapter,
    wait_for_series,
)
from tests.fakes import kube_objects
from tests.fakes.kube_api import FakeKubeAPI
from tests.fakes.prometheus import ExporterPool, PrometheusServer

pytestmark = [pytest.mark.prometheus, pytest.mark.asyncio(loop_scope="module")]

CONFIG = """
rules:
- seriesQuery: '{{__name__="hn_requests",job="{job}"}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
      pod: {{resource: pod}}
      node: {{resource: node}}
  metricsQuery: >-
    sum(<<.Series>>{{namespace="<<index .LabelValuesByName "namespace">>",pod=~"<<index
    .LabelValuesByName "pod">>"}}) by (<<.GroupBy>>)
externalRules:
- seriesQuery: '{{__name__="hn_queue",job="{job}"}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (queue)'
resourceRules:
  cpu:
    containerQuery: 'sum(hn_cpu{{<<.LabelMatchers>>,job="{job}"}}) by (<<.GroupBy>>)'
    nodeQuery: 'sum(hn_node_cpu{{<<.LabelMatchers>>,job="{job}"}}) by (<<.GroupBy>>)'
    resources:
      overrides:
        namespace: {{resource: namespace}}
        pod: {{resource: pod}}
        node: {{resource: node}}
    containerLabel: container
  memory:
    containerQuery: 'sum(hn_memory{{<<.LabelMatchers>>,job="{job}"}}) by (<<.GroupBy>>)'
    nodeQuery: 'sum(hn_node_memory{{<<.LabelMatchers>>,job="{job}"}}) by (<<.GroupBy>>)'
    resources:
      overrides:
        namespace: {{resource: namespace}}
        pod: {{resource: pod}}
        node: {{resource: node}}
    containerLabel: container
  window: 1m
"""

CUSTOM = "/apis/custom.metrics.k8s.io/v1beta2"
EXTERNAL = "/apis/external.metrics.k8s.io/v1beta1"
RESOURCE = "/apis/metrics.k8s.io/v1beta1"

# Each takes one hostile path segment.
PATH_SHAPES = (
    CUSTOM + "/namespaces/shop/pods/{}/hn_requests",
    CUSTOM + "/namespaces/{}/pods/web-0/hn_requests",
    CUSTOM + "/namespaces/{}/pods/*/hn_requests",
    CUSTOM + "/namespaces/{}/metrics/hn_requests",
    CUSTOM + "/nodes/{}/hn_requests",
    CUSTOM + "/widgets.example.com/{}/hn_requests",
    CUSTOM + "/namespaces/shop/pods/web-0/{}",
    EXTERNAL + "/namespaces/{}/hn_queue",
    EXTERNAL + "/namespaces/shop/{}",
    RESOURCE + "/namespaces/{}/pods",
    RESOURCE + "/namespaces/shop/pods/{}",
    RESOURCE + "/nodes/{}",
)
# Each takes one hostile selector value.
SELECTOR_SHAPES = (
    (CUSTOM + "/namespaces/shop/pods/*/hn_requests", "labelSelector", "app={}"),
    (CUSTOM + "/namespaces/shop/pods/web-0/hn_requests", "metricLabelSelector", "code={}"),
    (CUSTOM + "/namespaces/shop/pods/web-0/hn_requests", "metricLabelSelector", "code in ({})"),
    (EXTERNAL + "/namespaces/shop/hn_queue", "labelSelector", "queue={}"),
    (EXTERNAL + "/namespaces/shop/hn_queue", "labelSelector", "queue notin ({})"),
    (RESOURCE + "/namespaces/shop/pods", "labelSelector", "app={}"),
)

HOSTILE = ("\ufffd", "\ud800", "[", ".*", "(?i)web-0", "a\nb", "\x00", "x" * 10_000, "web-0\ufffd",
           "%", "..", "\u0085", "WEB-0", "a b", '"', "\\", "}", "*")


@dataclass
class World:
    adapter: RunningAdapter


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(prometheus: PrometheusServer, exporter_pool: ExporterPool,
                tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    workdir = tmp_path_factory.mktemp("hostile-names")
    with exporter_pool.exporter() as exporter:
        exporter.set("hn_requests", {"namespace": "shop", "pod": "web-0"}, 1)
        exporter.set("hn_queue", {"namespace": "shop", "queue": "orders"}, 2)
        async with FakeKubeAPI(workdir=workdir / "kube") as kube:
            kube.create_namespace("shop")
            kube.create("", "v1", "pods", kube_objects.pod(
                "web-0", namespace="shop", now=datetime.now(UTC), labels={"app": "web"}))
            kube.create("", "v1", "nodes", {"metadata": {"name": "node-1"}})
            kube.create_crd(group="example.com", kind="Widget", plural="widgets",
                            scope="Cluster")
            await asyncio.sleep(0)
            await wait_for_series(prometheus, f'hn_requests{{job="{exporter.job}"}}', 1)
            async with running_adapter(
                    workdir=workdir / "adapter", config_text=CONFIG.format(job=exporter.job),
                    prometheus_url=prometheus.url,
                    kubeconfig=kube.write_kubeconfig(workdir / "kubeconfig")) as adapter:
                yield World(adapter)


def encode_segment(text: str) -> str:
    """Percent-encode every byte that is not unreserved; lone surrogates as their 3 bytes
    (`%ED%A0%80`), which is not UTF-8."""
    return urllib.parse.quote(text.encode("utf-8", "surrogatepass"), safe="")


async def get_segment(world: World, shape: str, segment: str) -> int:
    reply = await world.adapter.get(shape.format(encode_segment(segment)))
    assert reply.status < 500, (shape, segment, reply.status, reply.body[:300])
    return reply.status


async def get_selector(world: World, shape: tuple[str, str, str], value: str) -> int:
    path, parameter, template = shape
    query = urllib.parse.urlencode({parameter: template.format(value)}, quote_via=lambda text,
                                   *_: encode_segment(str(text)))
    reply = await world.adapter.get(f"{path}?{query}")
    assert reply.status < 500, (shape, value, reply.status, reply.body[:300])
    return reply.status


# ------------------------------------------------------------------------------ pinned cases


@pytest.mark.parametrize("shape", PATH_SHAPES)
@pytest.mark.parametrize("segment", ["\ufffd", "[", ".*", "(?i)web-0", "a\nb", "x" * 5_000])
async def test_a_name_no_object_can_carry_is_not_found(world: World, shape: str,
                                                       segment: str) -> None:
    reply = await world.adapter.get(shape.format(encode_segment(segment)))
    if segment in ("[", ".*", "(?i)web-0") and "/namespaces/shop/pods/web-0/{}" in shape:
        assert reply.status == 404  # an unknown metric
        return
    assert reply.status == 404, (shape, reply.status, reply.body[:300])
    assert reply.json()["reason"] == "NotFound"


@pytest.mark.parametrize("shape", PATH_SHAPES)
async def test_a_10_kb_name_is_a_bad_request_line(world: World, shape: str) -> None:
    # Over aiohttp's 8,190-byte request line: the parser's 400, as a Status.
    reply = await world.adapter.get(shape.format("x" * 10_000))
    assert reply.status == 400
    assert reply.json()["kind"] == "Status"


@pytest.mark.parametrize("shape", PATH_SHAPES)
async def test_a_lone_surrogate_in_a_path_is_a_client_error(world: World, shape: str) -> None:
    status = await get_segment(world, shape, "\ud800")
    assert status in (400, 404)


@pytest.mark.parametrize("shape", SELECTOR_SHAPES)
@pytest.mark.parametrize("value", ["\ufffd", "x" * 10_000, "[", "(?i)web"])
async def test_an_invalid_selector_value_is_a_bad_request(world: World,
                                                          shape: tuple[str, str, str],
                                                          value: str) -> None:
    assert await get_selector(world, shape, value) in (400, 404)


async def test_the_valid_names_still_answer(world: World) -> None:
    assert (await world.adapter.get(CUSTOM + "/namespaces/shop/pods/web-0/hn_requests")
            ).status == 200
    assert (await world.adapter.get(EXTERNAL + "/namespaces/shop/hn_queue")).status == 200


# ------------------------------------------------------------------------------ properties

segments = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=40),
                     st.text(alphabet="[](){}.*+?|^$\\\ufffd\n%/ a-", max_size=20))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(shape=st.sampled_from(PATH_SHAPES), segment=segments)
async def test_no_path_segment_gives_a_server_error(world: World, shape: str,
                                                    segment: str) -> None:
    if segment in ("", ".", ".."):
        return  # they change the path's shape, not a name in it
    await get_segment(world, shape, segment)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(shape=st.sampled_from(SELECTOR_SHAPES), value=segments)
async def test_no_selector_value_gives_a_server_error(world: World,
                                                      shape: tuple[str, str, str],
                                                      value: str) -> None:
    await get_selector(world, shape, value)


# ------------------------------------------------------------------------------ parse-level 400s


async def raw_exchange(world: World, request: bytes) -> tuple[int, bytes]:
    return await raw_http.raw_exchange(
        world.adapter.port, request,
        ssl_context=client_ssl_context(world.adapter.pair.ca_file))


@pytest.mark.parametrize("request_bytes", raw_http.unparseable_requests("/livez"))
async def test_a_request_aiohttp_cannot_parse_gets_a_status_without_its_bytes(
        world: World, request_bytes: bytes) -> None:
    status, body = await raw_exchange(world, request_bytes)
    assert status == 400
    assert b"QQQQ" not in body
    status_json = json.loads(body)
    assert status_json["kind"] == "Status"
    assert status_json["code"] == 400
    assert status_json["reason"] == "BadRequest"


async def test_connect_gets_a_client_error_without_its_bytes(world: World) -> None:
    # aiohttp's C parser takes CONNECT as an upgrade; the route then answers, not the parser.
    status, body = await raw_exchange(
        world, b"CONNECT QQQQQQQQ:443 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    assert 400 <= status < 500
    assert b"QQQQ" not in body
