"""What answers look like on the wire: JSON, `Status` and plain-text bodies, `Warning` headers,
and the reading of `Accept` (plain JSON, aggregated discovery, a Table)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from aiohttp import web

from adapter.api.wire import AGGREGATED_DISCOVERY_CONTENT_TYPES, not_acceptable
from adapter.http.handlers import ApiError

__all__ = [
    "JSON_CONTENT_TYPE",
    "NOSNIFF",
    "TEXT_CONTENT_TYPE",
    "aggregated_discovery_version",
    "json_response",
    "negotiate_json",
    "require_json",
    "status_response",
    "table_version",
    "text_response",
    "warning_header",
]

JSON_CONTENT_TYPE = "application/json"
TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"
NOSNIFF: Mapping[str, str] = MappingProxyType({"X-Content-Type-Options": "nosniff"})
# The Table versions of meta.k8s.io a client may ask for (`kubectl get` asks for v1, then
# v1beta1, then plain JSON).
_TABLE_VERSIONS = frozenset({"v1", "v1beta1"})


def json_response(body: Mapping[str, Any] | bytes, *, status: int = 200,
                  headers: Mapping[str, str] | None = None,
                  content_type: str = JSON_CONTENT_TYPE) -> web.Response:
    """A JSON response; `body` as a value, or already encoded (the metric value lists)."""
    encoded = body if isinstance(body, bytes) else json.dumps(body, separators=(",", ":")).encode()
    response = web.Response(body=encoded, status=status, headers=headers)
    # Set after construction so aiohttp does not append its own charset parameter.
    response.headers["Content-Type"] = content_type
    return response


def status_response(body: Mapping[str, Any], *, headers: Mapping[str, str] | None = None,
                    ) -> web.Response:
    """A `Status` body with its own `code` as the HTTP status."""
    return json_response(body, status=int(body["code"]), headers={**NOSNIFF, **(headers or {})})


def text_response(text: str, *, status: int = 200) -> web.Response:
    response = web.Response(text=text, status=status, headers=NOSNIFF)
    response.headers["Content-Type"] = TEXT_CONTENT_TYPE
    return response


def warning_header(warnings: Sequence[str]) -> dict[str, str]:
    """RFC 7234 `Warning: 299 - "text"`, as kube-apiserver sends them (kubectl prints them)."""
    if not warnings:
        return {}
    quoted = []
    for text in warnings:
        clean = "".join(char if char.isprintable() and ord(char) < 128 else "?"
                        for char in text)
        quoted.append('299 - "' + clean.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return {"Warning": ", ".join(quoted)}


_ZERO_QUALITY = frozenset({"0", "0.0", "0.00", "0.000"})


def _media_ranges(accept: str) -> Iterator[tuple[str, dict[str, str]]]:
    """Each media range of `Accept` (lower-cased) with its parameters; `q=0` ranges left out."""
    for media_range in accept.split(","):
        media, *parameters = (part.strip() for part in media_range.split(";"))
        params = {}
        for parameter in parameters:
            key, _, value = parameter.partition("=")
            params[key.strip().lower()] = value.strip()
        if params.get("q", "1") not in _ZERO_QUALITY:
            yield media.lower(), params


def _plain_json_fits(media: str, params: Mapping[str, str]) -> bool:
    # `as`, `g` and `v` ask for another kind of document (a Table, a discovery list).
    return media in ("*/*", "application/*") or (
        media == "application/json" and not {"as", "g", "v"} & params.keys())


def negotiate_json(accept: str | None) -> bool:
    """Whether plain JSON satisfies `Accept` (absent, `application/json`, `application/*`,
    `*/*`). `application/json;as=Table;…` asks for another kind and does not count."""
    if not accept or not accept.strip():
        return True
    return any(_plain_json_fits(media, params) for media, params in _media_ranges(accept))


def require_json(accept: str | None) -> None:
    """Raise ApiError (406) unless plain JSON satisfies `Accept`."""
    if not negotiate_json(accept):
        raise ApiError(not_acceptable())


def aggregated_discovery_version(accept: str | None) -> str | None:
    """`v2`/`v2beta1` if `Accept` asks for aggregated discovery first, else None."""
    if not accept:
        return None
    for media, params in _media_ranges(accept):
        if (media == "application/json" and params.get("g") == "apidiscovery.k8s.io"
                and params.get("as") == "APIGroupDiscoveryList"
                and params.get("v") in AGGREGATED_DISCOVERY_CONTENT_TYPES):
            return params["v"]
        if _plain_json_fits(media, params):
            return None
    return None


def table_version(accept: str | None) -> str | None:
    """`v1`/`v1beta1` if `Accept` asks for a meta.k8s.io Table before plain JSON, else None
    (kubectl get: `application/json;as=Table;v=v1;g=meta.k8s.io,…,application/json`)."""
    if not accept:
        return None
    for media, params in _media_ranges(accept):
        if (media == "application/json" and params.get("as") == "Table"
                and params.get("g") == "meta.k8s.io" and params.get("v") in _TABLE_VERSIONS):
            return params["v"]
        if _plain_json_fits(media, params):
            return None
    return None
