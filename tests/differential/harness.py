"""The two adapters side by side: processes, the Prometheus in front of each, and the aggregator's
view of both.

A `Pair` is the real prometheus-adapter and `metricscale adapter` started on one configuration
file, against one Prometheus (each through a `RecordingProxy` of its own, so the PromQL each
sends, and what Prometheus answered, are known per request) and one control plane. Each server
runs under a service account of its own with its own manifests' RBAC, and is asked directly over
HTTPS as kube-apiserver's aggregator asks: the front-proxy client certificate, `X-Remote-User`
and `X-Remote-Group`. Both delegate authentication and authorization back to kube-apiserver.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import http.server
import json
import ssl
import sys
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from metricscale import pki
from testbed.binaries import CHECKOUT, find_peer
from testbed.controlplane import ClientCert, ControlPlane
from testbed.processes import Child, free_port, wait_until

__all__ = [
    "CALLER_GROUP",
    "CALLER_USER",
    "Exchange",
    "Pair",
    "PromQuery",
    "RecordingProxy",
    "Server",
    "grant_rbac",
]

CALLER_USER = "oracle-tester"
CALLER_GROUP = "system:masters"
RELIST = "2s"
MAX_AGE = "10m"

OURS_NAMESPACE, OURS_ACCOUNT = "metricscale", "metricscale-adapter"
UPSTREAM_NAMESPACE, UPSTREAM_ACCOUNT = "monitoring", "prometheus-adapter"


# --------------------------------------------------------------------------------------------
# What Prometheus was asked


Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class PromQuery:
    """One `/api/v1/query` call: the method, the PromQL, and the samples answered, each with
    its labels and its value as Prometheus wrote it (the text each adapter converts to a
    quantity)."""

    method: str
    promql: str
    samples: tuple[tuple[Labels, str], ...] = ()

    @property
    def values(self) -> tuple[str, ...]:
        return tuple(value for _, value in self.samples)


class RecordingProxy:
    """Forwards everything to Prometheus, recording the instant queries (thread-safe)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self._lock = threading.Lock()
        self._queries: list[PromQuery] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # headers and body are two writes: without this, Nagle and a delayed ACK hold
            # every answer 40 ms
            disable_nagle_algorithm = True

            def do_GET(self) -> None:
                proxy._forward(self, b"")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                proxy._forward(self, self.rfile.read(length))

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name=f"recording-proxy-{self.url}")
        self._thread.start()

    def _forward(self, handler: http.server.BaseHTTPRequestHandler, body: bytes) -> None:
        path, _, query_string = handler.path.partition("?")
        request = urllib.request.Request(
            self.upstream + handler.path, data=body if handler.command == "POST" else None,
            method=handler.command)
        for name in ("Content-Type", "Accept"):
            if handler.headers.get(name):
                request.add_header(name, handler.headers[name])
        try:
            with self._opener.open(request, timeout=60) as reply:
                status, payload = reply.status, reply.read()
                content_type = reply.headers.get("Content-Type", "application/json")
        except urllib.error.HTTPError as error:
            status, payload = error.code, error.read()
            content_type = error.headers.get("Content-Type", "application/json")
        if path.endswith("/api/v1/query"):
            form = urllib.parse.parse_qs(query_string if handler.command == "GET"
                                         else body.decode())
            self._record(PromQuery(handler.command, form.get("query", [""])[0],
                                   _samples(payload)))
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    def _record(self, query: PromQuery) -> None:
        with self._lock:
            self._queries.append(query)

    def mark(self) -> int:
        with self._lock:
            return len(self._queries)

    def since(self, mark: int) -> tuple[PromQuery, ...]:
        with self._lock:
            return tuple(self._queries[mark:])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _samples(payload: bytes) -> tuple[tuple[Labels, str], ...]:
    try:
        data = json.loads(payload).get("data") or {}
    except (ValueError, AttributeError):
        return ()
    result = data.get("result")
    if data.get("resultType") == "vector" and isinstance(result, list):
        return tuple((tuple(sorted(item["metric"].items())), str(item["value"][1]))
                     for item in result)
    if data.get("resultType") == "scalar" and isinstance(result, list):
        return (((), str(result[1])),)
    return ()


# --------------------------------------------------------------------------------------------
# One answer


@dataclass(frozen=True)
class Exchange:
    """What one server answered to one request, and the PromQL it sent meanwhile."""

    status: int
    content_type: str
    warnings: tuple[str, ...]
    body: Any  # parsed JSON, else the text
    queries: tuple[PromQuery, ...] = ()

    def json_items(self) -> list[Any]:
        items = self.body.get("items") if isinstance(self.body, dict) else None
        return list(items) if isinstance(items, list) else []


# --------------------------------------------------------------------------------------------
# One server


@dataclass
class Server:
    """One adapter process and the client that asks it as the aggregator does."""

    name: str
    child: Child
    port: int
    proxy: RecordingProxy
    context: ssl.SSLContext
    _connection: http.client.HTTPSConnection | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _connect(self) -> http.client.HTTPSConnection:
        if self._connection is None:
            self._connection = http.client.HTTPSConnection(
                "127.0.0.1", self.port, context=self.context, timeout=60)
        return self._connection

    def request(self, path: str, *, method: str = "GET",
                headers: Mapping[str, str] | None = None,
                identity: bool = True) -> tuple[int, str, tuple[str, ...], bytes]:
        """One request over a kept-alive connection (a fresh one if the server closed it)."""
        sent = {"Accept": "application/json"}
        if identity:
            sent.update({"X-Remote-User": CALLER_USER, "X-Remote-Group": CALLER_GROUP})
        sent.update(headers or {})
        with self._lock:
            for attempt in (1, 2):
                connection = self._connect()
                try:
                    connection.request(method, path, headers=sent)
                    reply = connection.getresponse()
                    payload = reply.read()
                except (http.client.HTTPException, OSError):
                    connection.close()
                    self._connection = None
                    if attempt == 2:
                        raise
                    continue
                if reply.getheader("Connection", "").lower() == "close":
                    connection.close()
                    self._connection = None
                warnings = tuple(value for name, value in reply.getheaders()
                                 if name.lower() == "warning")
                content_type = (reply.getheader("Content-Type") or "").split(";")[0].strip()
                return reply.status, content_type, warnings, payload
        raise AssertionError("unreachable")

    def exchange(self, path: str, *, method: str = "GET",
                 accept: str = "application/json") -> Exchange:
        self.child.check_running()
        mark = self.proxy.mark()
        status, content_type, warnings, payload = self.request(
            path, method=method, headers={"Accept": accept})
        body: Any
        try:
            body = json.loads(payload)
        except ValueError:
            # not JSON (a protobuf answer): its bytes, shown escaped
            body = payload.decode("latin-1")
        return Exchange(status, content_type, warnings, body, self.proxy.since(mark))

    def get_json(self, path: str) -> Any:
        status, _, _, payload = self.request(path)
        if status != 200:
            return None
        return json.loads(payload)

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None
        self.child.stop()


# --------------------------------------------------------------------------------------------
# RBAC: each adapter's own manifests


def _upstream_rbac() -> list[dict[str, Any]]:
    """prometheus-adapter's deploy/manifests RBAC (v0.12): the resource reader ClusterRole,
    the auth-delegator binding and the extension-apiserver-authentication reader binding."""
    subject = [{"kind": "ServiceAccount", "name": UPSTREAM_ACCOUNT,
                "namespace": UPSTREAM_NAMESPACE}]
    rbac = "rbac.authorization.k8s.io"
    return [
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRole",
         "metadata": {"name": "prometheus-adapter"},
         "rules": [{"apiGroups": [""], "resources": ["nodes", "namespaces", "pods", "services"],
                    "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "prometheus-adapter"},
         "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": "prometheus-adapter"},
         "subjects": subject},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "resource-metrics:system:auth-delegator"},
         "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": "system:auth-delegator"},
         "subjects": subject},
        {"apiVersion": f"{rbac}/v1", "kind": "RoleBinding",
         "metadata": {"name": "resource-metrics-auth-reader", "namespace": "kube-system"},
         "roleRef": {"apiGroup": rbac, "kind": "Role",
                     "name": "extension-apiserver-authentication-reader"},
         "subjects": subject},
    ]


def grant_rbac(cluster: ControlPlane, *, extra_rules: Sequence[Mapping[str, Any]]
               ) -> tuple[Path, Path]:
    """Both service accounts with their own manifests' RBAC, plus `extra_rules` for both (the
    resources the test's rules map labels to, which both manifests say to add); returns the
    kubeconfigs (bearer tokens) of ours and of prometheus-adapter."""
    for namespace in (OURS_NAMESPACE, UPSTREAM_NAMESPACE):
        cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    ours_manifest = CHECKOUT / "manifests" / "adapter" / "rbac.yaml"
    for document in yaml.safe_load_all(ours_manifest.read_text()):
        if document:
            cluster.apply(document)
    for document in _upstream_rbac():
        cluster.apply(document)
    rbac = "rbac.authorization.k8s.io"
    cluster.apply({"apiVersion": f"{rbac}/v1", "kind": "ClusterRole",
                   "metadata": {"name": "oracle-extra-resources"},
                   "rules": [dict(rule) for rule in extra_rules]})
    cluster.apply({"apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": "oracle-extra-resources"},
                   "roleRef": {"apiGroup": rbac, "kind": "ClusterRole",
                               "name": "oracle-extra-resources"},
                   "subjects": [
                       {"kind": "ServiceAccount", "name": OURS_ACCOUNT,
                        "namespace": OURS_NAMESPACE},
                       {"kind": "ServiceAccount", "name": UPSTREAM_ACCOUNT,
                        "namespace": UPSTREAM_NAMESPACE}]})
    ours = cluster.write_kubeconfig(
        "oracle-ours", cluster.service_account_token(OURS_NAMESPACE, OURS_ACCOUNT, seconds=7200))
    upstream = cluster.write_kubeconfig(
        "oracle-upstream",
        cluster.service_account_token(UPSTREAM_NAMESPACE, UPSTREAM_ACCOUNT, seconds=7200))
    return ours, upstream


# --------------------------------------------------------------------------------------------
# A pair of servers


@dataclass(frozen=True)
class Credentials:
    """What every server of the module shares: the serving pair, the kubeconfigs, the client."""

    serving: ClientCert
    ours_kubeconfig: Path
    upstream_kubeconfig: Path
    client_context: ssl.SSLContext


def make_credentials(cluster: ControlPlane, workdir: Path, *, ours_kubeconfig: Path,
                     upstream_kubeconfig: Path) -> Credentials:
    now = datetime.now(UTC) - timedelta(minutes=5)
    serving = pki.issue_serving_certificate(
        cluster.ca, common_name="oracle-adapter", dns_names=["localhost"],
        ip_addresses=["127.0.0.1"], now=now, validity=timedelta(days=2))
    pair = ClientCert(cert=pki.write_certificate(workdir / "serving.crt", serving.certificate),
                      key=pki.write_private_key(workdir / "serving.key", serving.private_key))
    context = ssl.create_default_context(cafile=str(cluster.ca_file))
    proxy_client = cluster.front_proxy_client
    context.load_cert_chain(str(proxy_client.cert), str(proxy_client.key))
    return Credentials(pair, ours_kubeconfig, upstream_kubeconfig, context)


def _upstream_argv(*, port: int, config: Path, prometheus: str, credentials: Credentials
                   ) -> list[str]:
    binary = find_peer("prometheus-adapter")
    assert binary is not None
    kubeconfig = credentials.upstream_kubeconfig
    return [str(binary), f"--secure-port={port}", "--bind-address=127.0.0.1",
            f"--tls-cert-file={credentials.serving.cert}",
            f"--tls-private-key-file={credentials.serving.key}",
            f"--lister-kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}", f"--config={config}",
            f"--prometheus-url={prometheus}", f"--metrics-relist-interval={RELIST}",
            f"--metrics-max-age={MAX_AGE}", "--profiling=false", "--v=4",
            # its lister client's own throttle (5/s by default) would pace every `*` request
            "--client-qps=1000", "--client-burst=1000"]


def _ours_argv(*, port: int, config: Path, prometheus: str, credentials: Credentials
               ) -> list[str]:
    return [sys.executable, "-m", "metricscale", "adapter", f"--secure-port={port}",
            "--bind-address=127.0.0.1", f"--tls-cert-file={credentials.serving.cert}",
            f"--tls-private-key-file={credentials.serving.key}",
            f"--kubeconfig={credentials.ours_kubeconfig}", f"--config={config}",
            f"--prometheus-url={prometheus}", f"--metrics-relist-interval={RELIST}",
            f"--metrics-max-age={MAX_AGE}", "--self-managed-certs=off", "--log-level=debug"]


@dataclass
class Pair:
    """prometheus-adapter (`upstream`) and metricscale (`ours`) on one configuration."""

    name: str
    config_text: str
    upstream: Server
    ours: Server

    @classmethod
    def start(cls, name: str, *, config_text: str, prometheus: str, workdir: Path,
              credentials: Credentials) -> Pair:
        config = workdir / f"{name}.yaml"
        config.write_text(config_text)
        servers: list[Server] = []
        try:
            for who, argv_of in (("upstream", _upstream_argv), ("ours", _ours_argv)):
                proxy = RecordingProxy(prometheus)
                port = free_port()
                argv = argv_of(port=port, config=config, prometheus=proxy.url,
                               credentials=credentials)
                child = Child(f"{name}-{who}", argv, log=workdir / f"{name}-{who}.log",
                              cwd=CHECKOUT)
                servers.append(Server(f"{name}/{who}", child, port, proxy,
                                      credentials.client_context))
        except BaseException:
            for server in servers:
                server.close()
                server.proxy.close()
            raise
        return cls(name, config_text, servers[0], servers[1])

    @property
    def servers(self) -> tuple[Server, Server]:
        return self.upstream, self.ours

    def wait_serving(self) -> None:
        """Both answer their discovery document (ours once its first discovery pass is done)."""
        for server in self.servers:
            wait_until(functools.partial(_answers, server, "/apis/custom.metrics.k8s.io/v1beta1"),
                       what=f"{server.name} serving", timeout=120, children=[server.child],
                       interval=0.2)

    def wait_discovered(self, api: str, names: Sequence[str]) -> None:
        """Both list every resource `name` (`pods/http_requests`, ...) in `api`'s discovery."""
        wanted = set(names)
        for server in self.servers:
            wait_until(functools.partial(_lists, server, api, wanted),
                       what=f"{server.name} listing {sorted(wanted)} in {api}",
                       timeout=120, children=[server.child], interval=0.2)

    def close(self) -> None:
        for server in self.servers:
            server.close()
            server.proxy.close()


def _lists(server: Server, api: str, wanted: set[str]) -> bool:
    document = server.get_json(api)
    have = {r.get("name") for r in (document or {}).get("resources", [])}
    return wanted <= have


def _answers(server: Server, path: str) -> bool:
    try:
        status, _, _, _ = server.request(path)
    except OSError:
        return False
    return status == 200


@contextlib.contextmanager
def started_pairs(specs: Mapping[str, str], *, prometheus: str, workdir: Path,
                  credentials: Credentials) -> Iterator[dict[str, Pair]]:
    """Every pair of `specs` (name -> configuration), started together, stopped at the end."""
    pairs: dict[str, Pair] = {}
    try:
        for name, text in specs.items():
            pairs[name] = Pair.start(name, config_text=text, prometheus=prometheus,
                                     workdir=workdir, credentials=credentials)
        for pair in pairs.values():
            pair.wait_serving()
        yield pairs
    finally:
        for pair in pairs.values():
            pair.close()


# --------------------------------------------------------------------------------------------
# Configurations: does prometheus-adapter start on them?


def upstream_accepts(configs: Mapping[str, str], *, prometheus: str, workdir: Path,
                     credentials: Credentials) -> dict[str, tuple[bool, str]]:
    """name -> (whether prometheus-adapter started serving on the configuration, the last lines
    of its log). All are started at once; each either exits (refused: it reads and checks the
    whole configuration, the REST mapper included, before it serves) or serves (accepted)."""
    children: dict[str, Child] = {}
    try:
        for name, text in configs.items():
            config = workdir / f"config-case-{name}.yaml"
            config.write_text(text)
            argv = _upstream_argv(port=free_port(), config=config, prometheus=prometheus,
                                  credentials=credentials)
            children[name] = Child(f"config-case-{name}", argv,
                                   log=workdir / f"config-case-{name}.log", cwd=CHECKOUT)
        verdicts: dict[str, tuple[bool, str]] = {}
        for name, child in children.items():
            wait_until(functools.partial(_decided, child),
                       what=f"prometheus-adapter to accept or refuse {name}",
                       timeout=120, interval=0.05)
            verdicts[name] = (child.running, child.tail(3))
        return verdicts
    finally:
        for child in children.values():
            child.stop()


def _decided(child: Child) -> bool:
    return not child.running or "Serving securely on" in child.tail(200)
