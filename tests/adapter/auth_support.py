"""Shared pieces of the adapter's auth end-to-end tests (no tests of its own: the helpers are
checked in tests/adapter/test_support.py).

A test PKI; the cluster (the session's real control plane, `auth_environment`: kube-apiserver's
aggregator proxies the three metrics APIServices to the adapter, the adapter delegates
authentication and authorization to it through a recording fault proxy, real RBAC decides);
a real Prometheus with a known set of series; the adapter run in-process exactly as
`adapter.server.serve` wires it (ReloadingServerContext, `build_security`, `create_app`,
`install`); and a raw HTTPS client that sends paths and headers byte for byte. The fake
cluster's pieces (`register_apiservices`, `trust_extra_proxy_ca`) remain for what only it can
be made to do, and for the autoscaler's tests that run the adapter behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from aiohttp import web

from adapter.http.app import HEALTH_KEY, create_app
from adapter.rules.config import parse_config
from adapter.security.delegation import AdapterSecurity, build_security
from adapter.security.tls import ReloadingServerContext
from adapter.settings import parse_settings
from metricscale import pki
from testbed.controlplane import ControlPlane
from testbed.fakes.exporter import Exporter
from testbed.fakes.prometheus import ExporterPool, PrometheusServer, count_of
from tests.adapter.cluster import (
    GROUP_VERSIONS,
    ModuleCluster,
    Objects,
    RecordingProxy,
    apiservices_given_back,
    grant_metrics_readers,
    node_manifest,
    pod_manifest,
    proxy_for,
)

SERVICE_NAMESPACE = "metricscale"
SERVICE_NAME = "metricscale-adapter"
SERVICE_DNS = f"{SERVICE_NAME}.{SERVICE_NAMESPACE}.svc"
PROXY_CN = "front-proxy-client"
HPA_ACCEPT = "application/vnd.kubernetes.protobuf, */*"
AGGREGATED_ACCEPT = ("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
                     "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList")
CUSTOM = "/apis/custom.metrics.k8s.io"
EXTERNAL = "/apis/external.metrics.k8s.io/v1beta1"
YEAR = timedelta(days=365)

# Canonical DecimalSI of contract §10.1; every row but 0.0015 survives the adapter's
# truncation to thousandths (README "Exact values"), so it travels through Prometheus too.
QUANTITY_TABLE: tuple[tuple[str, str], ...] = (
    ("0.5", "500m"), ("1.5", "1500m"), ("0.1", "100m"), ("0.066", "66m"), ("0.0015", "1500u"),
    ("1", "1"), ("10", "10"), ("100", "100"), ("1500", "1500"), ("1001", "1001"),
    ("2000", "2k"), ("1234.567", "1234567m"), ("1200000", "1200k"), ("3000000", "3M"),
    ("-0.25", "-250m"), ("1048576", "1048576"))

Headers = Sequence[tuple[str, str]]
CertPair = tuple[Path, Path]


# --------------------------------------------------------------------------------------------
# PKI


@dataclass(frozen=True)
class AuthPKI:
    """Serving pair for the adapter, an extra request-header CA and a CA nobody trusts."""

    directory: Path
    serving_ca: pki.CertifiedKey
    serving_cert: Path
    serving_key: Path
    proxy_ca: pki.CertifiedKey
    stranger_ca: pki.CertifiedKey

    @property
    def serving_ca_file(self) -> Path:
        return self.directory / "serving-ca.crt"

    def client_pair(self, name: str, ca: pki.CertifiedKey, *, user: str,
                    groups: Sequence[str] = (), start: datetime | None = None,
                    validity: timedelta = YEAR) -> CertPair:
        leaf = pki.issue_client_certificate(
            ca, user=user, groups=groups, validity=validity,
            now=start or datetime.now(UTC) - timedelta(minutes=5))
        return (pki.write_certificate(self.directory / f"{name}.crt", leaf.certificate),
                pki.write_private_key(self.directory / f"{name}.key", leaf.private_key))

    def proxy_pair(self, name: str = "proxy", *, user: str = PROXY_CN) -> CertPair:
        return self.client_pair(name, self.proxy_ca, user=user)

    def key_files(self) -> list[Path]:
        return sorted(self.directory.glob("*.key"))


def make_pki(directory: Path, *, service_dns: str = SERVICE_DNS,
             proxy_ca: pki.CertifiedKey | None = None) -> AuthPKI:
    """Serving pair for localhost and `service_dns`; `proxy_ca` is the front proxy's CA
    (a real cluster's), else one of the test's own that a fake cluster is told to trust."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC) - timedelta(minutes=5)
    serving_ca = pki.generate_ca(common_name="adapter-serving-ca", now=now, validity=YEAR)
    serving = pki.issue_serving_certificate(
        serving_ca, common_name=SERVICE_NAME, dns_names=("localhost", service_dns),
        ip_addresses=("127.0.0.1",), now=now, validity=YEAR)
    pki.write_certificate(directory / "serving-ca.crt", serving_ca.certificate)
    return AuthPKI(
        directory=directory, serving_ca=serving_ca,
        serving_cert=pki.write_certificate(directory / "serving.crt", serving.certificate),
        serving_key=pki.write_private_key(directory / "serving.key", serving.private_key),
        proxy_ca=proxy_ca or pki.generate_ca(common_name="test-front-proxy-ca", now=now,
                                             validity=YEAR),
        stranger_ca=pki.generate_ca(common_name="stranger-ca", now=now, validity=YEAR))


class HandshakeFailed(Exception):
    """The TLS handshake (or, with TLS 1.3, the first read after it) was refused."""


@dataclass(frozen=True)
class Reply:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return f"Reply({self.status}, {self.body[:300]!r})"


def client_context(ca_file: Path, cert: CertPair | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca_file))
    if cert is not None:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    return context


async def https_request(port: int, path: str, *, ca_file: Path, cert: CertPair | None = None,
                        method: str = "GET", headers: Headers = (), body: bytes = b"",
                        within: float = 15.0) -> Reply:
    """One request on a fresh connection, the request line and headers sent exactly as given.

    Raises HandshakeFailed when the server refuses the TLS session; fails the test (TimeoutError)
    if no complete answer comes within `within` seconds.
    """
    context = client_context(ca_file, cert)
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close",
             *(f"{name}: {value}" for name, value in headers)]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    async with asyncio.timeout(within):
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=context, server_hostname="localhost")
        except (ssl.SSLError, ConnectionError) as error:
            raise HandshakeFailed(str(error)) from error
        data = b""
        try:
            writer.write(request)
            await writer.drain()
            while chunk := await reader.read(65536):
                data += chunk
        except (ssl.SSLError, ConnectionError) as error:
            if not data:
                raise HandshakeFailed(str(error)) from error
        finally:
            writer.close()
            with contextlib.suppress(ssl.SSLError, ConnectionError):
                await writer.wait_closed()
    if not data:
        raise HandshakeFailed("the connection closed without an answer")
    return _parse_reply(data)


def _parse_reply(data: bytes) -> Reply:
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    status = int(status_line.split(" ", 2)[1])
    headers = tuple((name.strip(), value.strip()) for name, _, value in
                    (line.partition(":") for line in header_lines))
    if dict((k.lower(), v) for k, v in headers).get("transfer-encoding") == "chunked":
        rest = _dechunk(rest)
    return Reply(status, headers, rest)


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += data[:size]
        data = data[size + 2:]
    return out


# --------------------------------------------------------------------------------------------
# The cluster, the series and the adapter's rules


@dataclass(frozen=True)
class Seeded:
    """The names the series and objects are made under (a real cluster's are the module's
    own: namespaces and nodes other tests of the session do not use)."""

    shop: str = "shop"
    quant: str = "quant"
    node_1: str = "node-1"
    node_2: str = "node-2"


SHOP_PODS = (("web-0", "web"), ("web-1", "web"), ("other-0", "other"), ("w.b", "dotted"),
             ("wxb", "lookalike"))


async def seed_real_cluster(objects: Objects, seeded: Seeded) -> None:
    """The same objects in a real cluster: the pods are never scheduled (nothing here needs
    them to run), the Deployment has no replicas, the Nodes are unschedulable."""
    await objects.create(
        *(pod_manifest(name, seeded.shop, labels={"app": app}) for name, app in SHOP_PODS),
        *(pod_manifest(f"q-{index}", seeded.quant, labels={"app": "quantity"})
          for index in range(len(QUANTITY_TABLE))),
        *(node_manifest(node, labels={"pool": "a"}) for node in (seeded.node_1, seeded.node_2)))
    await objects.create({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": seeded.shop, "labels": {"app": "web"}},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": pod_manifest("web", seeded.shop)["spec"]}}})


def export_series(exporter: Exporter, seeded: Seeded = Seeded()) -> int:
    """Set every series the tests read; returns how many there are."""
    shop = seeded.shop
    series: list[tuple[str, dict[str, str], Decimal]] = [
        ("msauth_http_requests", {"namespace": shop, "pod": "web-0", "verb": "GET"},
         Decimal("1.5")),
        ("msauth_http_requests", {"namespace": shop, "pod": "web-0", "verb": "POST"},
         Decimal("0.5")),
        ("msauth_http_requests", {"namespace": shop, "pod": "web-1", "verb": "GET"},
         Decimal(2)),
        ("msauth_http_requests", {"namespace": shop, "pod": "other-0", "verb": "GET"},
         Decimal(7)),
        ("msauth_http_requests", {"namespace": shop, "pod": "w.b", "verb": "GET"},
         Decimal(3)),
        ("msauth_http_requests", {"namespace": shop, "pod": "wxb", "verb": "GET"},
         Decimal(100)),
        ("msauth_queue_length", {"namespace": shop}, Decimal(42)),
        ("msauth_temperature", {"node": seeded.node_1}, Decimal("61.5")),
        ("msauth_temperature", {"node": seeded.node_2}, Decimal(58)),
        ("msauth_rps", {"namespace": shop, "deployment": "web"}, Decimal(250)),
        ("msauth_queue_messages", {"namespace": shop, "queue": "orders"}, Decimal(1200)),
        ("msauth_queue_messages", {"namespace": shop, "queue": "orders-retry"}, Decimal(35)),
    ]
    series += [("msauth_quantity", {"namespace": seeded.quant, "pod": f"q-{index}"},
                Decimal(value)) for index, (value, _) in enumerate(QUANTITY_TABLE)]
    for name, labels, value in series:
        exporter.set(name, labels, value, type="gauge")
    return len(series)


def rules_yaml(job: str) -> str:
    # The Prometheus is shared by every module, and an exporter released by another module's
    # environment stays visible for the staleness period: pinning the job keeps each module's
    # answers to its own series (without it a value was sometimes doubled).
    sum_by = f'sum(<<.Series>>{{<<.LabelMatchers>>,job="{job}"}}) by (<<.GroupBy>>)'
    name = '{matches: "^msauth_(.*)$", as: "${1}"}'
    return f"""\
rules:
- seriesQuery: '{{__name__=~"^msauth_(http_requests|quantity)$",job="{job}",namespace!="",pod!=""}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
      pod: {{resource: pod}}
  name: {name}
  metricsQuery: '{sum_by}'
- seriesQuery: 'msauth_queue_length{{job="{job}",namespace!=""}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
  name: {name}
  metricsQuery: '{sum_by}'
- seriesQuery: 'msauth_temperature{{job="{job}",node!=""}}'
  resources:
    overrides:
      node: {{resource: node}}
  name: {name}
  metricsQuery: '{sum_by}'
- seriesQuery: 'msauth_rps{{job="{job}",namespace!="",deployment!=""}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
      deployment: {{group: apps, resource: deployment}}
  name: {name}
  metricsQuery: '{sum_by}'
externalRules:
- seriesQuery: 'msauth_queue_messages{{job="{job}",namespace!=""}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
  name: {{matches: "^msauth_queue_messages$", as: "queueLength"}}
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>,job="{job}"}}) by (queue)'
"""


async def wait_for_exported_series(prometheus: PrometheusServer, exporter: Exporter,
                                   count: int) -> None:
    job = exporter.job
    await prometheus.wait_for_async(f'{{__name__=~"msauth_.+",job="{job}"}}', count_of(count),
                                    timeout=120.0)


def write_file(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


class ShiftedClock:
    """Wall time plus an offset a test can move forward (cache expiry without sleeping)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


async def no_wait(_seconds: float) -> None:
    """The review retries' sleep: yield once, wait for nothing."""
    await asyncio.sleep(0)


@dataclass
class SecuredAdapter:
    app: web.Application
    port: int
    tls: ReloadingServerContext
    security: AdapterSecurity
    pki: AuthPKI
    fatal: list[BaseException] = field(default_factory=list)

    async def request(self, path: str, **kwargs: Any) -> Reply:
        return await https_request(self.port, path, ca_file=self.pki.serving_ca_file, **kwargs)


@contextlib.asynccontextmanager
async def secured_adapter(*, workdir: Path, test_pki: AuthPKI, kubeconfig: Path,
                          prometheus_url: str, config_text: str, clock: ShiftedClock,
                          args: Sequence[str] = (), wait: bool = True,
                          sync_timeout: float = 10.0,
                          informer_options: Mapping[str, Any] | None = None,
                          ) -> AsyncIterator[SecuredAdapter]:
    """The adapter wired as `serve()` wires it, on 127.0.0.1:<free port>, until exit."""
    config_file = write_file(workdir / "config.yaml", config_text)
    settings = parse_settings([
        "--config", str(config_file), "--prometheus-url", prometheus_url,
        "--kubeconfig", str(kubeconfig), "--metrics-relist-interval", "1h",
        "--tls-cert-file", str(test_pki.serving_cert),
        "--tls-private-key-file", str(test_pki.serving_key), *args])
    tls = ReloadingServerContext(cert_file=test_pki.serving_cert, key_file=test_pki.serving_key)
    security = build_security(settings, tls=tls, clock=clock, sleep=no_wait,
                              sync_timeout=sync_timeout, informer_options=informer_options)
    fatal: list[BaseException] = []
    app = create_app(settings=settings, config=parse_config(config_text), on_fatal=fatal.append,
                     authenticator=security.authenticator, authorizer=security.authorizer)
    security.install(app, health=app[HEALTH_KEY], on_fatal=fatal.append)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls.listening_context)
        await site.start()
        server = site._server
        assert server is not None
        port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]
        adapter = SecuredAdapter(app, port, tls, security, test_pki, fatal)
        if wait:
            await wait_ready(adapter)
        yield adapter
        assert not fatal, f"a background task of the adapter failed: {fatal!r}"
    finally:
        await runner.cleanup()


async def wait_ready(adapter: SecuredAdapter, *, within: float = 120.0) -> None:
    deadline = time.monotonic() + within
    last: Reply | None = None
    while time.monotonic() < deadline:
        last = await adapter.request("/readyz?verbose")
        if last.status == 200:
            return
        assert not adapter.fatal, f"the adapter failed: {adapter.fatal!r}"
        await asyncio.sleep(0.05)
    raise AssertionError(f"the adapter did not become ready in {within}s: {last}")


def register_real_apiservices(cluster: ControlPlane, *, port: int, ca_pem: bytes,
                              namespace: str) -> None:
    """The three APIServices, verified through caBundle, routed through an ExternalName
    Service in `namespace` to the adapter on localhost; returns once all are Available.
    Blocking: call it off the event loop the adapter serves on."""
    for group, version, priority in GROUP_VERSIONS:
        cluster.register_apiservice(group, version, port=port, ca_pem=ca_pem,
                                    namespace=namespace, service=SERVICE_NAME,
                                    priority=(100, priority))
    for group, version, _ in GROUP_VERSIONS:
        cluster.wait_apiservice_available(group, version, timeout=60)


APISERVICE_NAMES = tuple(f"{version}.{group}" for group, version, _ in GROUP_VERSIONS)


@dataclass
class Env:
    """One running setup on the session's control plane: the adapter registered behind the
    real aggregator, delegating to kube-apiserver through a recording fault proxy."""

    cluster: ModuleCluster
    kube: RecordingProxy  # kube-apiserver as the adapter reaches it
    adapter: SecuredAdapter
    pki: AuthPKI
    clock: ShiftedClock
    proxy: CertPair  # kube-apiserver's own front-proxy client certificate
    seeded: Seeded
    users_namespace: str  # where new_token's service accounts live
    tokens: list[str] = field(default_factory=list)

    @property
    def control_plane(self) -> ControlPlane:
        return self.cluster.control_plane

    async def as_proxy(self, path: str, *, user: str | None, groups: tuple[str, ...] = (),
                       headers: Headers = (), **kwargs: Any) -> Reply:
        """What the aggregator sends: its client certificate and identity headers."""
        sent = [("X-Remote-User", user)] if user is not None else []
        sent += [("X-Remote-Group", group) for group in groups]
        return await self.adapter.request(path, cert=self.proxy, headers=[*sent, *headers],
                                          **kwargs)

    async def through_aggregator(self, path: str, *, token: str | None = None,
                                 cert: CertPair | None = None,
                                 accept: str | None = None) -> Reply:
        """A client calling kube-apiserver (a bearer token or a client certificate of the
        cluster's CA), which proxies to the adapter."""
        headers = [("Authorization", f"Bearer {token}")] if token is not None else []
        if accept is not None:
            headers.append(("Accept", accept))
        return await https_request(self.control_plane.api_port, path,
                                   ca_file=self.control_plane.ca_file, cert=cert,
                                   headers=headers)

    def user_pair(self, user: str, *, groups: Sequence[str] = ()) -> CertPair:
        """A client certificate of the cluster's CA (kube-apiserver and the adapter trust it)."""
        issued = self.control_plane.client_cert(user, groups=groups)
        return issued.cert, issued.key

    def new_token(self, account: str) -> str:
        """A token of service account `account` of the module's users namespace (its user is
        `account_user(account)`), from the TokenRequest API."""
        token = self.control_plane.service_account_token(self.users_namespace, account)
        self.tokens.append(token)
        return token

    def account_user(self, account: str) -> str:
        return f"system:serviceaccount:{self.users_namespace}:{account}"

    def reviews_for(self, user: str) -> list[dict[str, Any]]:
        """The SubjectAccessReviews the adapter sent for `user`, as sent."""
        return self.kube.subject_access_reviews(user)


@dataclass(frozen=True)
class Prepared:
    """A module's part of the real cluster, ready for an adapter: objects, RBAC, PKI."""

    seeded: Seeded
    users_namespace: str
    adapter_namespace: str
    pki: AuthPKI


async def prepare_real_cluster(cluster: ModuleCluster, workdir: Path, *,
                               readers: Sequence[str] = (),
                               writers: Sequence[str] = ()) -> Prepared:
    """The module's objects created, RBAC letting `readers` (and the module's service
    accounts) read metrics and `writers` do anything with them, a serving pair for the
    adapter's Service in the module's `adapter` namespace."""
    control_plane = cluster.control_plane
    seeded = Seeded(shop=cluster.namespace("shop"), quant=cluster.namespace("quant"),
                    node_1=cluster.names.cluster("node-1"),
                    node_2=cluster.names.cluster("node-2"))
    cluster.cleanup.add(*(node_manifest(n) for n in (seeded.node_1, seeded.node_2)))
    users_namespace = cluster.namespace("users")
    readers_role = f"metricscale-test-readers-{cluster.names.prefix}"
    grant_metrics_readers(control_plane, readers_role, users=readers,
                          groups=[f"system:serviceaccounts:{users_namespace}"])
    writers_role = f"metricscale-test-writers-{cluster.names.prefix}"
    grant_metrics_readers(control_plane, writers_role, users=writers, verbs=["*"])
    cluster.cleanup.add(*({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
                           "metadata": {"name": role}}
                          for kind in ("ClusterRole", "ClusterRoleBinding")
                          for role in (readers_role, writers_role)))
    adapter_namespace = cluster.namespace("adapter")
    async with Objects(control_plane) as objects:
        await seed_real_cluster(objects, seeded)
    test_pki = make_pki(workdir / "pki", service_dns=f"{SERVICE_NAME}.{adapter_namespace}.svc",
                        proxy_ca=control_plane.front_proxy_ca)
    return Prepared(seeded, users_namespace, adapter_namespace, test_pki)


@contextlib.asynccontextmanager
async def auth_environment(cluster: ModuleCluster, workdir: Path, *,
                           prometheus: PrometheusServer, exporter_pool: ExporterPool,
                           readers: Sequence[str] = (), writers: Sequence[str] = (),
                           args: Sequence[str] = ()) -> AsyncIterator[Env]:
    """Series exported and scraped, the module's part of the cluster prepared
    (`prepare_real_cluster`), the adapter running and Available behind kube-apiserver's
    aggregator."""
    control_plane = cluster.control_plane
    prepared = await prepare_real_cluster(cluster, workdir, readers=readers, writers=writers)
    with exporter_pool.exporter() as exporter:
        count = export_series(exporter, prepared.seeded)
        await wait_for_exported_series(prometheus, exporter, count)
        clock = ShiftedClock()
        async with proxy_for(control_plane) as kube, secured_adapter(
                workdir=workdir / "adapter", test_pki=prepared.pki,
                kubeconfig=cluster.adapter_kubeconfig(server=kube.server),
                prometheus_url=prometheus.url, config_text=rules_yaml(exporter.job),
                clock=clock, args=args) as adapter:
            with apiservices_given_back(control_plane, APISERVICE_NAMES):
                await asyncio.to_thread(
                    register_real_apiservices, control_plane, port=adapter.port,
                    ca_pem=prepared.pki.serving_ca.certificate_pem,
                    namespace=prepared.adapter_namespace)
                front_proxy = control_plane.front_proxy_client
                yield Env(cluster, kube, adapter, prepared.pki, clock,
                          (front_proxy.cert, front_proxy.key), prepared.seeded,
                          prepared.users_namespace)


# --------------------------------------------------------------------------------------------
# The fake cluster, for what a real one cannot be made to do


class LogCapture(logging.Handler):
    """Every record of the run, formatted with its arguments and any traceback."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@contextlib.contextmanager
def capture_all_logs() -> Iterator[LogCapture]:
    """Attach to the root logger at DEBUG for the duration (restored afterwards)."""
    root = logging.getLogger()
    capture = LogCapture()
    previous = root.level
    root.addHandler(capture)
    root.setLevel(logging.DEBUG)
    try:
        yield capture
    finally:
        root.removeHandler(capture)
        root.setLevel(previous)


def secrets_in(text: str, *, tokens: Sequence[str], key_files: Sequence[Path]) -> list[str]:
    """Which tokens or private-key material show up in `text` (by a short description)."""
    found = [f"token {token[:4]}…" for token in tokens if token and token in text]
    if "PRIVATE KEY" in text:
        found.append("a PEM private key marker")
    for path in key_files:
        body = b"".join(line for line in path.read_bytes().splitlines()
                        if line and not line.startswith(b"-----")).decode()
        # The start of every EC key's encoding is the same; the middle holds the secret.
        middle = body[len(body) // 3:len(body) // 3 + 32]
        if middle in text.replace("\n", ""):
            found.append(f"key material of {path.name}")
    return found
