"""A faithful fake kube-apiserver (aiohttp over HTTPS on 127.0.0.1) for tests and the demo.

Use it as ``async with FakeKubeAPI(workdir=path) as kube:``; it needs no pytest.

What it does as kube-apiserver does: bearer-token and client-certificate authentication, an
authorizer hook, a generic object store with one global resourceVersion, GET/LIST (label and
field selectors, paging)/POST (generateName)/PUT/PATCH (merge, JSON, strategic for built-ins,
415 for CRs)/DELETE with Status errors, unknown-field pruning with warnings (fieldValidation),
defaulting of the fields our code reads, status and scale subresources, WATCH with bookmarks,
timeouts and 410 Expired after `compact()`, discovery (CRDs served at once), TokenReview and
SubjectAccessReview with scripted answers, the extension-apiserver-authentication ConfigMap,
an aggregator that proxies APIService groups over TLS with the front-proxy identity, request
recording and fault injection.

Known simplifications (each stricter or equal, never more forgiving, unless said):
* The fake itself authenticates bearer tokens and client certificates (client CA), not the
  front-proxy request headers; anonymous requests get 401 except on /healthz, /livez, /readyz
  and /version.
* Namespaces need not exist unless ``enforce_namespaces=True`` (more forgiving; documented).
* Deletion is immediate: no graceful pod termination, no garbage collection of dependents;
  finalizers are honoured (deletionTimestamp, then removal when the last one goes).
* No controllers run: a scale does not create pods, deployment status is whatever tests set.
* Server-side apply is approximated by a strategic (built-ins) or merge (CRs) patch; no
  managedFields, no conflicts. dryRun=All is honoured on every write (validated, answered,
  nothing stored); other values get kube-apiserver's 422.
* Discovery is served in the legacy form only (clients fall back from aggregated discovery).
* /openapi/v3 lists operations and their query parameters but no schemas (enough for kubectl
  to validate on the server with fieldValidation); /openapi/v2 is 404. Protobuf request bodies
  get 415, so kubectl's imperative generators (`create configmap`, `auth can-i`) fail.
* Quantities are stored as sent (kube-apiserver would canonicalise "1000m" to "1").
* An APIService's Service is resolved through `set_service_endpoint`, not ClusterIP.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import functools
import json
import logging
import re
import secrets
import ssl
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from aiohttp import web

from metricscale import pki
from testbed.fakes import kube_errors as errors
from testbed.fakes import kube_objects
from testbed.fakes.kube_aggregator import Aggregator, ProxyIdentity, ServiceEndpoint
from testbed.fakes.kube_errors import ApiError, FieldError, GroupKind, invalid_value
from testbed.fakes.kube_handlers import (
    RestHandlers,
    WatchSettings,
    json_response,
    parse_api_path,
    sort_versions,
    split_resource_path,
    status_response,
)
from testbed.fakes.kube_objects import Container
from testbed.fakes.kube_resources import ResourceRegistry, resource_type_from_crd
from testbed.fakes.kube_store import ObjectStore, StoreEvent
from testbed.fakes.kube_strategy import apply_defaults, validate
from testbed.faults import (
    DropConnection,
    Fault,
    FaultAction,
    Latency,
    ServerError,
    StallWatch,
    TooManyRequests,
)

JSONDict = dict[str, Any]
log = logging.getLogger(__name__)

__all__ = [
    "DropConnection",
    "FakeKubeAPI",
    "Fault",
    "Identity",
    "Latency",
    "RecordedRequest",
    "RequestAttributes",
    "ServerError",
    "StallWatch",
    "TooManyRequests",
]

KUBERNETES_VERSION = {"major": "1", "minor": "36", "gitVersion": "v1.36.0-fake",
                      "gitCommit": "0000000000000000000000000000000000000000",
                      "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
                      "goVersion": "go1.25.0", "compiler": "gc", "platform": "linux/amd64"}
PUBLIC_PATHS = ("/healthz", "/livez", "/readyz", "/version", "/version/")
SERVER_NAMES = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local")
API_AUDIENCE = "https://kubernetes.default.svc.cluster.local"
FRONT_PROXY_CLIENT = "front-proxy-client"
ADMIN_USER = "kubernetes-admin"
ADMIN_GROUPS = ("system:masters",)
CERT_VALIDITY = timedelta(days=365)


def utc_now() -> datetime:
    return datetime.now(UTC)


# --- identities, requests, faults -------------------------------------------------------------


@dataclass(frozen=True)
class Identity:
    """An authenticated user (user.Info)."""

    user: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def user_info(self) -> JSONDict:
        info: JSONDict = {"username": self.user}
        if self.uid:
            info["uid"] = self.uid
        if self.groups:
            info["groups"] = list(self.groups)
        if self.extra:
            info["extra"] = {k: list(v) for k, v in self.extra.items()}
        return info


def _with_authenticated(groups: Sequence[str]) -> tuple[str, ...]:
    if "system:authenticated" in groups or "system:unauthenticated" in groups:
        return tuple(groups)
    return (*groups, "system:authenticated")


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the fake received it (Authorization values redacted)."""

    method: str
    path: str
    query: tuple[tuple[str, str], ...]
    headers: tuple[tuple[str, str], ...]
    time: datetime
    user: str | None = None
    code: int | None = None  # the answer's status code, once answered
    message: str | None = None  # a failure Status's message

    def param(self, name: str) -> str | None:
        return next((v for k, v in self.query if k == name), None)

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


@dataclass(frozen=True)
class RequestAttributes:
    """authorizer.Attributes of a request (RequestInfoFactory + user)."""

    user: Identity
    verb: str
    path: str
    resource_request: bool
    api_group: str = ""
    api_version: str = ""
    namespace: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""


Decision = bool | tuple[bool, str]
Authorizer = Callable[[RequestAttributes], Decision]


# --- certificates, generated once per process -------------------------------------------------


@dataclass(frozen=True)
class _Material:
    serving_ca: pki.CertifiedKey
    serving: pki.CertifiedKey
    client_ca: pki.CertifiedKey
    admin: pki.CertifiedKey
    front_proxy_ca: pki.CertifiedKey
    front_proxy_client: pki.CertifiedKey


@functools.cache
def _material() -> _Material:
    now = utc_now() - timedelta(minutes=1)
    serving_ca = pki.generate_ca(common_name="fake-kube-apiserver-ca", now=now,
                                 validity=CERT_VALIDITY)
    client_ca = pki.generate_ca(common_name="fake-kube-client-ca", now=now,
                                validity=CERT_VALIDITY)
    front_proxy_ca = pki.generate_ca(common_name="front-proxy-ca", now=now,
                                     validity=CERT_VALIDITY)
    return _Material(
        serving_ca=serving_ca,
        serving=pki.issue_serving_certificate(serving_ca, common_name="kube-apiserver",
                                              dns_names=SERVER_NAMES,
                                              ip_addresses=["127.0.0.1", "10.96.0.1"],
                                              now=now, validity=CERT_VALIDITY),
        client_ca=client_ca,
        admin=pki.issue_client_certificate(client_ca, user=ADMIN_USER, groups=ADMIN_GROUPS,
                                           now=now, validity=CERT_VALIDITY),
        front_proxy_ca=front_proxy_ca,
        front_proxy_client=pki.issue_client_certificate(front_proxy_ca, user=FRONT_PROXY_CLIENT,
                                                        now=now, validity=CERT_VALIDITY),
    )


# --- the server ---------------------------------------------------------------------------------

TokenReviewAnswer = Callable[[JSONDict], JSONDict]
SubjectAccessReviewAnswer = Callable[[JSONDict], JSONDict]


class FakeKubeAPI:
    """A kube-apiserver stand-in. Start with ``async with`` (or ``await start()``/``stop()``).

    Every public attribute below is part of the contract other tests build on.
    """

    def __init__(self, *, workdir: Path, clock: Callable[[], datetime] = utc_now,
                 bookmark_interval: float = 60.0, watch_timeout: float = 1800.0,
                 enforce_namespaces: bool = False, availability_max_backoff: float = 30.0,
                 availability_resync: float = 30.0, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.workdir = Path(workdir)
        self.clock = clock
        self.enforce_namespaces = enforce_namespaces
        self.host = host
        self._port = port
        self.registry = ResourceRegistry()
        self.store = ObjectStore(self.registry, clock=clock)
        self.watch_settings = WatchSettings(bookmark_interval=bookmark_interval,
                                            default_timeout=watch_timeout)
        self.requests: list[RecordedRequest] = []
        self.token_reviews: list[JSONDict] = []
        self.subject_access_reviews: list[JSONDict] = []
        self.self_subject_access_reviews: list[JSONDict] = []
        self.faults: list[Fault] = []
        # Scripted answers: each gets the request body and returns the `status` to send.
        self.token_review_answer: TokenReviewAnswer | None = None
        self.subject_access_review_answer: SubjectAccessReviewAnswer | None = None
        # The fake's own authorizer (RBAC stand-in); also answers SARs unless scripted.
        self.authorizer: Authorizer = lambda attributes: True
        self.admin_token = "admin-" + secrets.token_hex(16)
        self._tokens: dict[str, Identity] = {
            self.admin_token: Identity(ADMIN_USER, _with_authenticated(ADMIN_GROUPS))}
        material = _material()
        self._front_proxy_ca = material.front_proxy_ca
        self._front_proxy_client = material.front_proxy_client
        self._front_proxy_bundle: list[pki.CertifiedKey] = [material.front_proxy_ca]
        self._front_proxy_generation = 0
        self._closing = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._started = False
        self.aggregator = Aggregator(store=self.store, registry=self.registry, clock=clock,
                                     front_proxy=self._front_proxy_files,
                                     max_backoff=availability_max_backoff,
                                     resync=availability_resync)
        self.rest = RestHandlers(
            store=self.store, registry=self.registry, clock=clock, watch=self.watch_settings,
            closing=self._closing, enforce_namespaces=lambda: self.enforce_namespaces,
            reviews={"tokenreviews": self._token_review,
                     "subjectaccessreviews": self._subject_access_review,
                     "selfsubjectaccessreviews": self._self_subject_access_review,
                     "selfsubjectreviews": self._self_subject_review})
        self._unsubscribe_crds = self.store.subscribe(self._on_store_event)
        self._pending: set[asyncio.Handle] = set()
        self._pods_created = 0  # create_pod's IP counter (listing every pod made it O(n^2))

    # --- files and URLs ---------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self._port}"

    @property
    def ca_file(self) -> Path:
        """CA bundle that verifies the fake's serving certificate."""
        return self.workdir / "ca.crt"

    @property
    def client_ca_file(self) -> Path:
        """CA that signs client certificates the fake accepts (the ConfigMap's client-ca-file)."""
        return self.workdir / "client-ca.crt"

    @property
    def front_proxy_ca_file(self) -> Path:
        """The current requestheader-client-ca-file bundle."""
        return self.workdir / "front-proxy-ca.crt"

    @property
    def front_proxy_ca_pem(self) -> bytes:
        return b"".join(ca.certificate_pem for ca in self._front_proxy_bundle)

    @property
    def client_ca_pem(self) -> bytes:
        return _material().client_ca.certificate_pem

    @property
    def ca_pem(self) -> bytes:
        return _material().serving_ca.certificate_pem

    def _front_proxy_files(self) -> tuple[str, str]:
        suffix = f"-{self._front_proxy_generation}" if self._front_proxy_generation else ""
        cert = self.workdir / f"front-proxy-client{suffix}.crt"
        key = self.workdir / f"front-proxy-client{suffix}.key"
        if not cert.exists():
            pki.write_certificate(cert, self._front_proxy_client.certificate)
            pki.write_private_key(key, self._front_proxy_client.private_key)
        return str(cert), str(key)

    def front_proxy_client_certificate(self) -> tuple[Path, Path]:
        """(cert, key) files of the aggregator's current front-proxy client certificate, for
        tests that play the aggregator themselves."""
        cert, key = self._front_proxy_files()
        return Path(cert), Path(key)

    def issue_front_proxy_client_certificate(self, *, common_name: str = FRONT_PROXY_CLIENT,
                                             name: str | None = None) -> tuple[Path, Path]:
        """Another client certificate signed by the current front-proxy CA (e.g. with a CN
        that requestheader-allowed-names does not allow): (cert, key) paths."""
        leaf = pki.issue_client_certificate(self._front_proxy_ca, user=common_name,
                                            now=utc_now() - timedelta(minutes=1),
                                            validity=CERT_VALIDITY)
        stem = name or re.sub(r"[^A-Za-z0-9_.-]", "_", common_name)
        cert = pki.write_certificate(self.workdir / f"front-proxy-{stem}.crt", leaf.certificate)
        key = pki.write_private_key(self.workdir / f"front-proxy-{stem}.key", leaf.private_key)
        return cert, key

    def _write_files(self) -> None:
        material = _material()
        self.workdir.mkdir(parents=True, exist_ok=True)
        pki.write_certificate(self.ca_file, material.serving_ca.certificate)
        pki.write_certificate(self.workdir / "apiserver.crt", material.serving.certificate)
        pki.write_private_key(self.workdir / "apiserver.key", material.serving.private_key)
        pki.write_certificate(self.client_ca_file, material.client_ca.certificate)
        pki.write_certificate(self.workdir / "admin.crt", material.admin.certificate)
        pki.write_private_key(self.workdir / "admin.key", material.admin.private_key)
        self.front_proxy_ca_file.write_bytes(self.front_proxy_ca_pem)
        self._front_proxy_files()

    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.workdir / "apiserver.crt", self.workdir / "apiserver.key")
        # Client certificates are optional; a presented one must chain to the client CA.
        context.verify_mode = ssl.CERT_OPTIONAL
        context.load_verify_locations(cadata=self.client_ca_pem.decode())
        return context

    # --- lifecycle --------------------------------------------------------------------------

    async def __aenter__(self) -> FakeKubeAPI:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, traceback: TracebackType | None) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._started:
            raise RuntimeError("FakeKubeAPI already started")
        self._started = True
        self._write_files()
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # handler_cancellation: a watch handler ends as soon as its client goes away.
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     shutdown_timeout=1.0, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self._port, ssl_context=self._ssl_context())
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.base_events.Server)
        self._port = server.sockets[0].getsockname()[1]
        self._seed()
        await self.aggregator.start()
        log.debug("fake kube-apiserver listening on %s", self.url)

    async def stop(self) -> None:
        self._closing.set()
        self.rest.wake_watchers()
        for handle in list(self._pending):
            handle.cancel()
        await self.aggregator.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._unsubscribe_crds()

    def _seed(self) -> None:
        """What a fresh cluster has: namespaces, the auth ConfigMap, local APIServices."""
        for name in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self._admit_create("", "v1", "namespaces", kube_objects.namespace(name))
        self._admit_create("", "v1", "services", {
            "metadata": {"name": "kubernetes", "namespace": "default",
                         "labels": {"component": "apiserver", "provider": "kubernetes"}},
            "spec": {"clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1"],
                     "ports": [{"name": "https", "port": 443, "targetPort": 6443}]}})
        self.store.create("", "v1", "configmaps", self._authentication_configmap())
        for group, versions in self.registry.group_versions().items():
            for version in versions:
                self.store.create("apiregistration.k8s.io", "v1", "apiservices",
                                  self.aggregator.local_apiservice(group, version,
                                                                   automanaged="onstart"))

    def _authentication_configmap(self) -> JSONDict:
        """As kube-apiserver's cluster-authentication-trust controller writes it."""
        return {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "extension-apiserver-authentication",
                         "namespace": "kube-system"},
            "data": {
                "client-ca-file": self.client_ca_pem.decode(),
                "requestheader-allowed-names": json.dumps([FRONT_PROXY_CLIENT]),
                "requestheader-client-ca-file": self.front_proxy_ca_pem.decode(),
                "requestheader-extra-headers-prefix": json.dumps(["X-Remote-Extra-"]),
                "requestheader-group-headers": json.dumps(["X-Remote-Group"]),
                "requestheader-username-headers": json.dumps(["X-Remote-User"]),
            },
        }

    def rotate_front_proxy_ca(self, *, keep_old: bool = True) -> None:
        """New front-proxy CA and client cert; the ConfigMap is rewritten (watchers see
        MODIFIED). With `keep_old` the bundle holds new and old CA, as during a real rotation."""
        now = utc_now() - timedelta(minutes=1)
        new_ca = pki.generate_ca(common_name=f"front-proxy-ca-{self._front_proxy_generation + 1}",
                                 now=now, validity=CERT_VALIDITY)
        self._front_proxy_ca = new_ca
        self._front_proxy_client = pki.issue_client_certificate(
            new_ca, user=FRONT_PROXY_CLIENT, now=now, validity=CERT_VALIDITY)
        self._front_proxy_bundle = [new_ca, *self._front_proxy_bundle] if keep_old else [new_ca]
        self._front_proxy_generation += 1
        self.front_proxy_ca_file.write_bytes(self.front_proxy_ca_pem)
        self._front_proxy_files()

        def change(obj: JSONDict) -> None:
            obj["data"]["requestheader-client-ca-file"] = self.front_proxy_ca_pem.decode()
        self.store.mutate("", "v1", "configmaps", "extension-apiserver-authentication", change,
                          namespace="kube-system")

    # --- users, kubeconfig, clients ---------------------------------------------------------

    def add_user(self, *, token: str, username: str, groups: Sequence[str] = (), uid: str = "",
                 extra: Mapping[str, Sequence[str]] | None = None) -> Identity:
        """Register a bearer token; `system:authenticated` is added as the apiserver adds it."""
        identity = Identity(username, _with_authenticated(groups), uid,
                            {k: tuple(v) for k, v in (extra or {}).items()})
        self._tokens[token] = identity
        return identity

    def remove_user(self, token: str) -> None:
        self._tokens.pop(token, None)

    def issue_client_certificate(self, *, username: str, groups: Sequence[str] = (),
                                 name: str | None = None) -> tuple[Path, Path]:
        """A client certificate (and key) signed by the fake's client CA: (cert, key) paths."""
        material = _material()
        leaf = pki.issue_client_certificate(material.client_ca, user=username, groups=groups,
                                            now=utc_now() - timedelta(minutes=1),
                                            validity=CERT_VALIDITY)
        stem = name or re.sub(r"[^A-Za-z0-9_.-]", "_", username)
        cert = pki.write_certificate(self.workdir / f"client-{stem}.crt", leaf.certificate)
        key = pki.write_private_key(self.workdir / f"client-{stem}.key", leaf.private_key)
        return cert, key

    def write_kubeconfig(self, path: Path, *, token: str | None = None,
                         client_certificate: tuple[Path, Path] | None = None,
                         namespace: str | None = None) -> Path:
        """A kubeconfig for kubectl and kubernetes_asyncio (admin token unless told)."""
        user: JSONDict
        if client_certificate is not None:
            user = {"client-certificate": str(Path(client_certificate[0]).resolve()),
                    "client-key": str(Path(client_certificate[1]).resolve())}
        else:
            user = {"token": token or self.admin_token}
        context: JSONDict = {"cluster": "fake", "user": "fake-user"}
        if namespace:
            context["namespace"] = namespace
        config = {
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": "fake", "cluster": {
                "server": self.url, "certificate-authority": str(self.ca_file.resolve())}}],
            "users": [{"name": "fake-user", "user": user}],
            "contexts": [{"name": "fake", "context": context}],
            "current-context": "fake",
        }
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)
        return path

    def api_client_configuration(self, token: str | None = None) -> Any:
        """A kubernetes_asyncio.client.Configuration for this server (admin token unless told)."""
        from kubernetes_asyncio.client import Configuration

        configuration = Configuration(host=self.url)
        configuration.ssl_ca_cert = str(self.ca_file)
        configuration.api_key = {"BearerToken": token or self.admin_token}
        configuration.api_key_prefix = {"BearerToken": "Bearer"}
        return configuration

    # --- faults and recordings --------------------------------------------------------------

    def add_fault(self, path: str, action: FaultAction, *, method: str | None = None,
                  times: int | None = 1) -> Fault:
        """Inject `action` on requests whose path matches the regex `path` (re.search),
        `times` times (None: until removed)."""
        fault = Fault(re.compile(path), action, method, times)
        self.faults.append(fault)
        return fault

    def remove_fault(self, fault: Fault) -> None:
        if fault in self.faults:
            self.faults.remove(fault)

    def clear_faults(self) -> None:
        self.faults.clear()

    def requests_to(self, path: str, *, method: str | None = None) -> list[RecordedRequest]:
        """Recorded requests whose path matches the regex `path` (re.search)."""
        pattern = re.compile(path)
        return [r for r in self.requests if pattern.search(r.path)
                and (method is None or r.method == method.upper())]

    def compact(self, to_resource_version: int | None = None) -> int:
        """Compact the watch history (default: up to now); older watches get 410 Expired."""
        return self.store.compact(to_resource_version)

    @property
    def resource_version(self) -> int:
        return self.store.resource_version

    # --- aggregator -------------------------------------------------------------------------

    def set_service_endpoint(self, namespace: str, name: str, host: str, port: int) -> None:
        """Where Service namespace/name is reachable (stands in for ClusterIP resolution)."""
        self.aggregator.set_endpoint(namespace, name, ServiceEndpoint(host, port))

    def remove_service_endpoint(self, namespace: str, name: str) -> None:
        self.aggregator.set_endpoint(namespace, name, None)

    async def wait_for_apiservice(self, name: str, *, available: bool = True,
                                  reason: str | None = None, within: float = 10.0) -> JSONDict:
        """Wait until APIService `name` is (or is not) Available, optionally for a given
        condition reason (e.g. "FailedDiscoveryCheck"); returns it."""
        async def poll() -> JSONDict:
            while True:
                obj = self.store.try_get("apiregistration.k8s.io", "v1", "apiservices", name)
                condition = self.aggregator.available_condition(obj) if obj else None
                if obj is not None and condition is not None and \
                        (condition.get("status") == "True") == available and \
                        reason in (None, condition.get("reason")):
                    return obj
                await asyncio.sleep(0.01)
        try:
            return await asyncio.wait_for(poll(), within)
        except TimeoutError:
            obj = self.store.try_get("apiregistration.k8s.io", "v1", "apiservices", name)
            raise AssertionError(f"APIService {name} did not become "
                                 f"{'Available' if available else 'unavailable'} within "
                                 f"{within}s: {json.dumps((obj or {}).get('status'))}") from None

    # --- object helpers (bypass HTTP, as etcd writes would) ---------------------------------

    def _admit_create(self, group: str, version: str, resource: str, obj: JSONDict,
                      *, namespace: str | None = None) -> JSONDict:
        """Create with defaults and validation, but keep the status given (test set-up)."""
        resource_type = self.registry.resolve(group, version, resource)
        if resource_type is None:
            raise KeyError(f"the fake does not serve {resource} in {group or 'core'}/{version}")
        obj = copy.deepcopy(obj)
        obj.setdefault("apiVersion", resource_type.api_version(version))
        obj.setdefault("kind", resource_type.kind)
        if namespace is not None:
            obj.setdefault("metadata", {})["namespace"] = namespace
        stored = resource_type.convert_from(obj, version)
        apply_defaults(resource_type, stored)
        problems: list[FieldError] = validate(resource_type, stored, None, request_group=group)
        if problems:
            raise errors.invalid(resource_type.group_kind,
                                 (obj.get("metadata") or {}).get("name", ""), problems)
        return self.store.create(group, version, resource,
                                 resource_type.convert_to(stored, version))

    def create(self, group: str, version: str, resource: str, obj: JSONDict, *,
               namespace: str | None = None) -> JSONDict:
        """Create any object (defaults and validation applied, status kept)."""
        return self._admit_create(group, version, resource, obj, namespace=namespace)

    def create_namespace(self, name: str, *, labels: Mapping[str, str] | None = None
                         ) -> JSONDict:
        return self._admit_create("", "v1", "namespaces",
                                  kube_objects.namespace(name, labels=labels))

    def create_pod(self, name: str, *, namespace: str = "default",
                   labels: Mapping[str, str] | None = None, phase: str = "Running",
                   ready: bool = True, cpu_request: str | None = "100m",
                   memory_request: str | None = None,
                   containers: Sequence[Container] | None = None, node_name: str = "node-1",
                   pod_ip: str | None = None, started: datetime | None = None,
                   ready_since: datetime | None = None,
                   owner: Mapping[str, str] | None = None) -> JSONDict:
        """A pod as kubelet reports it (phase, Ready condition with lastTransitionTime,
        startTime, containers with resource requests)."""
        if containers is None:
            containers = (Container(cpu_request=cpu_request, memory_request=memory_request),)
        count = self._pods_created
        self._pods_created += 1
        obj = kube_objects.pod(name, namespace=namespace, now=self.clock(), labels=labels,
                               containers=containers, phase=phase, ready=ready,
                               node_name=node_name,
                               pod_ip=pod_ip or f"10.244.{count // 250}.{count % 250 + 2}",
                               started=started, ready_since=ready_since, owner=owner)
        return self._admit_create("", "v1", "pods", obj)

    def create_deployment(self, name: str, *, namespace: str = "default", replicas: int = 1,
                          labels: Mapping[str, str] | None = None,
                          cpu_request: str | None = "100m",
                          containers: Sequence[Container] | None = None,
                          ready_replicas: int | None = None,
                          status_replicas: int | None = None) -> JSONDict:
        """A deployment with a settled status (status.replicas = spec.replicas unless told)."""
        if containers is None:
            containers = (Container(cpu_request=cpu_request),)
        obj = kube_objects.deployment(name, namespace=namespace, replicas=replicas,
                                      now=self.clock(), labels=labels,
                                      containers=containers, ready_replicas=ready_replicas,
                                      status_replicas=status_replicas)
        return self._admit_create("apps", "v1", "deployments", obj)

    def create_crd(self, *, group: str, kind: str, plural: str,
                   versions: Sequence[str] = ("v1",), scope: str = "Namespaced",
                   schema: Mapping[str, Any] | None = None, status_subresource: bool = True,
                   scale: Mapping[str, str] | None = None,
                   short_names: Sequence[str] = ()) -> JSONDict:
        """A CRD, served (and discovered) at once."""
        obj = kube_objects.crd(group=group, kind=kind, plural=plural, versions=versions,
                               scope=scope, schema=schema, status_subresource=status_subresource,
                               scale=scale, short_names=short_names)
        return self._admit_create("apiextensions.k8s.io", "v1", "customresourcedefinitions", obj)

    def create_apiservice(self, *, group: str, version: str, service_namespace: str,
                          service_name: str, port: int = 443, ca_bundle: bytes | None = None,
                          insecure: bool = False, group_priority: int = 100,
                          version_priority: int = 100) -> JSONDict:
        obj = kube_objects.apiservice(group=group, version=version,
                                      service_namespace=service_namespace,
                                      service_name=service_name, port=port, ca_bundle=ca_bundle,
                                      insecure=insecure, group_priority=group_priority,
                                      version_priority=version_priority)
        return self._admit_create("apiregistration.k8s.io", "v1", "apiservices", obj)

    # --- CRDs become served kinds ------------------------------------------------------------

    def _on_store_event(self, event: StoreEvent) -> None:
        if (event.key.group, event.key.resource) != ("apiextensions.k8s.io",
                                                     "customresourcedefinitions"):
            return
        crd = event.object
        spec = crd.get("spec") or {}
        group, plural = spec.get("group", ""), (spec.get("names") or {}).get("plural", "")
        if event.type == "DELETED":
            resource_type = next((t for t in self.registry.types
                                  if t.group == group and t.resource == plural and
                                  not t.builtin), None)
            self.registry.remove(group, plural)
            if resource_type is not None:
                self._later(lambda: self._drop_custom_resources(resource_type.storage_key))
            self._later(self._sync_crd_apiservices)
            return
        self.registry.add(resource_type_from_crd(crd))
        if event.type == "ADDED" or (event.previous or {}).get("spec") != spec:
            self._later(lambda: self._accept_crd(event.name))
            self._later(self._sync_crd_apiservices)

    def _later(self, callback: Callable[[], None]) -> None:
        """Run a follow-up write after the current one has been fully dispatched."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            callback()
            return

        def run() -> None:
            self._pending.discard(handle)
            if not self._closing.is_set():
                callback()
        handle = loop.call_soon(run)
        self._pending.add(handle)

    def _accept_crd(self, name: str) -> None:
        """What the CRD controllers write: accepted names, Established, stored versions."""
        crd = self.store.try_get("apiextensions.k8s.io", "v1", "customresourcedefinitions", name)
        if crd is None:
            return
        spec = crd.get("spec") or {}
        now = utc_now().strftime("%Y-%m-%dT%H:%M:%SZ")
        storage = [v["name"] for v in spec.get("versions") or [] if v.get("storage")]
        status = {
            "acceptedNames": copy.deepcopy(spec.get("names") or {}),
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "lastTransitionTime": now,
                 "reason": "NoConflicts", "message": "no conflicts found"},
                {"type": "Established", "status": "True", "lastTransitionTime": now,
                 "reason": "InitialNamesAccepted", "message": "the initial names have been "
                                                             "accepted"},
            ],
            "storedVersions": sorted(set((crd.get("status") or {}).get("storedVersions", [])
                                         + storage)),
        }
        if crd.get("status") == status:
            return
        crd["status"] = status
        crd["metadata"].pop("resourceVersion", None)
        self.store.update("apiextensions.k8s.io", "v1", "customresourcedefinitions", crd)

    def _sync_crd_apiservices(self) -> None:
        """The crd-autoregister controller: one local APIService per served CRD group/version."""
        wanted: set[tuple[str, str]] = set()
        for resource_type in self.registry.types:
            if not resource_type.builtin:
                wanted.update((resource_type.group, v) for v in resource_type.versions)
        builtin = {(t.group, v) for t in self.registry.types if t.builtin for v in t.versions}
        for obj in self.store.list("apiregistration.k8s.io", "v1", "apiservices"):
            spec = obj.get("spec") or {}
            key = (spec.get("group", ""), spec.get("version", ""))
            labels = (obj.get("metadata") or {}).get("labels") or {}
            if labels.get("kube-aggregator.kubernetes.io/automanaged") == "true" and \
                    key not in wanted:
                self.store.delete("apiregistration.k8s.io", "v1", "apiservices",
                                  obj["metadata"]["name"])
            wanted.discard(key)
        for group, version in sorted(wanted - builtin):
            if self.aggregator.find(group, version) is None:
                self.store.create("apiregistration.k8s.io", "v1", "apiservices",
                                  self.aggregator.local_apiservice(group, version,
                                                                   automanaged="true"))

    def _drop_custom_resources(self, key: errors.GroupResource) -> None:
        bucket = self.store.bucket(key)
        for (namespace, name), obj in list(bucket.items()):
            api_version = obj.get("apiVersion", "")
            group, _, version = api_version.rpartition("/")
            resource_type = self.registry.resolve(group, version, key.resource)
            if resource_type is None:
                del bucket[(namespace, name)]

    # --- reviews ----------------------------------------------------------------------------

    async def _token_review(self, raw: JSONDict, body: JSONDict, caller: Identity
                            ) -> JSONDict:
        self.token_reviews.append(copy.deepcopy(raw))
        spec = body.get("spec") or {}
        if not spec.get("token"):
            raise errors.bad_request("token is required for TokenReview in authentication")
        if self.token_review_answer is not None:
            status = self.token_review_answer(copy.deepcopy(raw))
        else:
            identity = self._tokens.get(spec["token"])
            if identity is None:
                status = {"user": {}}
            else:
                audiences = spec.get("audiences") or [API_AUDIENCE]
                status = {"authenticated": True, "user": identity.user_info(),
                          "audiences": list(audiences)}
        return {"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
                "metadata": {"creationTimestamp": None}, "spec": spec, "status": status}

    def _decide(self, attributes: RequestAttributes) -> tuple[bool, str]:
        decision = self.authorizer(attributes)
        if isinstance(decision, tuple):
            return bool(decision[0]), str(decision[1])
        return bool(decision), ""

    @staticmethod
    def _attributes_from_spec(spec: JSONDict, user: Identity) -> RequestAttributes:
        resource = spec.get("resourceAttributes")
        if resource is not None:
            return RequestAttributes(
                user=user, verb=resource.get("verb", ""), path="", resource_request=True,
                api_group=resource.get("group", ""), api_version=resource.get("version", ""),
                namespace=resource.get("namespace", ""), resource=resource.get("resource", ""),
                subresource=resource.get("subresource", ""), name=resource.get("name", ""))
        non_resource = spec.get("nonResourceAttributes") or {}
        return RequestAttributes(user=user, verb=non_resource.get("verb", ""),
                                 path=non_resource.get("path", ""), resource_request=False)

    async def _subject_access_review(self, raw: JSONDict, body: JSONDict, caller: Identity
                                     ) -> JSONDict:
        self.subject_access_reviews.append(copy.deepcopy(raw))
        spec = body.get("spec") or {}
        problems: list[FieldError] = []
        has_resource = spec.get("resourceAttributes") is not None
        has_non_resource = spec.get("nonResourceAttributes") is not None
        if has_resource and has_non_resource:
            problems.append(invalid_value("spec.nonResourceAttributes",
                                          spec["nonResourceAttributes"],
                                          "cannot be specified in combination with "
                                          "resourceAttributes"))
        if not has_resource and not has_non_resource:
            problems.append(invalid_value("spec.resourceAttributes", None,
                                          "exactly one of nonResourceAttributes or "
                                          "resourceAttributes must be specified"))
        if not spec.get("user") and not spec.get("groups"):
            problems.append(invalid_value("spec.user", spec.get("user", ""),
                                          "at least one of user or group must be specified"))
        if problems:
            raise errors.invalid(GroupKind("authorization.k8s.io", "SubjectAccessReview"), "",
                                 problems)
        if self.subject_access_review_answer is not None:
            status = self.subject_access_review_answer(copy.deepcopy(raw))
        else:
            user = Identity(spec.get("user", ""), tuple(spec.get("groups") or ()),
                            spec.get("uid", ""),
                            {k: tuple(v) for k, v in (spec.get("extra") or {}).items()})
            allowed, reason = self._decide(self._attributes_from_spec(spec, user))
            status = {"allowed": allowed}
            if reason:
                status["reason"] = reason
        return {"kind": "SubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
                "metadata": {"creationTimestamp": None}, "spec": spec, "status": status}

    async def _self_subject_access_review(self, raw: JSONDict, body: JSONDict, caller: Identity
                                          ) -> JSONDict:
        self.self_subject_access_reviews.append(copy.deepcopy(raw))
        spec = body.get("spec") or {}
        allowed, reason = self._decide(self._attributes_from_spec(spec, caller))
        status: JSONDict = {"allowed": allowed}
        if reason:
            status["reason"] = reason
        return {"kind": "SelfSubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
                "metadata": {"creationTimestamp": None}, "spec": spec, "status": status}

    async def _self_subject_review(self, raw: JSONDict, body: JSONDict, caller: Identity
                                   ) -> JSONDict:
        return {"kind": "SelfSubjectReview", "apiVersion": "authentication.k8s.io/v1",
                "metadata": {"creationTimestamp": None},
                "status": {"userInfo": caller.user_info()}}

    # --- request pipeline -------------------------------------------------------------------

    def _record(self, request: web.Request) -> tuple[RecordedRequest, int]:
        """Log the request; returns it and its position, for `_amend`."""
        headers = tuple((k, "<redacted>" if k.lower() == "authorization" else v)
                        for k, v in request.headers.items())
        recorded = RecordedRequest(request.method, request.path, tuple(request.query.items()),
                                   headers, self.clock())
        self.requests.append(recorded)
        return recorded, len(self.requests) - 1

    def _amend(self, recorded: RecordedRequest, position: int,
               **changes: Any) -> RecordedRequest:
        """Replace a logged request with a copy carrying `changes`, found by identity at the
        position it was logged at (searched backwards if a test trimmed the log since): never
        a scan of the whole log per request."""
        log = self.requests
        amended = dataclasses.replace(recorded, **changes)
        if not (position < len(log) and log[position] is recorded):
            position = next((i for i in range(min(position, len(log) - 1), -1, -1)
                             if log[i] is recorded), -1)
            if position < 0:
                return amended  # cleared by the test meanwhile
        log[position] = amended
        return amended

    @staticmethod
    def _failure_message(response: web.StreamResponse) -> str | None:
        if response.status < 400 or not isinstance(response, web.Response):
            return None
        body = response.body
        if not isinstance(body, bytes):
            return None
        try:
            decoded = json.loads(body)
        except ValueError:
            return body.decode(errors="replace")
        return str(decoded.get("message")) if isinstance(decoded, dict) else None

    def _fault_for(self, request: web.Request) -> Fault | None:
        for fault in self.faults:
            if fault.matches(request.method, request.path):
                fault.hits += 1
                if fault.remaining is not None:
                    fault.remaining -= 1
                return fault
        return None

    def _authenticate(self, request: web.Request) -> Identity:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        if peer:
            # x509 comes first in kube-apiserver's union; the TLS layer has verified the chain.
            common_name = ""
            organizations: list[str] = []
            for rdn in peer.get("subject", ()):
                for key, value in rdn:
                    if key == "commonName":
                        common_name = value
                    elif key == "organizationName":
                        organizations.append(value)
            if common_name:
                return Identity(common_name, _with_authenticated(organizations))
        header = request.headers.get("Authorization", "")
        if header:
            scheme, _, token = header.partition(" ")
            token = token.strip()
            if scheme.lower() == "bearer" and token:
                identity = self._tokens.get(token)
                if identity is not None:
                    return identity
                raise errors.unauthorized()
            if scheme.lower() != "bearer":
                raise errors.unauthorized()
        if request.path in PUBLIC_PATHS:
            return Identity("system:anonymous", ("system:unauthenticated",))
        raise errors.unauthorized()

    @staticmethod
    def _request_attributes(request: web.Request, identity: Identity) -> RequestAttributes:
        """RequestInfoFactory.NewRequestInfo, reduced to what the authorizer sees."""
        method_verbs = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update",
                        "PATCH": "patch", "DELETE": "delete"}
        verb = method_verbs.get(request.method, request.method.lower())
        parsed = parse_api_path(request.path)
        if parsed is None:
            return RequestAttributes(identity, request.method.lower(), request.path, False)
        group, version, rest = parsed
        path = split_resource_path(group, version, rest)
        if path is None:
            return RequestAttributes(identity, request.method.lower(), request.path, False)
        if path.is_collection:
            if verb == "get":
                verb = "watch" if (request.query.get("watch") or "").lower() in ("true", "1") \
                    else "list"
            elif verb == "delete":
                verb = "deletecollection"
        if path.namespace is None and path.resource == "namespaces":
            namespace = path.name
        else:
            namespace = path.namespace or ""
        return RequestAttributes(identity, verb, request.path, True, group, version, namespace,
                                 path.resource, path.subresource, path.name)

    def _authorize(self, attributes: RequestAttributes) -> None:
        user = attributes.user
        if "system:masters" in user.groups:
            return
        if user.user == "system:anonymous":
            if not attributes.resource_request and attributes.path in PUBLIC_PATHS:
                return
            allowed, reason = False, ""
        else:
            allowed, reason = self._decide(attributes)
        if allowed:
            return
        if attributes.resource_request:
            gr = errors.GroupResource(attributes.api_group, attributes.resource)
            subject = f'{gr} "{attributes.name}"' if attributes.name else str(gr)
            resource = attributes.resource + (f"/{attributes.subresource}"
                                              if attributes.subresource else "")
            scope = (f'in the namespace "{attributes.namespace}"' if attributes.namespace
                     else "at the cluster scope")
            message = (f'{subject} is forbidden: User "{user.user}" cannot {attributes.verb} '
                       f'resource "{resource}" in API group "{attributes.api_group}" {scope}')
            if reason:
                message += f": {reason}"
            raise errors.forbidden_error(message, name=attributes.name,
                                         group=attributes.api_group, kind=attributes.resource)
        message = f'forbidden: User "{user.user}" cannot {attributes.verb} path "{attributes.path}"'
        if reason:
            message += f": {reason}"
        raise errors.forbidden_error(message)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        recorded, position = self._record(request)
        audit_id = request.headers.get("Audit-Id") or str(uuid.uuid4())
        stall = False
        fault = self._fault_for(request)
        if fault is not None:
            action = fault.action
            if isinstance(action, Latency):
                await asyncio.sleep(action.seconds)
            elif isinstance(action, TooManyRequests):
                refused = status_response(errors.too_many_requests(action.retry_after))
                self._amend(recorded, position, code=refused.status,
                            message=self._failure_message(refused))
                return refused
            elif isinstance(action, ServerError):
                failed = status_response(errors.generic_server_error(action.code, action.message))
                self._amend(recorded, position, code=failed.status,
                            message=self._failure_message(failed))
                return failed
            elif isinstance(action, DropConnection):
                if request.transport is not None:
                    request.transport.abort()
                return web.Response(status=500)
            elif isinstance(action, StallWatch):
                stall = True
        try:
            identity = self._authenticate(request)
            recorded = self._amend(recorded, position, user=identity.user)
            attributes = self._request_attributes(request, identity)
            self._authorize(attributes)
            response = await self._dispatch(request, identity, stall)
        except ApiError as error:
            response = status_response(error)
        if not response.prepared:
            response.headers["Audit-Id"] = audit_id
        self._amend(recorded, position, code=response.status,
                    message=self._failure_message(response))
        return response

    async def _dispatch(self, request: web.Request, identity: Identity,
                        stall: bool) -> web.StreamResponse:
        path = request.path
        if stall and (request.query.get("watch") or "").lower() not in ("true", "1"):
            await self.rest._stall(request)
            return web.Response(status=504)
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok", content_type="text/plain")
        if path in ("/version", "/version/"):
            return json_response(KUBERNETES_VERSION)
        if path == "/":
            return json_response({"paths": sorted(["/api", "/api/v1", "/apis", "/healthz",
                                                   "/livez", "/readyz", "/version"])})
        stripped = path.rstrip("/") or "/"
        if stripped == "/openapi/v3":
            return json_response(self.rest.openapi_root())
        if stripped.startswith("/openapi/v3/"):
            parsed_gv = parse_api_path(stripped[len("/openapi/v3"):])
            if parsed_gv is not None and not parsed_gv[2] and \
                    self.registry.in_group_version(parsed_gv[0], parsed_gv[1]):
                return json_response(self.rest.openapi_document(parsed_gv[0], parsed_gv[1]))
            return not_found_page()
        if stripped == "/api":
            return json_response({"kind": "APIVersions", "versions": ["v1"],
                                  "serverAddressByClientCIDRs": [{
                                      "clientCIDR": "0.0.0.0/0",
                                      "serverAddress": f"{self.host}:{self._port}"}]})
        if stripped == "/apis":
            return self._discovery_root(request)
        parts = [p for p in path.split("/") if p]
        if len(parts) == 2 and parts[0] == "apis":
            return self._discovery_group(parts[1])
        parsed = parse_api_path(path)
        if parsed is None:
            return not_found_page()
        group, version, rest = parsed
        if group:
            remote = self.aggregator.remote(group, version)
            if remote is not None:
                extra = tuple((k, tuple(v)) for k, v in identity.extra.items())
                return await self.aggregator.proxy(
                    request, remote, ProxyIdentity(identity.user, identity.groups, extra))
        if not rest:
            resource_list = self.rest.resource_list(group, version)
            if resource_list is None:
                return not_found_page()
            return json_response(resource_list)
        resource_path = split_resource_path(group, version, rest)
        if resource_path is None or not self.registry.in_group_version(group, version):
            if self.registry.in_group_version(group, version):
                raise errors.route_not_found()
            return not_found_page()
        return await self.rest.serve(request, resource_path, identity, stall)

    def _discovery_root(self, request: web.Request) -> web.Response:
        accept = request.headers.get("Accept", "")
        types = [t.split(";")[0].strip() for t in accept.split(",")] if accept else []
        if types and not any(t in ("application/json", "*/*", "application/*") and
                             "g=apidiscovery.k8s.io" not in part
                             for t, part in zip(types, accept.split(","), strict=True)):
            raise errors.not_acceptable(["application/json", "application/yaml",
                                         "application/vnd.kubernetes.protobuf"])
        groups = self.aggregator.groups(sort_versions)
        return json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})

    def _discovery_group(self, group: str) -> web.Response:
        services = [s for s in self.store.items(self.aggregator.apiservices, None)
                    if (s.get("spec") or {}).get("group") == group]
        if not services:
            return not_found_page()
        body = {"kind": "APIGroup", "apiVersion": "v1",
                **self.aggregator.group(group, sort_versions, services)}
        return json_response(body)


def not_found_page() -> web.Response:
    """Go's http.NotFound: what kube-apiserver answers outside every API it serves."""
    response = web.Response(status=404, text="404 page not found\n")
    response.headers["Content-Type"] = "text/plain; charset=utf-8"
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


async def run_forever(workdir: Path, *, kubeconfig: Path | None = None,
                      ready: Callable[[FakeKubeAPI], Awaitable[None]] | None = None) -> None:
    """Run a fake until cancelled (for manual use: `python -m testbed.fakes.kube_api DIR`)."""
    async with FakeKubeAPI(workdir=workdir) as kube:
        if kubeconfig is not None:
            kube.write_kubeconfig(kubeconfig)
        if ready is not None:
            await ready(kube)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()


def _main() -> None:
    import sys

    workdir = Path(sys.argv[1] if len(sys.argv) > 1 else ".fake-kube")

    async def announce(kube: FakeKubeAPI) -> None:
        print(f"fake kube-apiserver at {kube.url}; kubeconfig {workdir / 'kubeconfig'}",
              flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_forever(workdir, kubeconfig=workdir / "kubeconfig", ready=announce))


if __name__ == "__main__":
    _main()
