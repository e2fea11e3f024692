"""Hostile path segments and selector values over HTTPS against a real Prometheus: never a 5xx,
and always the answer Kubernetes' rules call for.

Paths that could be read two ways (an encoded slash, NUL, not UTF-8, a dot segment) are a 400;
names that no Kubernetes object can carry (U+FFFD, `[`, `.*`, control characters) are a 404
before any query is built, as are names of objects that do not exist; the fixture's own objects
and metrics answer 200; a 10 kB request line is aiohttp's 400. Selector values are validated as
label values (400 with the parser's message); a valid selector answers by what it selects.
The raw parse-level errors aiohttp answers itself carry no request bytes.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.parse
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metricscale.core.selectors import SelectorError, parse_selector
from testbed.fakes.prometheus import ExporterPool, PrometheusServer
from tests import raw_http
from tests.adapter.cluster import ModuleCluster, Names, Objects, node_manifest, pod_manifest
from tests.adapter.harness import (
    Reply,
    RunningAdapter,
    client_ssl_context,
    running_adapter,
    wait_for_series,
)

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

NAMES = Names.unique("hostile")
SHOP = NAMES.namespace("shop")
NODE_1 = NAMES.cluster("node-1")
GROUP = f"{NAMES.prefix}.example.com"  # the Widget CRD's group, the module's own
CUSTOM = "/apis/custom.metrics.k8s.io/v1beta2"
EXTERNAL = "/apis/external.metrics.k8s.io/v1beta1"
RESOURCE = "/apis/metrics.k8s.io/v1beta1"

# Kubernetes' DNS-1123 label (a namespace's name), independent of the adapter's own copy.
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _is_label(text: str) -> bool:
    return len(text) <= 63 and _DNS1123_LABEL.fullmatch(text) is not None


@dataclass(frozen=True)
class Position:
    """What a path shape's segment names: which segments answer 200 (the fixture's pod web-0
    in namespace SHOP, node NODE_1, the series hn_requests{pod="web-0"} and hn_queue), and
    whether `*` there means every namespace (a 400: one namespace at a time)."""

    found: Callable[[str], bool]
    all_namespaces: bool = False


def _one_of(*names: str) -> Callable[[str], bool]:
    return lambda segment: segment in names


# Each takes one hostile path segment.
POSITIONS: dict[str, Position] = {
    CUSTOM + "/namespaces/" + SHOP + "/pods/{}/hn_requests": Position(_one_of("web-0", "*")),
    CUSTOM + "/namespaces/{}/pods/web-0/hn_requests": Position(_one_of(SHOP), True),
    CUSTOM + "/namespaces/{}/pods/*/hn_requests": Position(_one_of(SHOP), True),
    CUSTOM + "/namespaces/{}/metrics/hn_requests": Position(_one_of()),  # no namespace series
    CUSTOM + "/nodes/{}/hn_requests": Position(_one_of()),  # no node series
    CUSTOM + "/widgets." + GROUP + "/{}/hn_requests": Position(_one_of()),
    CUSTOM + "/namespaces/" + SHOP + "/pods/web-0/{}": Position(_one_of("hn_requests")),
    EXTERNAL + "/namespaces/{}/hn_queue": Position(_one_of(SHOP), True),
    EXTERNAL + "/namespaces/" + SHOP + "/{}": Position(_one_of("hn_queue")),
    # A namespace's pod list answers for any namespace that could exist (empty when none).
    RESOURCE + "/namespaces/{}/pods": Position(_is_label),
    RESOURCE + "/namespaces/" + SHOP + "/pods/{}": Position(_one_of()),  # no resource series
    RESOURCE + "/nodes/{}": Position(_one_of()),
}
PATH_SHAPES = tuple(POSITIONS)
LIST_KINDS = {CUSTOM: "MetricValueList", EXTERNAL: "ExternalMetricValueList",
              RESOURCE: "PodMetricsList"}
# aiohttp's limit on the request line ("GET <target> HTTP/1.1"): past it, its parser's 400.
MAX_LINE = 8190
# Each takes one hostile selector value.
SELECTOR_SHAPES = (
    (CUSTOM + "/namespaces/" + SHOP + "/pods/*/hn_requests", "labelSelector", "app={}"),
    (CUSTOM + "/namespaces/" + SHOP + "/pods/web-0/hn_requests", "metricLabelSelector", "code={}"),
    (CUSTOM + "/namespaces/" + SHOP + "/pods/web-0/hn_requests", "metricLabelSelector",
     "code in ({})"),
    (EXTERNAL + "/namespaces/" + SHOP + "/hn_queue", "labelSelector", "queue={}"),
    (EXTERNAL + "/namespaces/" + SHOP + "/hn_queue", "labelSelector", "queue notin ({})"),
    (RESOURCE + "/namespaces/" + SHOP + "/pods", "labelSelector", "app={}"),
)

HOSTILE = ("\ufffd", "\ud800", "[", ".*", "(?i)web-0", "a\nb", "\x00", "x" * 10_000, "web-0\ufffd",
           "%", "..", "\u0085", "WEB-0", "a b", '"', "\\", "}", "*")


@dataclass
class World:
    adapter: RunningAdapter
    queue_series: list[dict[str, str]]  # the label sets of hn_queue's series


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(cluster: ModuleCluster, prometheus: PrometheusServer,
                exporter_pool: ExporterPool,
                tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    workdir = tmp_path_factory.mktemp("hostile-names")
    with exporter_pool.exporter() as exporter:
        exporter.set("hn_requests", {"namespace": SHOP, "pod": "web-0"}, 1)
        exporter.set("hn_queue", {"namespace": SHOP, "queue": "orders"}, 2)
        cluster.namespace("shop")
        node = node_manifest(NODE_1)
        cluster.cleanup.add(node)
        async with Objects(cluster.control_plane) as objects:
            await objects.create(pod_manifest("web-0", SHOP, labels={"app": "web"}), node)
            cluster.cleanup.add(await objects.crd(group=GROUP, kind="Widget",
                                                  plural="widgets", scope="Cluster"))
        await wait_for_series(prometheus, f'hn_requests{{job="{exporter.job}"}}', 1)
        await wait_for_series(prometheus, f'hn_queue{{job="{exporter.job}"}}', 1)
        queue_series = await asyncio.to_thread(
            prometheus.series, f'{{__name__="hn_queue",namespace="{SHOP}"}}')
        async with running_adapter(
                workdir=workdir / "adapter", config_text=CONFIG.format(job=exporter.job),
                prometheus_url=prometheus.url,
                kubeconfig=cluster.adapter_kubeconfig()) as adapter:
            yield World(adapter, queue_series)


def encode_segment(text: str) -> str:
    """Percent-encode every byte that is not unreserved; lone surrogates as their 3 bytes
    (`%ED%A0%80`), which is not UTF-8."""
    return urllib.parse.quote(text.encode("utf-8", "surrogatepass"), safe="")


def refusal(segment: str) -> str | None:
    """Why the whole path is refused (400) before any route: it could be read two ways (as Go
    decodes it, or as a router that keeps an escape inside its segment). The escapes are
    decoded left to right, an encoded slash refused as it is met; then UTF-8, NUL, dots."""
    if "/" in segment:
        return "encoded slashes are not allowed in the request path"
    try:
        segment.encode("utf-8")
    except UnicodeEncodeError:
        return "the request path is not UTF-8"
    if "\x00" in segment:
        return "NUL is not allowed in the request path"
    if segment in (".", ".."):
        return "dot segments are not allowed in the request path"
    return None


def expected_for_segment(shape: str, segment: str) -> tuple[int, str | None]:
    """The status a hostile `segment` in `shape` must get, and the Status message when the
    message is the point (None: any message of that status's reason)."""
    encoded = shape.format(encode_segment(segment))
    if len(f"GET {encoded} HTTP/1.1") > MAX_LINE:
        return 400, None
    why = refusal(segment)
    if why is not None:
        return 400, why
    position = POSITIONS[shape]
    if segment == "*" and position.all_namespaces:
        return 400, 'namespace "*" is not supported: request one namespace at a time'
    return (200, None) if position.found(segment) else (404, None)


def check_answer(reply: Reply, shape: str, expected: tuple[int, str | None]) -> None:
    status, message = expected
    context = (shape, reply.status, reply.body[:300])
    assert reply.status == status, context
    body = reply.json()
    if status == 200:
        assert body["kind"] == next(kind for api, kind in LIST_KINDS.items()
                                    if shape.startswith(api)), context
        return
    reason = {400: "BadRequest", 404: "NotFound"}[status]
    assert (body["kind"], body["code"], body["reason"]) == ("Status", status, reason), context
    if message is not None:
        assert body["message"] == message, context


async def get_segment(world: World, shape: str, segment: str) -> Reply:
    return await world.adapter.get(shape.format(encode_segment(segment)))


def selector_query(shape: tuple[str, str, str], value: str) -> str:
    path, parameter, template = shape
    query = urllib.parse.urlencode({parameter: template.format(value)}, quote_via=lambda text,
                                   *_: encode_segment(str(text)))
    return f"{path}?{query}"


def expected_for_selector(world: World, shape: tuple[str, str, str],
                          value: str) -> tuple[int, str | None]:
    """A selector that does not parse is a 400 with the parser's message (metricscale's
    labels.Parse, pinned to Go's by its own tests); one that does answers by what it selects:
    web-0's labels for a pod selector, hn_queue's series for an external one. The metric label
    selector of hn_requests' rule is not in its query (no LabelMatchers): any valid one is
    200, and the resource metrics list is empty whatever it selects (no resource series)."""
    target = selector_query(shape, value)
    if len(f"GET {target} HTTP/1.1") > MAX_LINE:
        return 400, None
    path, parameter, template = shape
    # What the server reads: the query's bytes as UTF-8, each byte that is not one replaced.
    text = template.format(value).encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    try:
        selector = parse_selector(text)
    except SelectorError as error:
        return 400, str(error)
    if path.startswith(EXTERNAL):
        matched = any(selector.matches(labels) for labels in world.queue_series)
    elif path.startswith(CUSTOM) and parameter == "labelSelector":
        matched = selector.matches({"app": "web"})
    else:
        matched = True
    return (200, None) if matched else (404, None)


async def get_selector(world: World, shape: tuple[str, str, str], value: str) -> Reply:
    return await world.adapter.get(selector_query(shape, value))


# ------------------------------------------------------------------------------ pinned cases


@pytest.mark.parametrize("shape", PATH_SHAPES)
@pytest.mark.parametrize("segment", ["\ufffd", "[", ".*", "(?i)web-0", "a\nb", "x" * 5_000])
async def test_a_name_no_object_can_carry_is_not_found(world: World, shape: str,
                                                       segment: str) -> None:
    reply = await world.adapter.get(shape.format(encode_segment(segment)))
    if segment in ("[", ".*", "(?i)web-0") and "/namespaces/" + SHOP + "/pods/web-0/{}" in shape:
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
async def test_a_lone_surrogate_in_a_path_is_a_bad_request(world: World, shape: str) -> None:
    reply = await get_segment(world, shape, "\ud800")
    check_answer(reply, shape, (400, "the request path is not UTF-8"))


@pytest.mark.parametrize("shape", SELECTOR_SHAPES)
@pytest.mark.parametrize("value", ["\ufffd", "x" * 10_000, "[", "(?i)web"])
async def test_an_invalid_selector_value_is_a_bad_request(world: World,
                                                          shape: tuple[str, str, str],
                                                          value: str) -> None:
    reply = await get_selector(world, shape, value)
    assert reply.status == 400, (shape, reply.status, reply.body[:300])
    body = reply.json()
    assert (body["kind"], body["code"], body["reason"]) == ("Status", 400, "BadRequest")


async def test_the_valid_names_still_answer(world: World) -> None:
    assert (await world.adapter.get(CUSTOM + "/namespaces/" + SHOP + "/pods/web-0/hn_requests")
            ).status == 200
    assert (await world.adapter.get(EXTERNAL + "/namespaces/" + SHOP + "/hn_queue")).status == 200


# ------------------------------------------------------------------------------ properties

segments = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=40),
                     st.text(alphabet="[](){}.*+?|^$\\\ufffd\n%/ a-", max_size=20))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(shape=st.sampled_from(PATH_SHAPES), segment=segments)
async def test_every_path_segment_gets_the_answer_its_name_calls_for(
        world: World, shape: str, segment: str) -> None:
    if segment == "":
        return  # it changes the path's shape, not a name in it
    reply = await get_segment(world, shape, segment)
    check_answer(reply, shape, expected_for_segment(shape, segment))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(shape=st.sampled_from(SELECTOR_SHAPES), value=segments)
async def test_every_selector_value_gets_the_answer_its_selector_calls_for(
        world: World, shape: tuple[str, str, str], value: str) -> None:
    reply = await get_selector(world, shape, value)
    check_answer(reply, shape[0], expected_for_selector(world, shape, value))


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
