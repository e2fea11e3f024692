"""The Prometheus client against a scripted local backend: wire format, auth, TLS, single-flight."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from adapter.prometheus.answers import _general_result, _typed_result
from adapter.prometheus.client import (
    PrometheusClient,
    PrometheusQueryError,
    PrometheusUnavailable,
    Scalar,
    UnexpectedResultType,
    Vector,
    VectorSample,
    _SeriesReader,
    encode_form,
    format_time,
    parse_query_response,
)
from adapter.settings import PrometheusConfigError, PrometheusSettings, parse_header
from metricscale import pki

# ---------------------------------------------------------------------------------------------
# Pure parts


def ok(result_type: str, result: Any, **extra: Any) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": result_type,
                                                     "result": result}, **extra}).encode()


def test_vector_is_parsed_into_exact_samples() -> None:
    body = ok("vector", [{"metric": {"__name__": "up", "pod": "a"},
                          "value": [1700000000.123, "1.5"]},
                         {"metric": {}, "value": [1700000000, "NaN"]}], warnings=["w"])
    assert parse_query_response(200, body) == Vector(
        samples=(VectorSample({"__name__": "up", "pod": "a"}, Decimal("1700000000.123"), "1.5"),
                 VectorSample({}, Decimal(1700000000), "NaN")),
        warnings=("w",))


@pytest.mark.parametrize("stamp", ["1714564800.1", "1714564800.999", "1714564800.001",
                                   "0.5", "1e-3", "99999999999.999", "1714564800"])
def test_sample_times_are_exactly_the_text_prometheus_wrote(stamp: str) -> None:
    # Read as a float by json, then back to the same digits (Go and Python both write the
    # shortest text that reads back as the same float64).
    body = ('{"status":"success","data":{"resultType":"vector","result":['
            '{"metric":{"pod":"a"},"value":[@,"1"]},{"metric":{"pod":"b"},"value":[@,"2"]}'
            ']}}').replace("@", stamp).encode()
    samples = parse_query_response(200, body).samples  # type: ignore[union-attr]
    assert [s.timestamp for s in samples] == [Decimal(stamp)] * 2


@pytest.mark.parametrize("stamp", ["NaN", "Infinity", "-Infinity", "true", '"1714564800"'])
def test_a_sample_time_that_is_not_a_finite_number_is_a_bad_answer(stamp: str) -> None:
    body = ('{"status":"success","data":{"resultType":"vector","result":['
            '{"metric":{"pod":"a"},"value":[@,"1"]}]}}').replace("@", stamp).encode()
    with pytest.raises(PrometheusQueryError) as caught:
        parse_query_response(200, body)
    assert caught.value.reason == "bad_response"


def test_scalar_is_parsed() -> None:
    assert parse_query_response(200, ok("scalar", [1.5, "+Inf"])) == Scalar(Decimal("1.5"), "+Inf")


@pytest.mark.parametrize("kind", ["matrix", "string"])
def test_matrix_and_string_results_are_a_typed_error(kind: str) -> None:
    with pytest.raises(UnexpectedResultType) as caught:
        parse_query_response(200, ok(kind, []))
    assert kind in str(caught.value)


@pytest.mark.parametrize(("status", "body", "error", "reason"), [
    (400, {"status": "error", "errorType": "bad_data", "error": "parse error at char 3"},
     PrometheusQueryError, "bad_data"),
    (422, {"status": "error", "errorType": "execution", "error": "many-to-many"},
     PrometheusQueryError, "execution"),
    (503, {"status": "error", "errorType": "timeout", "error": "query timed out"},
     PrometheusUnavailable, "timeout"),
    (503, {"status": "error", "errorType": "unavailable", "error": "shutting down"},
     PrometheusUnavailable, "unavailable"),
    (200, {"status": "error", "errorType": "internal", "error": "x"},
     PrometheusUnavailable, "internal"),
    (200, {"status": "error", "errorType": "whatever", "error": "x"},
     PrometheusQueryError, "error"),
])
def test_api_errors_are_typed_by_code_and_error_type(
        status: int, body: dict[str, Any], error: type[Exception], reason: str) -> None:
    with pytest.raises(error) as caught:
        parse_query_response(status, json.dumps(body).encode())
    assert caught.value.reason == reason  # type: ignore[attr-defined]
    assert body["error"] not in str(caught.value)  # backend text stays in .detail
    assert body["error"] in caught.value.detail  # type: ignore[attr-defined]


@pytest.mark.parametrize(("status", "error"), [
    (414, PrometheusQueryError), (404, PrometheusQueryError), (401, PrometheusQueryError),
    (429, PrometheusUnavailable), (500, PrometheusUnavailable), (502, PrometheusUnavailable)])
def test_other_codes_are_errors_with_the_code_and_json_is_not_read(
        status: int, error: type[Exception]) -> None:
    with pytest.raises(error) as caught:
        parse_query_response(status, ok("vector", []))
    assert caught.value.status == status  # type: ignore[attr-defined]


@pytest.mark.parametrize("body", [b"<html>login</html>", b"[]", b'{"status":"success"}',
                                  ok("vector", [{"metric": {"a": 1}, "value": [1, "1"]}]),
                                  ok("vector", [{"metric": {}, "value": [1, 1]}]),
                                  ok("vector", [{"metric": {}, "histogram": [1, {}]}]),
                                  ok("weird", [])])
def test_malformed_success_answers_are_query_errors(body: bytes) -> None:
    with pytest.raises(PrometheusQueryError):
        parse_query_response(200, body)


_SAMPLE_TIMES = st.one_of(st.floats(min_value=0, max_value=2e10, allow_nan=False),
                          st.integers(min_value=0, max_value=2**40))
_LABELS = st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=4)


@given(samples=st.lists(st.tuples(_LABELS, _SAMPLE_TIMES, st.text(max_size=8)), max_size=8),
       scalar=st.tuples(_SAMPLE_TIMES, st.text(max_size=8)),
       warnings=st.one_of(st.none(), st.lists(st.text(max_size=8), max_size=2)))
def test_the_typed_decoder_reads_every_answer_as_the_general_path_does(
        samples: list[tuple[dict[str, str], float, str]], scalar: tuple[float, str],
        warnings: list[str] | None) -> None:
    extra = {} if warnings is None else {"warnings": warnings}
    # Samples of one time (an instant query's), and each with its own.
    for result in ([{"metric": labels, "value": [when, value]}
                    for labels, when, value in samples],
                   [{"metric": labels, "value": [scalar[0], value]}
                    for labels, _, value in samples]):
        body = ok("vector", result, **extra)
        typed, general = _typed_result(body), _general_result(200, body)
        assert isinstance(typed, Vector) and isinstance(general, Vector)
        assert typed == general
        # equal Decimals may differ in their text (1.0 and 1): the text is what is written
        assert [str(s.timestamp) for s in typed.samples] == [
            str(s.timestamp) for s in general.samples]
    body = ok("scalar", list(scalar), **extra)
    typed, general = _typed_result(body), _general_result(200, body)
    assert isinstance(typed, Scalar) and isinstance(general, Scalar)
    assert (typed, str(typed.timestamp)) == (general, str(general.timestamp))


def test_a_sample_without_its_metric_has_no_labels() -> None:
    body = ok("vector", [{"value": [1.5, "1"]}])
    assert parse_query_response(200, body) == _general_result(200, body) == Vector(
        samples=(VectorSample({}, Decimal("1.5"), "1"),))


@pytest.mark.parametrize(("seconds", "expected"), [
    (1700000000.123, "1700000000.123"),
    (1700000000.1239, "1700000000.123"),
    (1700000000, "1700000000.000"),
    (Decimal("1565786045.3234"), "1565786045.323"),
])
def test_evaluation_time_is_sent_with_milliseconds(seconds: float | Decimal,
                                                  expected: str) -> None:
    assert format_time(seconds) == expected


@given(st.lists(st.tuples(st.text(), st.text()), max_size=3))
def test_form_bodies_are_the_bytes_urlencode_makes(params: list[tuple[str, str]]) -> None:
    assert encode_form(params) == urllib.parse.urlencode(params).encode()


@pytest.mark.parametrize(("text", "expected"), [
    ("X-Scope-OrgID=tenant-a", ("X-Scope-OrgID", "tenant-a")),
    ("X-A=b=c", ("X-A", "b=c")),
    ("X-Empty=", ("X-Empty", "")),
])
def test_header_flag_splits_on_the_first_equals(text: str, expected: tuple[str, str]) -> None:
    assert parse_header(text) == expected


# No `=` at all is refused too (upstream sends an empty value): a typo must not go unnoticed.
@pytest.mark.parametrize("text", ["=v", "Bad Name=v", "X-A=a\nb", "X-Empty"])
def test_header_flag_rejects_what_cannot_be_sent(text: str) -> None:
    with pytest.raises(PrometheusConfigError):
        parse_header(text)


@pytest.mark.parametrize("kwargs", [
    {"url": "thanos:9090"},
    {"url": "http://p", "method": "PUT"},
    {"url": "http://p", "timeout": 0},
    {"url": "http://p", "bearer_token_file": "/t", "basic_auth_username": "u",
     "basic_auth_password_file": "/p"},
    {"url": "http://p", "basic_auth_username": "u"},
    {"url": "http://p", "client_cert_file": "/c"},
    {"url": "http://p", "bearer_token_file": "/t", "headers": (("authorization", "x"),)},
])
def test_settings_that_cannot_work_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(PrometheusConfigError):
        PrometheusSettings(**kwargs)


SERIES = [{"__name__": "up", "job": "a"}, {"__name__": "x", "pod": "p\u00e9\u6f22,]}\"{"},
          {"__name__": "y"}]


@given(cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
       spaced=st.booleans())
def test_series_reader_yields_the_same_sets_however_the_body_is_cut(
        cuts: list[int], spaced: bool) -> None:
    payload = {"status": "success", "data": SERIES, "warnings": ["w"]}
    body = json.dumps(payload, indent=1 if spaced else None, ensure_ascii=False).encode()
    reader = _SeriesReader()
    got: list[dict[str, str]] = []
    previous = 0
    for cut in [*sorted({min(c, len(body)) for c in cuts}), len(body)]:
        got += reader.feed(body[previous:cut])
        previous = cut
    got += reader.finish()
    assert got == SERIES


def test_series_reader_reads_other_envelopes_whole() -> None:
    reader = _SeriesReader()
    body = json.dumps({"data": SERIES, "status": "success"}).encode()
    assert reader.feed(body) == []
    assert reader.finish() == SERIES


def test_series_reader_refuses_a_label_value_that_is_not_a_string() -> None:
    reader = _SeriesReader()
    with pytest.raises(PrometheusQueryError) as caught:
        reader.feed(b'{"status":"success","data":[{"a":"b"},{"a":1},{"c":"d"}]}')
    assert caught.value.reason == "bad_response"


def test_series_reader_refuses_a_truncated_answer() -> None:
    reader = _SeriesReader()
    reader.feed(b'{"status":"success","data":[{"a":"b"},')
    with pytest.raises(PrometheusQueryError):
        reader.finish()


# ---------------------------------------------------------------------------------------------
# A scripted backend


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    form: dict[str, list[str]]
    headers: dict[str, list[str]]


Handler = Callable[[web.Request, "Backend"], Awaitable[web.StreamResponse]]


async def vector_of_query(request: web.Request, backend: Backend) -> web.StreamResponse:
    params = backend.seen[-1].form or backend.seen[-1].query
    return web.Response(body=ok("vector", [{"metric": {"q": params["query"][0]},
                                            "value": [float(params["time"][0]), "1"]}]),
                        content_type="application/json")


@dataclass
class Backend:
    url: str = ""
    seen: list[Seen] = field(default_factory=list)
    handler: Handler = vector_of_query
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def received(self, count: int) -> None:
        """Wait until `count` requests have arrived (the handler sets `arrived` on each)."""
        async with asyncio.timeout(10):
            while len(self.seen) < count:
                self.arrived.clear()
                await self.arrived.wait()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        form: dict[str, list[str]] = {}
        if request.method == "POST":
            for k, v in (await request.post()).items():
                form.setdefault(k, []).append(str(v))
        query: dict[str, list[str]] = {}
        for k, v in request.query.items():
            query.setdefault(k, []).append(v)
        headers: dict[str, list[str]] = {}
        for k, v in request.headers.items():
            headers.setdefault(k.lower(), []).append(v)
        self.seen.append(Seen(request.method, request.path, query, form, headers))
        self.arrived.set()
        return await self.handler(request, self)


async def serve(aiohttp_server: Any, backend: Backend, *, ssl_context: ssl.SSLContext | None = None,
                prefix: str = "") -> Backend:
    app = web.Application()
    app.router.add_route("*", prefix + "/api/v1/{endpoint}", backend.handle)
    server = await aiohttp_server(app, ssl=ssl_context)
    scheme = "https" if ssl_context else "http"
    backend.url = f"{scheme}://127.0.0.1:{server.port}{prefix}"
    return backend


@contextlib.asynccontextmanager
async def client_for(settings: PrometheusSettings,
                     registry: CollectorRegistry | None = None) -> AsyncIterator[PrometheusClient]:
    async with PrometheusClient(settings, registry=registry or CollectorRegistry()) as client:
        yield client


@pytest.fixture
async def backend(aiohttp_server: Any) -> Backend:
    return await serve(aiohttp_server, Backend(), prefix="/prom")


async def test_query_posts_a_form_under_the_url_prefix_with_the_evaluation_time(
        backend: Backend) -> None:
    async with client_for(PrometheusSettings(url=backend.url + "/")) as client:
        result = await client.query('up{pod=~"a|b"}', at=1700000000.9)
    (seen,) = backend.seen
    assert (seen.method, seen.path) == ("POST", "/prom/api/v1/query")
    assert seen.form == {"query": ['up{pod=~"a|b"}'], "time": ["1700000000.900"]}
    assert seen.query == {}
    assert isinstance(result, Vector) and result.samples[0].labels == {"q": 'up{pod=~"a|b"}'}


async def test_query_by_get_puts_parameters_in_the_url(backend: Backend) -> None:
    settings = PrometheusSettings(url=backend.url, method="GET")
    async with client_for(settings) as client:
        await client.query("sum(x)", at=1700000000.5)
    (seen,) = backend.seen
    assert seen.method == "GET"
    assert seen.query == {"query": ["sum(x)"], "time": ["1700000000.500"]}


async def test_extra_headers_repeat_and_reach_the_backend(backend: Backend) -> None:
    settings = PrometheusSettings(url=backend.url, headers=(
        ("X-Scope-OrgID", "tenant-a"), ("X-Extra", "1"), ("X-Extra", "2")))
    async with client_for(settings) as client:
        await client.query("up", at=1)
    headers = backend.seen[0].headers
    assert headers["x-scope-orgid"] == ["tenant-a"]
    assert headers["x-extra"] == ["1", "2"]
    assert "authorization" not in headers


async def gzipped_vector(request: web.Request, backend: Backend) -> web.StreamResponse:
    """Compresses when the client accepts gzip, as Prometheus' API does."""
    response = await vector_of_query(request, backend)
    assert isinstance(response, web.Response)
    if "gzip" in request.headers.get("Accept-Encoding", ""):
        response.enable_compression(web.ContentCoding.gzip)
    return response


@pytest.mark.parametrize(("settings", "sent"), [
    ({}, ["identity"]),
    ({"accept_encoding": "gzip"}, ["gzip"]),
    ({"headers": (("Accept-Encoding", "br"),)}, ["br"]),
])
async def test_answers_are_asked_uncompressed_unless_gzip_is_chosen(
        backend: Backend, settings: dict[str, Any], sent: list[str]) -> None:
    backend.handler = gzipped_vector
    async with client_for(PrometheusSettings(url=backend.url, **settings)) as client:
        result = await client.query("up", at=1)
    assert backend.seen[0].headers["accept-encoding"] == sent
    assert isinstance(result, Vector) and result.samples[0].labels == {"q": "up"}


async def test_bearer_token_file_is_reread_when_it_changes(backend: Backend,
                                                           tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    settings = PrometheusSettings(url=backend.url, bearer_token_file=str(token))
    async with client_for(settings) as client:
        await client.query("up", at=1)
        # A rotation as kubelet does it: a new file renamed over the old one.
        fresh = tmp_path / "token.new"
        fresh.write_text("second-longer")
        os.replace(fresh, token)
        await client.query("up", at=2)
        token.unlink()  # gone mid-rotation: the last token stays in use
        await client.query("up", at=3)
    assert [s.headers["authorization"] for s in backend.seen] == [
        ["Bearer first"], ["Bearer second-longer"], ["Bearer second-longer"]]


async def test_unreadable_token_file_is_unavailable_without_naming_the_token(
        backend: Backend, tmp_path: Path) -> None:
    settings = PrometheusSettings(url=backend.url, bearer_token_file=str(tmp_path / "missing"))
    async with client_for(settings) as client:
        with pytest.raises(PrometheusUnavailable) as caught:
            await client.query("up", at=1)
    assert caught.value.reason == "credentials"
    assert backend.seen == []


async def test_basic_auth_sends_the_password_file(backend: Backend, tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("s3cret\r\n")
    settings = PrometheusSettings(url=backend.url, basic_auth_username="alice",
                                  basic_auth_password_file=str(password))
    async with client_for(settings) as client:
        await client.query("up", at=1)
    assert backend.seen[0].headers["authorization"] == ["Basic YWxpY2U6czNjcmV0"]


# ---------------------------------------------------------------------------------------------
# Proxies from the environment: decided once, at start (which proxy is chosen is tested once,
# in tests/metricscale/test_proxies.py)


@pytest.fixture
def clean_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("http_proxy", "https_proxy", "no_proxy", "all_proxy", "REQUEST_METHOD"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    return monkeypatch


async def test_queries_go_through_the_proxy_named_in_the_environment(
        aiohttp_server: Any, backend: Backend,
        clean_proxy_environment: pytest.MonkeyPatch) -> None:
    proxied: list[tuple[str, str | None]] = []

    async def forward_proxy(request: web.Request) -> web.StreamResponse:
        # A forward proxy sees the absolute URL; this one answers itself.
        proxied.append((str(request.url), request.headers.get("Proxy-Authorization")))
        return web.Response(body=ok("vector", []), content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward_proxy)
    proxy = await aiohttp_server(app)
    clean_proxy_environment.setenv("HTTP_PROXY", f"http://bob:pw@127.0.0.1:{proxy.port}")
    async with client_for(PrometheusSettings(url=backend.url)) as client:
        assert await client.query("up", at=1) == Vector(samples=())
        assert await client.query("up", at=5) == Vector(samples=())
    assert [url for url, _ in proxied] == [backend.url + "/api/v1/query"] * 2
    assert {auth for _, auth in proxied} == {"Basic Ym9iOnB3"}
    assert backend.seen == []


async def test_no_proxy_sends_queries_straight_to_the_backend(
        backend: Backend, clean_proxy_environment: pytest.MonkeyPatch) -> None:
    clean_proxy_environment.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens
    clean_proxy_environment.setenv("NO_PROXY", "localhost,127.0.0.1")
    async with client_for(PrometheusSettings(url=backend.url)) as client:
        await client.query("up", at=1)
    assert len(backend.seen) == 1


async def test_identical_queries_in_flight_share_one_backend_request(backend: Backend) -> None:
    async def slow(request: web.Request, b: Backend) -> web.StreamResponse:
        await b.gate.wait()
        return await vector_of_query(request, b)

    backend.handler = slow
    registry = CollectorRegistry()
    async with client_for(PrometheusSettings(url=backend.url), registry) as client:
        same = [asyncio.create_task(client.query("up", at=10 + i / 5)) for i in range(5)]
        other = asyncio.create_task(client.query("up", at=11.5))
        await backend.received(2)
        backend.gate.set()
        results = await asyncio.gather(*same)
        await other
    assert len(backend.seen) == 2
    assert all(r == results[0] for r in results)  # all answered at the first caller's time
    assert [s.form["time"] for s in backend.seen] == [["10.000"], ["11.500"]]
    assert registry.get_sample_value("metricscale_prometheus_requests_shared_total",
                                     {"backend": "default", "endpoint": "query"}) == 4


async def test_a_cancelled_waiter_does_not_cancel_the_shared_request(backend: Backend) -> None:
    async def slow(request: web.Request, b: Backend) -> web.StreamResponse:
        await b.gate.wait()
        return await vector_of_query(request, b)

    backend.handler = slow
    async with client_for(PrometheusSettings(url=backend.url)) as client:
        first = asyncio.create_task(client.query("up", at=1))
        second = asyncio.create_task(client.query("up", at=1))
        await backend.received(1)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        backend.gate.set()
        result = await second
    assert isinstance(result, Vector)
    assert len(backend.seen) == 1


async def test_waiters_share_the_error_too(backend: Backend) -> None:
    async def failing(request: web.Request, b: Backend) -> web.StreamResponse:
        await b.gate.wait()
        return web.json_response({"status": "error", "errorType": "bad_data", "error": "x"},
                                 status=400)

    backend.handler = failing
    registry = CollectorRegistry()
    async with client_for(PrometheusSettings(url=backend.url), registry) as client:
        waiters = [asyncio.create_task(client.query("up{", at=1)) for _ in range(3)]
        await backend.received(1)
        backend.gate.set()
        outcomes = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(o, PrometheusQueryError) and o.reason == "bad_data" for o in outcomes)
    assert registry.get_sample_value("metricscale_prometheus_request_errors_total",
                                     {"backend": "default", "endpoint": "query",
                                      "reason": "bad_data"}) == 1


# ---------------------------------------------------------------------------------------------
# The optional result cache


async def test_without_a_cache_ttl_every_query_reaches_the_backend(backend: Backend) -> None:
    async with client_for(PrometheusSettings(url=backend.url)) as client:
        await client.query("up", at=100)
        await client.query("up", at=100)
    assert len(backend.seen) == 2


async def test_a_cached_answer_serves_the_same_promql_within_the_ttl_only(
        backend: Backend) -> None:
    registry = CollectorRegistry()
    settings = PrometheusSettings(url=backend.url, cache_ttl=5.0)
    async with client_for(settings, registry) as client:
        first = await client.query("up", at=100)
        again = await client.query("up", at=105)  # 5 s later: still fresh
        other = await client.query("sum(up)", at=105)  # another query is not served
        later = await client.query("up", at=105.001)  # just past the TTL: asked again
    assert again is first and other != first and later is not first
    assert [(s.form["query"], s.form["time"]) for s in backend.seen] == [
        (["up"], ["100.000"]), (["sum(up)"], ["105.000"]), (["up"], ["105.001"])]
    assert registry.get_sample_value("metricscale_prometheus_cache_hits_total",
                                     {"backend": "default", "endpoint": "query"}) == 1


async def test_errors_are_never_cached(backend: Backend) -> None:
    answers = iter([web.json_response({"status": "error", "errorType": "timeout",
                                       "error": "x"}, status=503)])

    async def fail_once(request: web.Request, b: Backend) -> web.StreamResponse:
        return next(answers, None) or await vector_of_query(request, b)

    backend.handler = fail_once
    async with client_for(PrometheusSettings(url=backend.url, cache_ttl=60.0)) as client:
        with pytest.raises(PrometheusUnavailable):
            await client.query("up", at=1)
        assert isinstance(await client.query("up", at=2), Vector)
        await client.query("up", at=3)
    assert len(backend.seen) == 2


async def test_the_cache_forgets_answers_older_than_the_ttl(backend: Backend) -> None:
    async with client_for(PrometheusSettings(url=backend.url, cache_ttl=1.0)) as client:
        for index in range(50):
            await client.query(f"q{index}", at=index)
        kept = list(client._cache)  # memory: only answers that could still be served
    assert kept == ["q48", "q49"]


async def test_a_slow_backend_hits_the_query_timeout(backend: Backend) -> None:
    async def hang(request: web.Request, b: Backend) -> web.StreamResponse:
        await b.gate.wait()
        return web.Response()

    backend.handler = hang
    registry = CollectorRegistry()
    async with client_for(PrometheusSettings(url=backend.url, timeout=0.1), registry) as client:
        with pytest.raises(PrometheusUnavailable) as caught:
            await client.query("up", at=1)
    backend.gate.set()
    assert caught.value.reason == "timeout"
    assert registry.get_sample_value("metricscale_prometheus_request_errors_total",
                                     {"backend": "default", "endpoint": "query",
                                      "reason": "timeout"}) == 1
    assert registry.get_sample_value("metricscale_prometheus_request_duration_seconds_count",
                                     {"backend": "default", "endpoint": "query"}) == 1


async def test_nothing_listening_is_unavailable() -> None:
    with contextlib.closing(__import__("socket").socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with client_for(PrometheusSettings(url=f"http://127.0.0.1:{port}")) as client:
        with pytest.raises(PrometheusUnavailable) as caught:
            await client.query("up", at=1)
    assert caught.value.reason == "connection"


async def test_an_html_error_page_is_an_error_with_its_code(backend: Backend) -> None:
    async def proxy_page(request: web.Request, b: Backend) -> web.StreamResponse:
        return web.Response(status=502, text="<html>bad gateway</html>", content_type="text/html")

    backend.handler = proxy_page
    async with client_for(PrometheusSettings(url=backend.url)) as client:
        with pytest.raises(PrometheusUnavailable) as caught:
            await client.query("up", at=1)
    assert caught.value.status == 502 and "bad gateway" not in str(caught.value)


async def test_series_streams_label_sets_and_sends_start_with_milliseconds(
        backend: Backend) -> None:
    many = [{"__name__": f"m{i}", "pod": f"p{i}"} for i in range(3000)]

    async def series(request: web.Request, b: Backend) -> web.StreamResponse:
        return web.json_response({"status": "success", "data": many})

    backend.handler = series
    async with client_for(PrometheusSettings(url=backend.url)) as client:
        got = [labels async for labels in client.series(['{__name__=~"m.*"}', "up"],
                                                          start=1565786045.3234)]
    assert got == many
    (seen,) = backend.seen
    assert seen.path == "/prom/api/v1/series"
    assert seen.form == {"match[]": ['{__name__=~"m.*"}', "up"], "start": ["1565786045.323"]}


async def test_series_error_is_typed(backend: Backend) -> None:
    async def bad(request: web.Request, b: Backend) -> web.StreamResponse:
        return web.json_response({"status": "error", "errorType": "bad_data", "error": "x"},
                                 status=400)

    backend.handler = bad
    async with client_for(PrometheusSettings(url=backend.url)) as client:
        with pytest.raises(PrometheusQueryError):
            async for _ in client.series(["{"], start=0):
                pass


async def test_null_series_data_fails_the_pass(backend: Backend) -> None:
    async def null(request: web.Request, b: Backend) -> web.StreamResponse:
        return web.json_response({"status": "success", "data": None})

    backend.handler = null
    async with client_for(PrometheusSettings(url=backend.url)) as client:
        with pytest.raises(PrometheusQueryError):
            async for _ in client.series(["up"], start=0):
                pass


# ---------------------------------------------------------------------------------------------
# TLS: CA file, client certificate, insecure skip verify


@dataclass
class TLSFiles:
    ca: Path
    cert: Path
    key: Path
    server: ssl.SSLContext


@pytest.fixture
def tls_files(tmp_path: Path) -> TLSFiles:
    now = datetime.now(UTC)
    ca = pki.generate_ca(common_name="test-ca", now=now, validity=timedelta(days=1))
    serving = pki.issue_serving_certificate(ca, common_name="prometheus",
                                            ip_addresses=["127.0.0.1"], now=now,
                                            validity=timedelta(days=1))
    client = pki.issue_client_certificate(ca, user="adapter", now=now, validity=timedelta(days=1))
    pki.write_certificate(tmp_path / "ca.crt", ca.certificate)
    pki.write_certificate(tmp_path / "server.crt", serving.certificate)
    pki.write_private_key(tmp_path / "server.key", serving.private_key)
    pki.write_certificate(tmp_path / "client.crt", client.certificate)
    pki.write_private_key(tmp_path / "client.key", client.private_key)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tmp_path / "ca.crt"))
    server.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    server.verify_mode = ssl.CERT_REQUIRED
    return TLSFiles(tmp_path / "ca.crt", tmp_path / "client.crt", tmp_path / "client.key", server)


async def test_tls_with_ca_file_and_client_certificate(aiohttp_server: Any,
                                                       tls_files: TLSFiles) -> None:
    backend = await serve(aiohttp_server, Backend(), ssl_context=tls_files.server)
    settings = PrometheusSettings(url=backend.url, ca_file=str(tls_files.ca),
                                  client_cert_file=str(tls_files.cert),
                                  client_key_file=str(tls_files.key))
    async with client_for(settings) as client:
        assert isinstance(await client.query("up", at=1), Vector)


async def test_tls_without_the_ca_fails_unless_verification_is_skipped(
        aiohttp_server: Any, tls_files: TLSFiles) -> None:
    backend = await serve(aiohttp_server, Backend(), ssl_context=tls_files.server)
    common = {"url": backend.url, "client_cert_file": str(tls_files.cert),
              "client_key_file": str(tls_files.key)}
    async with client_for(PrometheusSettings(**common)) as client:
        with pytest.raises(PrometheusUnavailable):
            await client.query("up", at=1)
    async with client_for(PrometheusSettings(**common, insecure_skip_verify=True)) as client:
        assert isinstance(await client.query("up", at=1), Vector)


async def test_unreadable_tls_files_are_a_config_error(tmp_path: Path) -> None:
    client = PrometheusClient(PrometheusSettings(url="https://127.0.0.1:1",
                                                 ca_file=str(tmp_path / "nope")))
    with pytest.raises(PrometheusConfigError):
        await client.start()
    await client.close()


def test_metrics_go_to_the_registry_passed_in() -> None:
    registry = CollectorRegistry()
    PrometheusClient(PrometheusSettings(url="http://p"), registry=registry)
    names = {m.name for m in registry.collect()}
    assert "metricscale_prometheus_request_duration_seconds" in names
    with pytest.raises(ValueError):  # one client per registry
        PrometheusClient(PrometheusSettings(url="http://p"), registry=registry)
