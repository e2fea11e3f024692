"""The client of the delegate adapters (`--delegate-external-to`, `--delegate-custom-to`).

A request for a metric our rules do not serve is passed on as kube-apiserver's aggregator
would pass it: same path and query, the front-proxy client certificate of
`--delegate-client-cert-file`, and the caller's identity in `X-Remote-*` headers
(adapter.auth.forwarding). The answer comes back unchanged: status, body, `Content-Type`
(and `Warning`/`Retry-After`). One aiohttp session serves both targets, opened inside the
running loop and closed with the app; no retries (the HPA asks again every 15 s).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry, Counter
from yarl import URL

from adapter.api.delegated import DelegateListError, read_resource_list
from adapter.api.groups import CUSTOM_METRICS_GROUP, EXTERNAL_METRICS_GROUP
from adapter.auth.forwarding import identity_headers
from adapter.auth.users import UserInfo
from adapter.settings import DelegationSettings
from metricscale import __version__
from metricscale.core.errors import ConfigError

__all__ = [
    "DISCOVERY_TIMEOUT_SECONDS",
    "DelegateAnswer",
    "DelegateClient",
    "DelegateConfigError",
    "DelegateUnavailable",
]

logger = logging.getLogger(__name__)

# The aggregator waits 5 s for a discovery answer; ours must leave time for our own list.
DISCOVERY_TIMEOUT_SECONDS = 2.0
_CONNECT_TIMEOUT_SECONDS = 5.0
# Request headers passed on besides the identity: what the answer depends on, and the audit id.
_PASSED_REQUEST_HEADERS = ("Accept", "Audit-Id")
# Answer headers passed back besides Content-Type.
_PASSED_ANSWER_HEADERS = ("Warning", "Retry-After")
_USER_AGENT = f"metricscale-adapter/{__version__} (delegation)"


class DelegateConfigError(ConfigError):
    """The delegate's CA or client certificate files cannot be used; names the flag."""


class DelegateUnavailable(Exception):
    """No answer from the delegate; `why` is short and safe to show to the caller."""

    def __init__(self, why: str, *, detail: str) -> None:
        super().__init__(why)
        self.why = why
        self.detail = detail  # for the log only: may name the address


@dataclass(frozen=True)
class DelegateAnswer:
    """The delegate's answer, to be returned as it is."""

    status: int
    body: bytes
    content_type: str | None
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class _Metrics:
    requests: Counter

    @classmethod
    def register(cls, registry: CollectorRegistry) -> _Metrics:
        return cls(requests=Counter(
            "metricscale_delegated_requests_total",
            "Requests passed to a delegate adapter, by API group, request kind (metric or "
            "discovery) and outcome (success: 2xx; error: another status, returned as it is; "
            "unavailable: no answer).",
            ["group", "request", "outcome"], registry=registry))


def _ssl_context(settings: DelegationSettings) -> ssl.SSLContext:
    flag = "--delegate-ca-file"
    try:
        context = ssl.create_default_context(cafile=settings.ca_file)
        flag = "--delegate-client-cert-file"
        if settings.client_cert_file:
            context.load_cert_chain(settings.client_cert_file, keyfile=settings.client_key_file)
    except FileNotFoundError as error:
        raise DelegateConfigError(f"{flag}: no such file {error.filename or ''}".rstrip()) \
            from None
    except (OSError, ssl.SSLError) as error:
        raise DelegateConfigError(f"{flag}: cannot be used: {type(error).__name__}: "
                                  f"{getattr(error, 'reason', None) or error}") from None
    return context


def _why(error: BaseException) -> str:
    """A short cause for the caller (no address, no certificate text)."""
    if isinstance(error, TimeoutError):
        return "timed out"
    if isinstance(error, aiohttp.ClientConnectorCertificateError):
        return "its serving certificate could not be verified"
    if isinstance(error, aiohttp.ClientConnectorSSLError | aiohttp.ClientSSLError):
        return "the TLS handshake failed"
    if isinstance(error, aiohttp.ClientConnectorError):
        if isinstance(error.os_error, ConnectionRefusedError):
            return "connection refused"
        return "cannot connect"
    if isinstance(error, aiohttp.ServerDisconnectedError):
        return "the connection was closed"
    return "the request failed"


class DelegateClient:
    """Passes requests to the delegate adapter of their group; `start`/`close` in the loop."""

    def __init__(self, settings: DelegationSettings, *, registry: CollectorRegistry) -> None:
        self.settings = settings
        self.targets: Mapping[str, URL] = {
            group: URL(url) for group, url in ((EXTERNAL_METRICS_GROUP, settings.external_url),
                                               (CUSTOM_METRICS_GROUP, settings.custom_url))
            if url}
        self._metrics = _Metrics.register(registry)
        self._session: aiohttp.ClientSession | None = None

    def delegates(self, group: str) -> bool:
        return group in self.targets

    async def start(self) -> None:
        """Read the TLS files (DelegateConfigError) and open the session."""
        if self._session is not None:
            return
        context = _ssl_context(self.settings)
        connector = aiohttp.TCPConnector(ssl=context, limit=100)
        self._session = aiohttp.ClientSession(
            connector=connector, trust_env=False, auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=self.settings.timeout,
                                          connect=min(self.settings.timeout,
                                                      _CONNECT_TIMEOUT_SECONDS)))
        for group, url in self.targets.items():
            logger.info("%s metrics our rules do not serve are delegated to %s", group, url)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _get(self, group: str, *, raw_path: str, raw_query: str, user: UserInfo,
                   headers: Sequence[tuple[str, str]], request: str,
                   limit_seconds: float | None = None) -> DelegateAnswer:
        session = self._session
        assert session is not None, "DelegateClient.start() was not awaited"
        base = self.targets[group]
        url = URL(f"{base}{raw_path}" + (f"?{raw_query}" if raw_query else ""), encoded=True)
        sent = [("User-Agent", _USER_AGENT), *headers, *identity_headers(user)]
        options: dict[str, Any] = {}
        if limit_seconds is not None:
            options["timeout"] = aiohttp.ClientTimeout(total=limit_seconds)
        try:
            async with session.get(url, headers=sent, allow_redirects=False,
                                   skip_auto_headers=("Accept-Encoding",), **options) as answer:
                body = await answer.read()
                passed = tuple((name, value) for name in _PASSED_ANSWER_HEADERS
                               for value in answer.headers.getall(name, ()))
                result = DelegateAnswer(answer.status, body,
                                        answer.headers.get("Content-Type"), passed)
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            self._metrics.requests.labels(group, request, "unavailable").inc()
            why = _why(error)
            logger.warning("delegate for %s (%s) did not answer GET %s: %s: %s", group, base,
                           raw_path, why, error or type(error).__name__)
            raise DelegateUnavailable(why, detail=str(error)) from None
        outcome = "success" if 200 <= result.status < 300 else "error"
        self._metrics.requests.labels(group, request, outcome).inc()
        return result

    async def forward(self, group: str, *, raw_path: str, raw_query: str, user: UserInfo,
                      headers: Sequence[tuple[str, str]]) -> DelegateAnswer:
        """The delegate's answer to this metric request; raises DelegateUnavailable."""
        wanted = {name.lower() for name in _PASSED_REQUEST_HEADERS}
        passed = [(name, value) for name, value in headers if name.lower() in wanted]
        return await self._get(group, raw_path=raw_path, raw_query=raw_query, user=user,
                               headers=passed, request="metric")

    async def resource_list(self, group: str, version: str, *,
                            user: UserInfo) -> tuple[dict[str, Any], ...]:
        """The delegate's resources for `group/version`; empty when it has none, does not
        serve that version, or does not answer (logged and counted)."""
        path = f"/apis/{group}/{version}"
        try:
            answer = await self._get(group, raw_path=path, raw_query="", user=user,
                                     headers=[("Accept", "application/json")],
                                     request="discovery",
                                     limit_seconds=min(self.settings.timeout,
                                                 DISCOVERY_TIMEOUT_SECONDS))
        except DelegateUnavailable:
            return ()
        if answer.status == 404:
            logger.debug("delegate for %s does not serve %s", group, path)
            return ()
        if answer.status != 200:
            logger.warning("delegate for %s answered %d to GET %s; listing our metrics only",
                           group, answer.status, path)
            return ()
        try:
            return read_resource_list(answer.body, group_version=f"{group}/{version}")
        except DelegateListError as error:
            logger.warning("delegate for %s: GET %s: %s; listing our metrics only", group,
                           path, error)
            return ()
