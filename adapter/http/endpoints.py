"""The endpoints beside the metrics APIs: health checks (`/healthz`, `/livez`, `/readyz`, each
also per check), `/version`, `/metrics` and `/openapi/v2`."""

from __future__ import annotations

import json
import logging
import platform
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from adapter.http.keys import HEALTH_KEY, METRICS_REGISTRY_KEY, ROUTE_LABEL_KEY
from adapter.http.middleware import Handler
from adapter.http.responses import json_response, text_response
from metricscale import __version__

__all__ = ["HealthChecks", "add_endpoints"]

logger = logging.getLogger(__name__)


@dataclass
class HealthChecks:
    """Named checks per endpoint (`healthz`, `livez`, `readyz`); others may add their own.

    A check may also say why it passes in a degraded way (`note`): `?verbose` shows it after
    `[+]name ok: `. A failing check's reason is withheld, as kube-apiserver does.
    """

    checks: dict[str, list[tuple[str, Callable[[], bool]]]] = field(default_factory=lambda: {
        "healthz": [], "livez": [], "readyz": []})
    notes: dict[str, Callable[[], str | None]] = field(default_factory=dict)

    def add(self, endpoints: Sequence[str], name: str, check: Callable[[], bool], *,
            note: Callable[[], str | None] | None = None) -> None:
        for endpoint in endpoints:
            self.checks[endpoint].append((name, check))
        if note is not None:
            self.notes[name] = note

    def note(self, name: str) -> str | None:
        """What a passing check has to say (None: nothing), safe to show to anyone."""
        note = self.notes.get(name)
        if note is None:
            return None
        try:
            return note()
        except Exception:
            logger.exception("health check note %s raised", name)
            return None

    def run(self, endpoint: str) -> list[tuple[str, bool]]:
        results = []
        for name, check in self.checks[endpoint]:
            try:
                ok = bool(check())
            except Exception:
                logger.exception("health check %s raised", name)
                ok = False
            results.append((name, ok))
        return results


def _health_handler(endpoint: str) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        request[ROUTE_LABEL_KEY] = "health"
        health = request.app[HEALTH_KEY]
        single = request.match_info.get("check")
        results = health.run(endpoint)
        if single is not None:
            single_ok = dict(results).get(single)
            if single_ok is None:
                return text_response("404 page not found\n", status=404)
            if single_ok:
                return text_response("ok")
            return text_response(f"internal server error: {single} check failed\n", status=500)
        excluded = {value for key, value in request.rel_url.query.items() if key == "exclude"}
        lines = []
        failed = False
        for name, ok in results:
            if name in excluded:
                lines.append(f"[+]{name} excluded: ok\n")
                excluded.discard(name)
            elif ok:
                note = health.note(name)
                lines.append(f"[+]{name} ok: {note}\n" if note else f"[+]{name} ok\n")
            else:
                lines.append(f"[-]{name} failed: reason withheld\n")
                failed = True
        if excluded:
            names = ",".join(json.dumps(name) for name in sorted(excluded))
            lines.append(f"warn: some health checks cannot be excluded: no matches for {names}\n")
        if failed:
            logger.info("%s failed: %s", endpoint,
                        ", ".join(name for name, ok in results if not ok))
            return text_response("".join(lines) + f"{endpoint} check failed\n", status=500)
        if "verbose" not in request.rel_url.query:
            return text_response("ok")
        return text_response("".join(lines) + f"{endpoint} check passed\n")

    return handle


async def _version(request: web.Request) -> web.StreamResponse:
    request[ROUTE_LABEL_KEY] = "version"
    major, minor, *_ = [*__version__.split("."), "0", "0"]
    return json_response({
        "major": major, "minor": minor, "gitVersion": f"v{__version__}", "gitCommit": "",
        "gitTreeState": "", "buildDate": "",
        "goVersion": f"python{platform.python_version()}",
        "compiler": sys.implementation.name,
        "platform": f"{platform.system().lower()}/{platform.machine()}"})


async def _metrics(request: web.Request) -> web.StreamResponse:
    request[ROUTE_LABEL_KEY] = "metrics"
    body = generate_latest(request.app[METRICS_REGISTRY_KEY])
    response = web.Response(body=body)
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


async def _openapi_v2(request: web.Request) -> web.StreamResponse:
    request[ROUTE_LABEL_KEY] = "openapi"
    # A minimal valid Swagger 2.0 document (contract §6); /openapi/v3 is a 404, after which the
    # aggregator converts this one.
    return json_response({"swagger": "2.0",
                          "info": {"title": "metricscale-adapter", "version": __version__},
                          "paths": {}})


def add_endpoints(router: web.UrlDispatcher) -> None:
    """The routes of the health checks, /version, /metrics and /openapi/v2 (GET only)."""
    for endpoint in ("healthz", "livez", "readyz"):
        handler = _health_handler(endpoint)
        router.add_get(f"/{endpoint}", handler, allow_head=False)
        router.add_get(f"/{endpoint}/{{check}}", handler, allow_head=False)
    router.add_get("/version", _version, allow_head=False)
    router.add_get("/version/", _version, allow_head=False)
    router.add_get("/metrics", _metrics, allow_head=False)
    router.add_get("/openapi/v2", _openapi_v2, allow_head=False)
