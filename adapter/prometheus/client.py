"""The async Prometheus HTTP API client: one keep-alive session, auth, single-flight, metrics.

Works with anything that speaks Prometheus' `/api/v1` (Thanos, Mimir/Cortex, VictoriaMetrics):
the base URL's path is kept as a prefix, so `http://thanos:9090/prom` queries
`http://thanos:9090/prom/api/v1/query`.

Decisions worth knowing (the README's differences section quotes them):

* Queries go by POST (form body) unless GET is chosen, so a 2,000-pod regex never meets a URL
  length limit (prometheus-adapter defaults to GET).
* `Accept-Encoding: identity` unless the backend is set to gzip: Prometheus gzips what a
  client accepts, and on loopback or a cluster network compressing and inflating a 10 kB
  answer costs both ends more CPU than the bytes saved (prometheus-adapter's Go client asks
  for gzip). A `--prometheus-header Accept-Encoding=...` wins over the setting.
* Single-flight: identical instant queries in flight at the same time share one backend request.
  A query joins a request already in flight for the same PromQL when their evaluation times
  are at most `coalesce_window` (1 s by default) apart; it then gets the answer evaluated at
  the first caller's time, exactly as sent (milliseconds). Every waiter gets the same result
  or the same error. Times are never rounded: rounding down would hide samples scraped in the
  last second, rounding up would stamp answers in the future. A waiter that is cancelled
  leaves the shared request running for the others.
* Result cache (off by default: `cache_ttl` 0): with a TTL, a successful answer is reused for
  the same PromQL asked at most `cache_ttl` seconds (by the callers' evaluation times) from
  the time it was evaluated at, e.g. several HPAs, or both adapter replicas' callers, reading
  one metric within a scrape interval. The answer keeps its own evaluation time (item
  timestamps say how old it is). Errors are never cached; at most 4,096 entries are kept.
* Bearer token file: re-read when its inode, size or mtime changes (a rotated projected token);
  one trailing line break (LF or CRLF) is removed, because editors and `echo` add one and an
  HTTP header cannot carry it. prometheus-adapter sends the contents verbatim, so a token file
  ending in a newline breaks it. A file that vanishes mid-rotation keeps the last token in use.
* Response codes: 2xx, 400, 422 and 503 are read as Prometheus JSON (as upstream does);
  anything else is an error carrying the code.
* Error messages (`str(exc)`) are safe to show; what the backend said is in `exc.detail`, for logs.
* Proxies: `HTTP_PROXY`/`HTTPS_PROXY`/`NO_PROXY` (either case) apply as with aiohttp's
  `trust_env` (and, for these variables, prometheus-adapter's Go client), but are read once at
  start for the one configured URL (`proxy_for`), not twice per request in worker threads
  (~0.5 ms a query). Credentials in the proxy URL go in `Proxy-Authorization`; an `https://`
  proxy is not supported by aiohttp and is ignored with a warning, as `trust_env` did; `.netrc`
  is not read (prometheus-adapter never read it either).
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import contextlib
import json
import logging
import os
import re
import ssl
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

import aiohttp
import msgspec
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry, Counter, Histogram
from yarl import URL

from adapter.prometheus.answers import (
    _FORM_CONTENT_TYPE,
    PrometheusError,
    PrometheusQueryError,
    PrometheusUnavailable,
    QueryResult,
    Scalar,
    UnexpectedResultType,
    Vector,
    VectorSample,
    _bad_response,
    _labels,
    _read_api_json,
    encode_form,
    format_time,
    parse_query_response,
)
from adapter.settings import PrometheusConfigError, PrometheusSettings
from metricscale.core.proxies import proxy_for
from metricscale.tasks import Flight, SingleFlight

__all__ = [
    "PrometheusClient",
    "PrometheusError",
    "PrometheusMetrics",
    "PrometheusQueryError",
    "PrometheusUnavailable",
    "QueryResult",
    "Scalar",
    "UnexpectedResultType",
    "Vector",
    "VectorSample",
    "encode_form",
    "format_time",
    "parse_query_response",
]

logger = logging.getLogger(__name__)

_SERIES_CHUNK = 1 << 16
_SERIES_PREFIX = re.compile(rb'^\s*\{\s*"status"\s*:\s*"success"\s*,\s*"data"\s*:\s*\[')


# ---------------------------------------------------------------------------------------------
# Credentials read from files


class _SecretFile:
    """A credential file re-read when it changes; its contents are never logged."""

    def __init__(self, path: str, what: str) -> None:
        self._path = path
        self._what = what
        self._stamp: tuple[int, int, int] | None = None
        self._value: str | None = None

    def read(self) -> str:
        try:
            st = os.stat(self._path)
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
            if stamp != self._stamp:
                with open(self._path, encoding="utf-8") as f:
                    text = f.read()
                text = text.removesuffix("\n").removesuffix("\r")
                if not text or "\n" in text or "\r" in text:
                    raise ValueError("empty, or more than one line")
                self._value, self._stamp = text, stamp
                logger.info("read the Prometheus %s from %s", self._what, self._path)
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            if self._value is None:
                raise PrometheusUnavailable(
                    f"the Prometheus {self._what} cannot be read", reason="credentials",
                    detail=f"{self._path}: {type(exc).__name__}") from None
            logger.warning("cannot re-read the Prometheus %s from %s (%s); keeping the last one",
                           self._what, self._path, type(exc).__name__)
        assert self._value is not None
        return self._value


# ---------------------------------------------------------------------------------------------
# Metrics


@dataclass(frozen=True)
class PrometheusMetrics:
    """The `metricscale_prometheus_*` series, shared by every backend's client (`backend` label)."""

    duration: Histogram
    errors: Counter
    shared: Counter
    cached: Counter

    @classmethod
    def register(cls, registry: CollectorRegistry) -> PrometheusMetrics:
        return cls(
            duration=Histogram(
                "metricscale_prometheus_request_duration_seconds",
                "Time of requests to Prometheus (failures included), by API endpoint.",
                ["backend", "endpoint"], registry=registry,
                buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)),
            errors=Counter(
                "metricscale_prometheus_request_errors_total",
                "Failed requests to Prometheus, by API endpoint and reason.",
                ["backend", "endpoint", "reason"], registry=registry),
            shared=Counter(
                "metricscale_prometheus_requests_shared_total",
                "Queries answered by joining an identical request already in flight.",
                ["backend", "endpoint"], registry=registry),
            cached=Counter(
                "metricscale_prometheus_cache_hits_total",
                "Queries answered from the result cache (--prometheus-cache-ttl).",
                ["backend", "endpoint"], registry=registry),
        )


# The old private name, still imported by tests/monitoring (owned elsewhere).
_Metrics = PrometheusMetrics


# ---------------------------------------------------------------------------------------------
# The client


@dataclass(frozen=True)
class _Cached:
    at: Decimal  # the evaluation time the answer was asked for
    result: QueryResult


_CACHE_LIMIT = 4096


class PrometheusClient:
    """One aiohttp session to one Prometheus-compatible backend.

    Use `async with PrometheusClient(settings, registry=r) as client:` (or `start()`/`close()`)
    inside the running loop. A client registers its metrics on `registry`; several clients (one
    per backend and tenant) share one `PrometheusMetrics` instead, told apart by `backend`.
    """

    def __init__(self, settings: PrometheusSettings, *,
                 registry: CollectorRegistry | None = None,
                 metrics: PrometheusMetrics | None = None,
                 backend: str = "default") -> None:
        self.settings = settings
        self.backend = backend
        self._base = URL(settings.url)
        self._prefix = self._base.path.rstrip("/")
        self._urls = {endpoint: self._base.with_path(f"{self._prefix}/api/v1/{endpoint}")
                      for endpoint in ("query", "series")}
        self._proxy_options: dict[str, Any] = {}
        self._headers: CIMultiDict[str] = CIMultiDict(settings.headers)
        self._token = (_SecretFile(settings.bearer_token_file, "bearer token")
                       if settings.bearer_token_file else None)
        self._password = (_SecretFile(settings.basic_auth_password_file, "basic auth password")
                          if settings.basic_auth_password_file else None)
        if metrics is None:
            metrics = PrometheusMetrics.register(registry or CollectorRegistry(auto_describe=True))
        self._metrics = metrics
        # The per-request series' children, looked up on first use and kept (a labels() call
        # costs a lock, a tuple and a dict lookup on every request).
        self._query_duration: Any = None
        self._query_shared: Any = None
        self._session: aiohttp.ClientSession | None = None
        # Identical queries in the air, by PromQL, tagged with their evaluation time.
        self._flights: SingleFlight[str, QueryResult] = SingleFlight(landed=self._landed)
        self._window = Decimal(repr(settings.coalesce_window))
        self._cache_ttl = Decimal(repr(settings.cache_ttl))
        self._cache: dict[str, _Cached] = {}  # by PromQL, oldest evaluation time first
        self.backend_requests = 0

    # -- lifecycle -----------------------------------------------------------------------

    def _ssl_context(self) -> ssl.SSLContext | None:
        s = self.settings
        if self._base.scheme != "https":
            return None
        # Each error names its file (and the backend): "the TLS files" told nobody which.
        where = f"Prometheus backend {self.backend}"
        try:
            context = ssl.create_default_context(cafile=s.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise PrometheusConfigError(
                f"{where}: cannot load the CA file {s.ca_file}: {type(exc).__name__}: "
                f"{exc}") from None
        try:
            if s.client_cert_file:
                context.load_cert_chain(s.client_cert_file, keyfile=s.client_key_file)
        except (OSError, ssl.SSLError) as exc:
            raise PrometheusConfigError(
                f"{where}: cannot load the client certificate {s.client_cert_file} and key "
                f"{s.client_key_file}: {type(exc).__name__}: {exc}") from None
        if s.insecure_skip_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    async def start(self) -> None:
        """Open the session (must run inside the event loop)."""
        if self._session is not None:
            return
        context = self._ssl_context()
        # HTTP(S)_PROXY/NO_PROXY apply, as they do to prometheus-adapter's Go client; read once
        # here rather than through trust_env, which asks two worker threads on every request.
        proxy = proxy_for(self._base, urllib.request.getproxies())
        self._proxy_options = {}
        self._headers = CIMultiDict(self.settings.headers)
        # Set, aiohttp sends no Accept-Encoding of its own (it would ask for gzip and deflate).
        self._headers.setdefault("Accept-Encoding", self.settings.accept_encoding)
        if proxy.ignored:
            logger.warning("not using the proxy set in the environment for %s: %s",
                           self._base.origin(), proxy.ignored)
        elif proxy.url is not None:
            logger.info("Prometheus requests go through the proxy %s", proxy.url)
            self._proxy_options["proxy"] = proxy.url
            # Proxy-Authorization goes on the CONNECT for https, on each request for http.
            if proxy.headers and self._base.scheme == "https":
                self._proxy_options["proxy_headers"] = dict(proxy.headers)
            elif proxy.headers:
                self._headers.extend(proxy.headers)
        if self.settings.method == "POST":
            self._headers["Content-Type"] = _FORM_CONTENT_TYPE  # the body is encode_form's
        connector = aiohttp.TCPConnector(limit=self.settings.max_connections,
                                         ssl=context if context is not None else True)
        self._session = aiohttp.ClientSession(
            connector=connector, trust_env=False, auto_decompress=True,
            timeout=aiohttp.ClientTimeout(total=self.settings.timeout))

    async def close(self) -> None:
        """Cancel shared requests still in flight and close the session."""
        self._cache = {}
        await self._flights.close()
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def __aenter__(self) -> PrometheusClient:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- API -------------------------------------------------------------------------------

    async def query(self, promql: str, *, at: float | Decimal) -> QueryResult:
        """Instant query evaluated at Unix time `at` (sent with milliseconds).

        Answers from the cache when enabled and fresh; else joins an identical query already in
        flight whose time is within `coalesce_window`; raises PrometheusUnavailable,
        PrometheusQueryError or UnexpectedResultType.
        """
        when = Decimal(format_time(at))
        if self._cache_ttl:
            cached = self._cache.get(promql)
            if cached is not None and abs(when - cached.at) <= self._cache_ttl:
                self._metrics.cached.labels(self.backend, "query").inc()
                return cached.result
        window = self._window
        flight, joined = self._flights.join(
            promql, lambda: self._query_now(promql, str(when)), tag=when,
            joins=lambda at: bool(abs(at - when) <= window))
        if joined:
            if self._query_shared is None:
                self._query_shared = self._metrics.shared.labels(self.backend, "query")
            self._query_shared.inc()
        # shield: one caller giving up must not cancel the request the others wait for.
        return await asyncio.shield(flight.task)

    def _landed(self, promql: str, flight: Flight[QueryResult]) -> None:
        if flight.task.exception() is None and self._cache_ttl:
            self._remember(promql, _Cached(flight.tag, flight.task.result()))

    def _remember(self, promql: str, entry: _Cached) -> None:
        cache = self._cache
        current = cache.get(promql)
        if current is not None and current.at > entry.at:
            return  # a later answer is already kept
        cache.pop(promql, None)
        cache[promql] = entry  # insertion order follows evaluation time, near enough
        horizon = entry.at - self._cache_ttl
        while cache:
            oldest = next(iter(cache))
            if cache[oldest].at >= horizon and len(cache) <= _CACHE_LIMIT:
                break
            del cache[oldest]

    async def _query_now(self, promql: str, time_param: str) -> QueryResult:
        status, body = await self._request(
            "query", [("query", promql), ("time", time_param)])
        return parse_query_response(status, body)

    async def series(self, matches: Sequence[str], *, start: float | Decimal,
                     end: float | Decimal | None = None,
                     request_timeout: float | None = None) -> AsyncIterator[dict[str, str]]:
        """/api/v1/series: yields each matching series' label set as it is read.

        Streaming keeps memory proportional to what the caller keeps, not to the answer (a
        discovery pass over 10^6 series). `start`/`end` are Unix seconds, sent with milliseconds.
        Iterate it fully or close it (`aclose`), e.g. with `contextlib.aclosing`.
        """
        params = [("match[]", m) for m in matches]
        params.append(("start", format_time(start)))
        if end is not None:
            params.append(("end", format_time(end)))
        async with self._open("series", params, request_timeout=request_timeout) as response:
            if not 200 <= response.status < 300:
                body = await self._read(response, "series")
                try:
                    _read_api_json(response.status, body)  # raises for every non-2xx code
                except PrometheusError as exc:
                    logger.warning("Prometheus series answered %s: %s", response.status,
                                   exc.detail)
                    raise self._count(exc, "series") from None
            reader = _SeriesReader()
            try:
                async for chunk in response.content.iter_chunked(_SERIES_CHUNK):
                    for labels in reader.feed(chunk):
                        yield labels
                for labels in reader.finish():
                    yield labels
            except PrometheusError as exc:
                raise self._count(exc, "series") from None
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise self._count(_transport_error(exc), "series") from None

    # -- transport ---------------------------------------------------------------------------

    def _count(self, exc: PrometheusError, endpoint: str) -> PrometheusError:
        self._metrics.errors.labels(self.backend, endpoint, exc.reason).inc()
        return exc

    def _request_headers(self) -> CIMultiDict[str]:
        if self._token is None and self._password is None:
            return self._headers  # aiohttp copies what it is given; nothing to add
        headers = CIMultiDict(self._headers)
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token.read()}"
        if self._password is not None and self.settings.basic_auth_username:
            pair = f"{self.settings.basic_auth_username}:{self._password.read()}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
        return headers

    @contextlib.asynccontextmanager
    async def _open(self, endpoint: str, params: list[tuple[str, str]], *,
                    request_timeout: float | None = None,
                    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """Send one request; the response is open inside the block. Errors are typed."""
        session = self._session
        if session is None:
            raise RuntimeError("PrometheusClient used before start() or after close()")
        try:
            headers = self._request_headers()
        except PrometheusError as exc:
            raise self._count(exc, endpoint) from None
        url = self._urls[endpoint]
        kwargs: dict[str, Any] = {**self._proxy_options, "headers": headers}
        if request_timeout is not None:
            kwargs["timeout"] = aiohttp.ClientTimeout(total=request_timeout)
        if self.settings.method == "POST":
            kwargs["data"] = encode_form(params)
            method = "POST"
        else:
            url = url.extend_query(params)
            method = "GET"
        self.backend_requests += 1
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with session.request(method, url, **kwargs) as response:
                yield response
        except PrometheusError:
            raise
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = _transport_error(exc)
            logger.warning("Prometheus %s request failed: %s", endpoint, error.detail)
            raise self._count(error, endpoint) from None
        finally:
            duration = self._query_duration if endpoint == "query" else None
            if duration is None:
                duration = self._metrics.duration.labels(self.backend, endpoint)
                if endpoint == "query":
                    self._query_duration = duration
            duration.observe(loop.time() - started)

    async def _read(self, response: aiohttp.ClientResponse, endpoint: str) -> bytes:
        try:
            return await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise self._count(_transport_error(exc), endpoint) from None

    async def _request(self, endpoint: str, params: list[tuple[str, str]]) -> tuple[int, bytes]:
        async with self._open(endpoint, params) as response:
            body = await self._read(response, endpoint)
            status = response.status
        try:
            _check_status_only(status, body)
        except PrometheusError as exc:
            logger.warning("Prometheus %s answered %s: %s", endpoint, status, exc.detail)
            raise self._count(exc, endpoint) from None
        return status, body


def _check_status_only(status: int, body: bytes) -> None:
    """Raise for error answers now (so they are counted once); success is parsed by the caller."""
    if 200 <= status < 300:
        return
    _read_api_json(status, body)  # always raises for a non-2xx code


def _transport_error(exc: BaseException) -> PrometheusUnavailable:
    if isinstance(exc, TimeoutError):  # aiohttp's timeouts are TimeoutError subclasses
        return PrometheusUnavailable("Prometheus did not answer in time", reason="timeout",
                                     detail=f"{type(exc).__name__}")
    return PrometheusUnavailable("Prometheus cannot be reached", reason="connection",
                                 detail=f"{type(exc).__name__}: {exc}")


_SERIES_BATCH = msgspec.json.Decoder(list[dict[str, str]])


class _SeriesReader:
    """Incremental reader of `{"status":"success","data":[{...},...]...}`: one label set at a time.

    The complete objects of each chunk are decoded at once by msgspec as a list of string maps
    (most of a discovery pass's own CPU was one `raw_decode` and one check per series); where
    that fails (an object cut by the chunk's end that holds a `}` in a string, the envelope's
    end, a value that is not a string), they are decoded one at a time with the C JSON decoder
    (`raw_decode`), which reads the same maps and says what is wrong. Only the envelope is
    handled here. An answer of any other shape is read whole and parsed normally.
    """

    def __init__(self) -> None:
        self._raw = b""                  # bytes before the envelope's prefix is recognised
        self._text = ""                  # decoded text not consumed yet
        self._state: Literal["prefix", "items", "tail", "whole"] = "prefix"
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._decoder = json.JSONDecoder()

    def feed(self, chunk: bytes) -> list[dict[str, str]]:
        if self._state == "whole":
            self._raw += chunk
            return []
        if self._state == "prefix":
            self._raw += chunk
            match = _SERIES_PREFIX.match(self._raw)
            if match is None:
                if len(self._raw) > 256 or not _could_be_prefix(self._raw):
                    self._state = "whole"
                return []
            chunk, self._raw = self._raw[match.end():], b""
            self._state = "items"
        try:
            self._text += self._utf8.decode(chunk)
        except UnicodeDecodeError:
            raise _bad_response("series answer is not UTF-8") from None
        return self._items() if self._state == "items" else []

    def _items(self) -> list[dict[str, str]]:
        out: list[dict[str, str]] = []
        text, pos, n = self._text, 0, len(self._text)
        while pos < n and text[pos] in " \t\r\n,":
            pos += 1
        # Every object up to the last `}`: if that `}` was inside a string, or past the list's
        # end, the text is not a JSON list and the loop below takes over from `pos`.
        cut = text.rfind("}") + 1
        if pos < cut and text[pos] == "{":
            try:
                out = _SERIES_BATCH.decode("[" + text[pos:cut] + "]")
            except (msgspec.DecodeError, msgspec.ValidationError):
                pass
            else:
                pos = cut
        while True:
            while pos < n and text[pos] in " \t\r\n,":
                pos += 1
            if pos >= n:
                break
            if text[pos] == "]":
                self._state = "tail"
                pos += 1
                break
            try:
                obj, end = self._decoder.raw_decode(text, pos)
            except json.JSONDecodeError:
                break  # an object cut by the chunk boundary: wait for more
            out.append(_labels(obj))
            pos = end
        self._text = text[pos:]
        return out

    def finish(self) -> list[dict[str, str]]:
        if self._state in ("whole", "prefix"):
            payload = _read_api_json(200, self._raw)
            data = payload.get("data")
            if not isinstance(data, list):
                raise _bad_response("series data is not a list")
            return [_labels(item) for item in data]
        if self._state != "tail":
            raise _bad_response("series answer ended early")
        try:
            self._text += self._utf8.decode(b"", final=True)
            json.loads('{"data":[]' + self._text)  # the rest must close the envelope
        except ValueError:
            raise _bad_response("series answer ended badly") from None
        return []


def _could_be_prefix(buffer: bytes) -> bool:
    """Whether more bytes could still complete the standard envelope prefix."""
    compact = re.sub(rb"\s+", b"", buffer)
    target = b'{"status":"success","data":['
    return target.startswith(compact[: len(target)])
