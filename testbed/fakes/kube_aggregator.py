"""The fake's kube-aggregator: APIService proxying, availability checks, group discovery.

APIServices route /apis/<group>/<version>/... over TLS with the front-proxy identity; /apis and
/apis/<group> are built from APIService objects.

There is no cluster network here, so a Service is resolved through endpoints the test sets with
`FakeKubeAPI.set_service_endpoint(namespace, name, host, port)`; that replaces ClusterIP (and
EndpointSlice) resolution. A Service with no endpoint set counts as missing.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import logging
import ssl
import time
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import aiohttp
import yarl
from aiohttp import web

from testbed.fakes.kube_resources import BUILTIN_PRIORITIES, ResourceRegistry, ResourceType
from testbed.fakes.kube_schema import format_time
from testbed.fakes.kube_store import ObjectStore, StoreEvent

JSONDict = dict[str, Any]
log = logging.getLogger(__name__)

__all__ = [
    "Aggregator",
    "ProxyIdentity",
    "ServiceEndpoint",
    "canonical_header_key",
    "escape_header_key",
    "forwarded_uri",
    "go_clean_path",
    "go_encode_query",
    "go_escape_path",
]

HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
              "trailer", "transfer-encoding", "upgrade", "proxy-connection", "host"}
AVAILABILITY_TIMEOUT = 5.0
# apimachinery/pkg/util/proxy/upgradeaware.go (RejectForwardingRedirects, which kube-aggregator
# turns on by default): a backend's redirect becomes this 502 body.
REDIRECT_REFUSED = "the backend attempted to redirect this request, which is not permitted"
# upgradeaware.go corsRemovingTransport: CORS headers from a backend never reach the client.
CORS_HEADERS = {"access-control-allow-credentials", "access-control-allow-headers",
                "access-control-allow-methods", "access-control-allow-origin"}


@dataclass(frozen=True)
class ServiceEndpoint:
    host: str
    port: int


@dataclass(frozen=True)
class ProxyIdentity:
    """The authenticated caller, as the aggregator forwards it."""

    user: str
    groups: tuple[str, ...]
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


# --- Go's encodings ---------------------------------------------------------------------------

_PATH_SAFE = "-_.~$&+,/:;=@"


def go_escape_path(path: str) -> str:
    """url.URL.EscapedPath for a URL with only Path set (every byte but unreserved and
    `$&+,/:;=@` is %-escaped; so `*` becomes %2A)."""
    return urllib.parse.quote(path, safe=_PATH_SAFE)


def go_clean_path(path: str) -> str:
    """path.Clean: collapse repeated slashes, drop `.`, resolve `..`, no trailing slash."""
    if not path:
        return "."
    rooted = path.startswith("/")
    parts: list[str] = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if parts and parts[-1] != "..":
                parts.pop()
            elif not rooted:
                parts.append("..")
            continue
        parts.append(segment)
    cleaned = ("/" if rooted else "") + "/".join(parts)
    return cleaned or "."


def forwarded_uri(path: str) -> str:
    """apimachinery/pkg/util/proxy/transport.go: path.Join of the (decoded) path, with the
    trailing slash put back."""
    joined = go_clean_path(path) if path else ""
    return joined + "/" if path.endswith("/") else joined


def go_encode_query(pairs: Iterable[tuple[str, str]]) -> str:
    """url.Values.Encode: keys sorted, values in order, QueryEscape (space as +)."""
    by_key: dict[str, list[str]] = {}
    for key, value in pairs:
        by_key.setdefault(key, []).append(value)
    parts: list[str] = []
    for key in sorted(by_key):
        escaped = urllib.parse.quote_plus(key, safe="")
        parts.extend(f"{escaped}={urllib.parse.quote_plus(v, safe='')}" for v in by_key[key])
    return "&".join(parts)


def _legal_header_byte(byte: int) -> bool:
    char = chr(byte)
    return char.isascii() and (char.isalnum() or char in "!#$&'*+-.^_`|~")


def escape_header_key(key: str) -> str:
    """client-go's headerKeyEscape: %-encode bytes that are not token characters, and `%`."""
    out = []
    for byte in key.encode():
        if _legal_header_byte(byte):
            out.append(chr(byte))
        else:
            out.append(f"%{byte:02X}")
    return "".join(out)


def canonical_header_key(key: str) -> str:
    """textproto.CanonicalMIMEHeaderKey: `x-remote-extra-a%2Fb` -> `X-Remote-Extra-A%2fb`."""
    out = []
    upper = True
    for char in key:
        if upper and "a" <= char <= "z":
            char = char.upper()
        elif not upper and "A" <= char <= "Z":
            char = char.lower()
        out.append(char)
        upper = char == "-"
    return "".join(out)


def identity_headers(identity: ProxyIdentity) -> list[tuple[str, str]]:
    """transport.SetAuthProxyHeaders."""
    headers = [("X-Remote-User", identity.user)]
    headers.extend(("X-Remote-Group", group) for group in identity.groups)
    for key, values in identity.extra:
        name = canonical_header_key("X-Remote-Extra-" + escape_header_key(key))
        headers.extend((name, value) for value in values)
    return headers


def _is_remote_identity_header(name: str) -> bool:
    lowered = name.lower()
    return lowered in ("x-remote-user", "x-remote-group", "x-remote-uid") or \
        lowered.startswith("x-remote-extra-")


def _go_error(error: BaseException, host: str, port: int, server_name: str) -> str:
    """Render a client error roughly as Go's transport would have worded it."""
    if isinstance(error, aiohttp.ClientConnectorCertificateError):
        cert_error = error.certificate_error
        if isinstance(cert_error, ssl.SSLCertVerificationError) and \
                cert_error.verify_code == 62:
            return (f"tls: failed to verify certificate: x509: certificate is not valid for "
                    f"{server_name}")
        return "tls: failed to verify certificate: x509: certificate signed by unknown authority"
    if isinstance(error, aiohttp.ClientConnectorSSLError):
        return f"remote error: tls: {error}"
    if isinstance(error, aiohttp.ClientConnectorError):
        cause = error.os_error
        if isinstance(cause, ConnectionRefusedError):
            return f"dial tcp {host}:{port}: connect: connection refused"
        return f"dial tcp {host}:{port}: {cause}"
    if isinstance(error, asyncio.TimeoutError | TimeoutError):
        return f"dial tcp {host}:{port}: i/o timeout"
    return str(error) or type(error).__name__


# --- the aggregator -----------------------------------------------------------------------------


class Aggregator:
    """APIService objects (apiregistration.k8s.io/v1) -> local or proxied group/versions."""

    def __init__(self, *, store: ObjectStore, registry: ResourceRegistry,
                 clock: Callable[[], datetime], front_proxy: Callable[[], tuple[str, str]],
                 max_backoff: float, resync: float) -> None:
        self.store = store
        self.registry = registry
        self.clock = clock
        self._front_proxy = front_proxy  # (certificate file, key file)
        self.endpoints: dict[tuple[str, str], ServiceEndpoint] = {}
        self.max_backoff = max_backoff
        self.resync = resync
        self._session: aiohttp.ClientSession | None = None
        self._wake = asyncio.Event()
        self._due: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._contexts: dict[tuple[str, bool, str], ssl.SSLContext] = {}

    @property
    def apiservices(self) -> ResourceType:
        resource_type = self.registry.resolve("apiregistration.k8s.io", "v1", "apiservices")
        assert resource_type is not None
        return resource_type

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=False, limit=100),
            auto_decompress=False)
        self._unsubscribe = self.store.subscribe(self._on_store_event)
        for obj in self.store.items(self.apiservices, None):
            self._schedule(obj["metadata"]["name"], 0.0)
        self._task = asyncio.create_task(self._availability_loop(), name="fake-aggregator")

    async def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._session is not None:
            await self._session.close()

    def _on_store_event(self, event: StoreEvent) -> None:
        if event.key != self.apiservices.storage_key:
            return
        if event.type == "DELETED":
            self._due.pop(event.name, None)
            return
        previous = (event.previous or {}).get("spec")
        if event.type == "ADDED" or previous != event.object.get("spec"):
            self._failures.pop(event.name, None)
            self._schedule(event.name, 0.0)

    def set_endpoint(self, namespace: str, name: str, endpoint: ServiceEndpoint | None) -> None:
        if endpoint is None:
            self.endpoints.pop((namespace, name), None)
        else:
            self.endpoints[(namespace, name)] = endpoint
        for obj in self.store.items(self.apiservices, None):
            service = (obj.get("spec") or {}).get("service") or {}
            if (service.get("namespace"), service.get("name")) == (namespace, name):
                self._failures.pop(obj["metadata"]["name"], None)
                self._schedule(obj["metadata"]["name"], 0.0)

    def recheck_all(self) -> None:
        for obj in self.store.items(self.apiservices, None):
            self._schedule(obj["metadata"]["name"], 0.0)

    def _schedule(self, name: str, delay: float) -> None:
        due = time.monotonic() + delay
        self._due[name] = min(self._due.get(name, due), due)
        self._wake.set()

    # --- availability -----------------------------------------------------------------------

    async def _availability_loop(self) -> None:
        while True:
            now = time.monotonic()
            ready = [name for name, due in self._due.items() if due <= now]
            for name in ready:
                del self._due[name]
            if ready:
                await asyncio.gather(*(self._check(name) for name in ready))
                continue
            self._wake.clear()
            timeout = min(self._due.values()) - now if self._due else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=timeout)

    async def _check(self, name: str) -> None:
        stored = self.store.lookup(self.apiservices, "", name)
        if stored is None:
            return
        spec = stored.get("spec") or {}
        service = spec.get("service")
        if service is None:
            condition = ("True", "Local", "Local APIServices are always available")
        else:
            condition = await self._probe(spec, service)
        try:
            self._set_condition(stored, *condition)
        except Exception:  # a concurrent write; the next event reschedules the check
            log.debug("could not record availability of %s", name, exc_info=True)
        if condition[0] == "True":
            self._failures.pop(name, None)
            if service is not None:
                self._schedule(name, self.resync)
        else:
            failures = self._failures.get(name, 0)
            self._failures[name] = failures + 1
            self._schedule(name, min(0.005 * 2 ** failures, self.max_backoff))

    async def _probe(self, spec: JSONDict, service: JSONDict) -> tuple[str, str, str]:
        namespace, name = service.get("namespace", ""), service.get("name", "")
        endpoint = self.endpoints.get((namespace, name))
        if endpoint is None:
            return "False", "ServiceNotFound", f'service/{name} in "{namespace}" is not present'
        path = f"/apis/{spec.get('group')}/{spec.get('version')}"
        url = f"https://{endpoint.host}:{endpoint.port}{path}"
        assert self._session is not None
        context = self._context(ca_bundle="", insecure=True)
        headers = [("X-Remote-User", "system:kube-aggregator"),
                   ("X-Remote-Group", "system:masters")]

        async def attempt() -> int:
            assert self._session is not None
            async with self._session.get(
                    url, headers=headers, ssl=context, allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=AVAILABILITY_TIMEOUT)) as response:
                return response.status

        results = await asyncio.gather(*(attempt() for _ in range(5)), return_exceptions=True)
        if any(isinstance(r, int) and 200 <= r < 300 for r in results):
            return "True", "Passed", "all checks passed"
        first = results[0]
        if isinstance(first, int):
            detail = f"bad status from {url}: {first}"
        else:
            detail = f'Get "{url}": {_go_error(first, endpoint.host, endpoint.port, "")}'
        return "False", "FailedDiscoveryCheck", \
            f"failing or missing response from {url}: {detail}"

    def _set_condition(self, stored: JSONDict, status: str, reason: str, message: str) -> None:
        obj = copy.deepcopy(stored)
        conditions = (obj.setdefault("status", {})).setdefault("conditions", [])
        existing = next((c for c in conditions if c.get("type") == "Available"), None)
        if existing is not None and (existing.get("status"), existing.get("reason"),
                                     existing.get("message")) == (status, reason, message):
            return
        transition = format_time(self.clock())
        if existing is not None and existing.get("status") == status:
            transition = existing.get("lastTransitionTime", transition)
        new = {"type": "Available", "status": status, "lastTransitionTime": transition,
               "reason": reason, "message": message}
        obj["status"]["conditions"] = [c for c in conditions if c.get("type") != "Available"]
        obj["status"]["conditions"].append(new)
        self.store.replace(self.apiservices, obj)

    @staticmethod
    def available_condition(apiservice: JSONDict) -> JSONDict | None:
        for condition in (apiservice.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "Available":
                return condition  # type: ignore[no-any-return]
        return None

    def is_available(self, apiservice: JSONDict) -> bool:
        condition = self.available_condition(apiservice)
        return condition is not None and condition.get("status") == "True"

    # --- routing ----------------------------------------------------------------------------

    def find(self, group: str, version: str) -> JSONDict | None:
        name = f"{version}.{group}" if group else version
        return self.store.lookup(self.apiservices, "", name)

    def remote(self, group: str, version: str) -> JSONDict | None:
        """The APIService for group/version when it names a Service (proxied)."""
        found = self.find(group, version)
        if found is None or (found.get("spec") or {}).get("service") is None:
            return None
        return found

    def _context(self, *, ca_bundle: str, insecure: bool) -> ssl.SSLContext:
        cert_file, key_file = self._front_proxy()
        key = (ca_bundle, insecure, cert_file)
        context = self._contexts.get(key)
        if context is None:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
            if insecure:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            elif ca_bundle:
                context.load_verify_locations(cadata=ca_bundle)
            context.load_cert_chain(cert_file, key_file)
            self._contexts[key] = context
        return context

    async def proxy(self, request: web.Request, apiservice: JSONDict,
                    identity: ProxyIdentity) -> web.StreamResponse:
        if not self.is_available(apiservice):
            return unavailable("service unavailable")
        spec = apiservice.get("spec") or {}
        service = spec.get("service") or {}
        namespace, name = service.get("namespace", ""), service.get("name", "")
        endpoint = self.endpoints.get((namespace, name))
        if endpoint is None:
            return unavailable("service unavailable")
        try:
            ca_bundle = base64.b64decode(spec.get("caBundle") or "").decode()
        except ValueError:
            ca_bundle = ""
        context = self._context(ca_bundle=ca_bundle,
                                insecure=bool(spec.get("insecureSkipTLSVerify")))
        server_name = f"{name}.{namespace}.svc"
        location = f"https://{endpoint.host}:{endpoint.port}{go_escape_path(request.path)}"
        query = go_encode_query(request.query.items())
        if query:
            location += "?" + query
        headers = [(k, v) for k, v in request.headers.items()
                   if k.lower() not in HOP_BY_HOP and k.lower() != "authorization"
                   and k.lower() != "content-length" and not _is_remote_identity_header(k)]
        forwarded = request.remote or "127.0.0.1"
        previous_forwarded = request.headers.get("X-Forwarded-For")
        headers = [(k, v) for k, v in headers if k.lower() != "x-forwarded-for"]
        headers.append(("X-Forwarded-For", f"{previous_forwarded}, {forwarded}"
                        if previous_forwarded else forwarded))
        # transport.go Transport.RoundTrip (the aggregator wraps its transport in it): Set, so
        # whatever a client sent under these names is replaced.
        forwarded_names = {"x-forwarded-uri", "x-forwarded-host", "x-forwarded-proto"}
        headers = [(k, v) for k, v in headers if k.lower() not in forwarded_names]
        headers.append(("X-Forwarded-Uri", forwarded_uri(request.path)))
        host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
        headers.append(("X-Forwarded-Host", f"{host}:{endpoint.port}"))
        headers.append(("X-Forwarded-Proto", "https"))
        headers.extend(identity_headers(identity))
        body = await request.read()
        assert self._session is not None
        try:
            upstream = await self._session.request(
                request.method, yarl.URL(location, encoded=True), headers=headers,
                data=body if body else None, ssl=context,
                server_hostname=None if spec.get("insecureSkipTLSVerify") else server_name,
                allow_redirects=False, skip_auto_headers=("Accept-Encoding", "User-Agent",
                                                          "Content-Type"),
                timeout=aiohttp.ClientTimeout(total=None))
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            message = _go_error(error, endpoint.host, endpoint.port, server_name)
            return unavailable(f"error trying to reach service: {message}")
        try:
            if 300 <= upstream.status <= 399 and upstream.headers.get("Location"):
                refused = web.Response(status=502, text=REDIRECT_REFUSED)
                refused.headers["Content-Type"] = "text/plain; charset=utf-8"  # Go sniffs it
                return refused
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() in CORS_HEADERS:
                    continue
                if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                    response.headers.add(key, value)
            if upstream.headers.get("Content-Length") is not None:
                response.content_length = int(upstream.headers["Content-Length"])
            else:
                response.enable_chunked_encoding()
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response
        finally:
            upstream.release()

    # --- discovery --------------------------------------------------------------------------

    def _priorities(self, apiservice: JSONDict) -> tuple[int, int]:
        spec = apiservice.get("spec") or {}
        return int(spec.get("groupPriorityMinimum", 0)), int(spec.get("versionPriority", 0))

    def groups(self, version_order: Callable[[list[str]], list[str]]) -> list[JSONDict]:
        """APIGroups for /apis, ordered as the aggregator orders them."""
        by_group: dict[str, list[JSONDict]] = {}
        for obj in self.store.items(self.apiservices, None):
            group = (obj.get("spec") or {}).get("group", "")
            if group:
                by_group.setdefault(group, []).append(obj)
        ranked = []
        for group, services in by_group.items():
            priority = max(self._priorities(s)[0] for s in services)
            ranked.append((-priority, group, self.group(group, version_order, services)))
        return [entry for _, _, entry in sorted(ranked, key=lambda r: (r[0], r[1]))]

    def group(self, group: str, version_order: Callable[[list[str]], list[str]],
              services: Sequence[JSONDict] | None = None) -> JSONDict:
        if services is None:
            services = [s for s in self.store.items(self.apiservices, None)
                        if (s.get("spec") or {}).get("group") == group]
        versions = [(s.get("spec") or {}).get("version", "") for s in services]
        priority = {(s.get("spec") or {}).get("version", ""): self._priorities(s)[1]
                    for s in services}
        ordered = version_order(versions)
        ordered.sort(key=lambda v: -priority[v])  # stable: kube-aware order breaks ties
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in ordered]
        return {"name": group, "versions": entries, "preferredVersion": entries[0]}

    def local_apiservice(self, group: str, version: str, *, automanaged: str) -> JSONDict:
        group_priority, version_priority = BUILTIN_PRIORITIES.get((group, version), (1000, 100))
        return {
            "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": f"{version}.{group}" if group else version,
                         "labels": {"kube-aggregator.kubernetes.io/automanaged": automanaged}},
            "spec": {"group": group, "version": version,
                     "groupPriorityMinimum": group_priority, "versionPriority": version_priority},
            "status": {"conditions": [{
                "type": "Available", "status": "True",
                "lastTransitionTime": format_time(self.clock()), "reason": "Local",
                "message": "Local APIServices are always available"}]},
        }


def unavailable(message: str) -> web.Response:
    """http.Error(w, msg, 503): plain text, as the aggregator answers."""
    response = web.Response(status=503, text=message + "\n")
    response.headers["Content-Type"] = "text/plain; charset=utf-8"
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response
