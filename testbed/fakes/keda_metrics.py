"""A test double of KEDA's metrics server (keda-operator-metrics-apiserver), over HTTPS.

What it copies from KEDA (kedacore/keda `pkg/provider/provider.go`, `pkg/metricsservice`,
served through sigs.k8s.io/custom-metrics-apiserver):

* It serves `external.metrics.k8s.io/v1beta1` only. Its discovery list is the single
  placeholder resource `externalmetric` (custom-metrics-apiserver's
  `DefaultExternalMetricsProvider`, which KEDA embeds): KEDA does not list its metric names.
* Metric names are KEDA's (`s0-prometheus`, `s1-rabbitmq-orders`...), and a request must carry
  the label selector `scaledobject.keda.sh/name=<ScaledObject>`.
* KEDA's errors are plain Go errors, not `metav1.Status`, so the generic apiserver answers
  them as **500** with an empty reason and the error text as message: a missing selector is
  `scaledObject name is not specified`; an unknown ScaledObject or metric is
  `rpc error: code = Unknown desc = error when getting metric values ...`. (Not 400/404.)
  A selector that does not parse is a 400 BadRequest from the apiserver before KEDA runs.
* Authentication as a generic apiserver behind the aggregator: a client certificate signed by
  the request-header CA with an allowed CN, then `X-Remote-User`/`-Group`/`-Extra-*`; no
  certificate means anonymous, which is forbidden (403). Every request is recorded.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

__all__ = ["KedaMetricsServer", "SeenRequest", "identity_of"]

GROUP_VERSION = "external.metrics.k8s.io/v1beta1"
SCALED_OBJECT_LABEL = "scaledobject.keda.sh/name"


@dataclass(frozen=True)
class SeenRequest:
    path: str
    query: str
    headers: tuple[tuple[str, str], ...]
    client_cn: str | None

    def header_values(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]


def _status(code: int, message: str, reason: str = "") -> web.Response:
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Failure", "message": message}
    if reason:
        body["reason"] = reason
    body["code"] = code
    return web.json_response(body, status=code)


def _selector_map(text: str) -> dict[str, str] | None:
    """labels.ConvertSelectorToLabelsMap for `k=v,k2=v2` (None when it does not parse)."""
    result: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            return None
        result[key.strip()] = value.lstrip("=").strip()
    return result


@dataclass
class KedaMetricsServer:
    """`values[(namespace, scaledobject, metric)] = quantity`; start/stop on one port."""

    cert_file: Path
    key_file: Path
    request_header_ca_pem: bytes
    allowed_names: tuple[str, ...] = ("front-proxy-client",)
    values: dict[tuple[str, str, str], str] = field(default_factory=dict)
    seen: list[SeenRequest] = field(default_factory=list)
    port: int = 0
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def _context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(self.cert_file), str(self.key_file))
        context.verify_mode = ssl.CERT_OPTIONAL
        context.load_verify_locations(cadata=self.request_header_ca_pem.decode())
        return context

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/apis/external.metrics.k8s.io/v1beta1", self._discovery)
        app.router.add_get("/apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/{metric}",
                           self._metric)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self._context(),
                           reuse_address=True)
        await site.start()
        server = site._server
        assert server is not None
        self.port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> KedaMetricsServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def requests_for(self, path_part: str) -> list[SeenRequest]:
        return [seen for seen in self.seen if path_part in seen.path]

    # -- authentication -------------------------------------------------------------------

    def _authenticate(self, request: web.Request) -> web.Response | None:
        transport = request.transport
        peer = transport.get_extra_info("peercert") if transport is not None else None
        cn = None
        if peer:
            for rdn in peer.get("subject", ()):
                for key, value in rdn:
                    if key == "commonName":
                        cn = value
        self.seen.append(SeenRequest(request.path, request.rel_url.raw_query_string,
                                     tuple(request.headers.items()), cn))
        if cn is None:
            return _status(403, 'forbidden: User "system:anonymous" cannot get path '
                                f'"{request.path}"', "Forbidden")
        if self.allowed_names and cn not in self.allowed_names:
            return _status(401, "Unauthorized", "Unauthorized")
        if not request.headers.get("X-Remote-User"):
            return _status(401, "Unauthorized", "Unauthorized")
        return None

    # -- handlers -------------------------------------------------------------------------

    async def _discovery(self, request: web.Request) -> web.StreamResponse:
        refused = self._authenticate(request)
        if refused is not None:
            return refused
        return web.json_response({
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GROUP_VERSION,
            "resources": [{"name": "externalmetric", "singularName": "", "namespaced": True,
                           "kind": "ExternalMetricValueList", "verbs": ["get"]}]})

    async def _metric(self, request: web.Request) -> web.StreamResponse:
        refused = self._authenticate(request)
        if refused is not None:
            return refused
        namespace, metric = request.match_info["ns"], request.match_info["metric"]
        selector = _selector_map(request.query.get("labelSelector", ""))
        if selector is None:
            return _status(400, "unable to parse requirement: found '', expected: '='",
                           "BadRequest")
        scaled_object = selector.get(SCALED_OBJECT_LABEL, "")
        if not scaled_object:
            return _status(500, "scaledObject name is not specified")
        if not any(ns == namespace and so == scaled_object for ns, so, _ in self.values):
            return _status(500, "rpc error: code = Unknown desc = error when getting metric "
                                f'values scaledobjects.keda.sh "{scaled_object}" not found')
        value = self.values.get((namespace, scaled_object, metric))
        if value is None:
            return _status(500, "rpc error: code = Unknown desc = error when getting metric "
                                f"values no matching metrics found for {metric}")
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"kind": "ExternalMetricValueList", "apiVersion": GROUP_VERSION,
                "metadata": {}, "items": [{"metricName": metric, "metricLabels": None,
                                           "timestamp": now, "value": value}]}
        return web.Response(body=json.dumps(body).encode(), content_type="application/json")


def identity_of(seen: SeenRequest) -> tuple[str | None, list[str], Mapping[str, Sequence[str]]]:
    """(user, groups, extra by lower-cased raw header suffix) as the double received them."""
    users = seen.header_values("X-Remote-User")
    extra: dict[str, list[str]] = {}
    for name, value in seen.headers:
        if name.lower().startswith("x-remote-extra-"):
            extra.setdefault(name[len("x-remote-extra-"):].lower(), []).append(value)
    return (users[0] if users else None), seen.header_values("X-Remote-Group"), extra
