"""One HTTP session to the API server, built from the connection settings, for both programs.

Every Kubernetes request of the adapter and the autoscaler (reads, writes, reviews, discovery,
and the informers' lists and watches) goes through a `KubeHTTP`: raw JSON in and out, so no
generated model meets a half-filled object (client-side validation) or a MicroTime (the models
drop a zero fraction, which the API server rejects), and no library debug log prints a body
(a TokenReview answer holds the token).

Why not kubernetes_asyncio's ApiClient: its session has `trust_env=True`, so aiohttp asks a
worker thread for the proxy and another for ~/.netrc on every request, and `call_api` rebuilds
headers, auth and parameters through its serializer each time: a GET cost about three times the
CPU of the same GET on a plain session (~300 against ~105 µs, measured). Here the proxy
(kubeconfig `proxy-url`, else HTTP(S)_PROXY/NO_PROXY) is resolved once at start, the headers are
rebuilt only when the token changes (the Configuration's refresh hook is still asked every
request, so rotating service-account tokens and exec credentials keep working), and connections
are kept alive and pooled (at least `connection_pool_maxsize`, default 100). TLS is exactly what
kubernetes_asyncio's RESTClientObject configures.
"""

from __future__ import annotations

import json
import logging
import ssl
import urllib.request
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import aiohttp
from yarl import URL

from metricscale import __version__
from metricscale.core.proxies import ProxyChoice, proxy_for
from metricscale.kube.config import Configuration, open_configuration

__all__ = ["DEFAULT_USER_AGENT", "JSON", "KubeHTTP", "Response", "connect", "open_kube_http"]

logger = logging.getLogger(__name__)

JSON = "application/json"
DEFAULT_USER_AGENT = f"metricscale/{__version__}"


def _ssl_context(configuration: Configuration) -> ssl.SSLContext:
    """The TLS client context kubernetes_asyncio's RESTClientObject builds, option for option."""
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, keyfile=configuration.key_file)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if configuration.disable_strict_ssl_verification:
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    return context


@dataclass(frozen=True)
class Response:
    """An API server's answer as the client reads it: status, headers, body bytes.

    The body may hold a secret (a TokenReview answer holds the token): never log it.
    """

    status: int
    headers: Mapping[str, str]  # case-insensitive (Retry-After)
    body: bytes


class KubeHTTP:
    """Requests to the API server over one aiohttp session, built from a Configuration.

    `request` reads an answer whole; `stream` hands back the unread response of a LIST or WATCH.
    Neither raises for an error status: mapping statuses to errors is the caller's, once, with
    `metricscale.kube.errors.error_from_response`.
    """

    def __init__(self, configuration: Configuration, *, user_agent: str = DEFAULT_USER_AGENT,
                 proxies: Mapping[str, str] | None = None,
                 request_timeout: float = 30.0) -> None:
        self._configuration = configuration
        self._timeout = aiohttp.ClientTimeout(total=request_timeout)
        self._host = str(configuration.host).rstrip("/")
        self._user_agent = user_agent
        self._server_hostname: str | None = configuration.tls_server_name or None
        proxy = proxy_for(URL(self._host), urllib.request.getproxies() if proxies is None
                          else proxies, configured=configuration.proxy,
                          configured_headers=configuration.proxy_headers)
        if proxy.ignored:
            logger.warning("not using the proxy set in the environment for %s: %s",
                           self._host, proxy.ignored)
        elif proxy.url is not None:
            logger.info("Kubernetes API requests go through the proxy %s", proxy.url)
        self.proxy: ProxyChoice = proxy
        self._request_options: dict[str, Any] = {}
        self._extra_headers: dict[str, str] = {}
        if proxy.url is not None:
            self._request_options["proxy"] = proxy.url
            # Proxy-Authorization goes on the CONNECT for https, on each request for http.
            if proxy.headers and URL(self._host).scheme == "https":
                self._request_options["proxy_headers"] = dict(proxy.headers)
            else:
                self._extra_headers.update(proxy.headers)
        if self._server_hostname:
            self._request_options["server_hostname"] = self._server_hostname
        self._session: aiohttp.ClientSession | None = None
        self._token: str | None = None
        self._headers: dict[tuple[str, str], dict[str, str]] = {}

    @property
    def host(self) -> str:
        return self._host

    async def __aenter__(self) -> KubeHTTP:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def start(self) -> None:
        """Open the session (inside the running loop)."""
        if self._session is not None:
            return
        limit = max(int(self._configuration.connection_pool_maxsize or 0), 100)
        connector = aiohttp.TCPConnector(
            limit=limit, ssl=_ssl_context(self._configuration),
            # Longer than the default sync period, so a steady state reuses its connections.
            keepalive_timeout=60.0)
        self._session = aiohttp.ClientSession(connector=connector, trust_env=False,
                                              timeout=self._timeout)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _token_value(self) -> str | None:
        configuration = self._configuration
        if "BearerToken" not in configuration.api_key:
            return None
        # get_api_key_with_prefix runs the refresh hook (in-cluster: re-reads the projected
        # token once a minute), as kubernetes_asyncio does before every request.
        value = await configuration.get_api_key_with_prefix("BearerToken")
        return str(value) if value else None

    def _headers_for(self, content_type: str | None, accept: str) -> dict[str, str]:
        key = (content_type or "", accept)
        headers = self._headers.get(key)
        if headers is None:
            headers = {"Accept": accept, "User-Agent": self._user_agent, **self._extra_headers}
            if self._token:
                headers["Authorization"] = self._token
            if content_type:
                headers["Content-Type"] = content_type
            self._headers[key] = headers
        return headers

    async def _prepare(self, path: str, query: Sequence[tuple[str, str]],
                       ) -> tuple[aiohttp.ClientSession, URL]:
        if self._session is None:
            raise RuntimeError("KubeHTTP used before start() or after close()")
        token = await self._token_value()
        if token != self._token:
            self._token, self._headers = token, {}
        url = self._host + path
        if query:
            url += "?" + urlencode(query)  # url.Values.Encode's escaping (QueryEscape)
        return self._session, URL(url, encoded=True)

    async def request(self, verb: str, path: str, *, query: Sequence[tuple[str, str]] = (),
                      body: Any = None, content_type: str | None = None, accept: str = JSON,
                      client_timeout: aiohttp.ClientTimeout | None = None) -> Response:
        """One request, read whole; `path` is already escaped. Raises aiohttp.ClientError,
        TimeoutError or OSError when no response arrives; any status is returned, not raised."""
        session, url = await self._prepare(path, query)
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        options = self._request_options if client_timeout is None else {
            **self._request_options, "timeout": client_timeout}
        async with session.request(
                verb, url, data=data,
                headers=self._headers_for(content_type if data is not None else None, accept),
                **options) as response:
            payload = await response.read()
            return Response(response.status, response.headers, payload)

    @asynccontextmanager
    async def stream(self, path: str, *, query: Sequence[tuple[str, str]] = (),
                     accept: str = JSON, client_timeout: aiohttp.ClientTimeout | None = None,
                     ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A GET whose response is handed back unread (a LIST page, a WATCH stream), whatever
        its status; the connection is released, or closed if unread, when the block ends."""
        session, url = await self._prepare(path, query)
        options = self._request_options if client_timeout is None else {
            **self._request_options, "timeout": client_timeout}
        response = await session.request("GET", url, headers=self._headers_for(None, accept),
                                         **options)
        try:
            yield response
        finally:
            response.release()


@asynccontextmanager
async def open_kube_http(configuration: Configuration, *,
                         user_agent: str = DEFAULT_USER_AGENT,
                         proxies: Mapping[str, str] | None = None,
                         request_timeout: float = 30.0) -> AsyncIterator[KubeHTTP]:
    """A KubeHTTP whose session lives exactly as long as the `async with`."""
    async with KubeHTTP(configuration, proxies=proxies, request_timeout=request_timeout,
                        user_agent=user_agent) as http:
        yield http


@asynccontextmanager
async def connect(*, kubeconfig: str | None, user_agent: str, context: str | None = None,
                  on_failure: Callable[[BaseException], None] | None = None,
                  ) -> AsyncIterator[KubeHTTP]:
    """A KubeHTTP from a kubeconfig (else the in-cluster service account), with its
    credentials refreshed while it is open. Raises KubeConfigError when neither can be used."""
    async with open_configuration(kubeconfig=kubeconfig, context=context,
                                  on_failure=on_failure) as configuration, \
            open_kube_http(configuration, user_agent=user_agent) as http:
        yield http
