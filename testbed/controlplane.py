"""A real Kubernetes control plane on loopback, for tests and the demo.

etcd, kube-apiserver (client certificates and service-account tokens, RBAC, the front-proxy CA
and the aggregator), kube-controller-manager (deployment, replicaset, horizontal pod
autoscaling, garbage collector, namespace and service-account controllers, each with its own
service account's credentials) and kube-scheduler, all built from `tests/peers`. Nothing runs
pods: `testbed.kubelet` plays the kubelet.

The aggregator reaches an aggregated server through a Service of type ExternalName pointing at
`localhost` (`register_apiservice`): with aggregator routing off, kube-apiserver resolves such
a Service to `https://<externalName>:<port>` and verifies the serving certificate against the
APIService's caBundle for the name `<service>.<namespace>.svc`, exactly as in a cluster. No
Endpoints hold a loopback address (the API server refuses them).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from metricscale import pki
from testbed.binaries import CHECKOUT, find_peer, missing_peers, where
from testbed.processes import Child, ChildFailed, free_port, wait_until

__all__ = ["ClientCert", "ControlPlane", "ControlPlaneMissing", "KubeError", "Kubelet"]

logger = logging.getLogger(__name__)

YEAR = timedelta(days=365)
SERVICE_CIDR = "10.96.0.0/24"
ISSUER = "https://kubernetes.default.svc.cluster.local"
PROXY_CLIENT = "front-proxy-client"
# Controllers the tests need; everything else in kube-controller-manager stays off.
CONTROLLERS = tuple(f"{name}-controller" for name in (
    "deployment", "replicaset", "replicationcontroller", "statefulset",
    "horizontal-pod-autoscaler", "garbage-collector", "namespace", "serviceaccount",
    "serviceaccount-token", "root-ca-certificate-publisher", "clusterrole-aggregation"))


class ControlPlaneMissing(RuntimeError):
    """A binary the control plane needs was not found."""


class KubeError(RuntimeError):
    """kube-apiserver answered an error Status."""

    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.body = body
        message = body.get("message") if isinstance(body, dict) else str(body)
        super().__init__(f"{status}: {message}")


@dataclass(frozen=True)
class ClientCert:
    """A client certificate and key on disk (PEM)."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Kubelet:
    """The kubelet stand-in's ports: `control_port` takes `PUT /usage` and serves the
    cAdvisor series (`address` is the scrape target); each Node's HTTPS port serves
    /metrics/resource."""

    control_port: int
    node_ports: Mapping[str, int]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.control_port}"

    def set_usage(self, namespace: str, pod: str, *, cpu: float | str | None = None,
                  memory: int | None = None, container: str | None = None) -> bool:
        """Sets a pod's usage (cores, bytes); False when the kubelet does not run that pod."""
        body: dict[str, Any] = {"namespace": namespace, "pod": pod}
        if cpu is not None:
            body["cpu"] = str(cpu)
        if memory is not None:
            body["memory"] = memory
        if container is not None:
            body["container"] = container
        request = urllib.request.Request(f"http://{self.address}/usage", method="PUT",
                                         data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30):
                return True
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return False
            raise

    def pods(self) -> list[str]:
        with urllib.request.urlopen(f"http://{self.address}/pods", timeout=30) as reply:
            return [str(p) for p in json.loads(reply.read())]


class ControlPlane:
    """Start with `with ControlPlane() as cluster:` (or `start()`/`stop()`)."""

    def __init__(self, *, workdir: Path | None = None, hpa_sync_period: str = "15s",
                 hpa_downscale_stabilization: str = "5m", verbosity: int = 1,
                 controllers: Sequence[str] = CONTROLLERS) -> None:
        missing = missing_peers()
        if missing:
            raise ControlPlaneMissing(
                f"the real control plane needs {', '.join(missing)}; looked in {where()}")
        self._own_dir = workdir is None
        self.dir = workdir or Path(tempfile.mkdtemp(prefix="metricscale-cluster-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.hpa_sync_period = hpa_sync_period
        self.hpa_downscale_stabilization = hpa_downscale_stabilization
        self.verbosity = verbosity
        self.controllers = tuple(controllers)
        self.children: list[Child] = []
        self.api_port = free_port()
        self.server = f"https://127.0.0.1:{self.api_port}"
        self.startup_seconds: float | None = None
        self._admin_token: str | None = None
        self._make_pki()

    # ---- files --------------------------------------------------------------------------

    def _path(self, name: str) -> Path:
        return self.dir / name

    def _write_pair(self, name: str, pair: pki.CertifiedKey) -> ClientCert:
        cert = pki.write_certificate(self._path(f"{name}.crt"), pair.certificate)
        key = pki.write_private_key(self._path(f"{name}.key"), pair.private_key)
        return ClientCert(cert=cert, key=key)

    def _make_pki(self) -> None:
        now = datetime.now(UTC) - timedelta(minutes=5)
        self.ca = pki.generate_ca(common_name="metricscale-test-cluster-ca", now=now,
                                  validity=YEAR)
        self.ca_file = pki.write_certificate(self._path("ca.crt"), self.ca.certificate)
        pki.write_private_key(self._path("ca.key"), self.ca.private_key)
        serving = pki.issue_serving_certificate(
            self.ca, common_name="kube-apiserver",
            dns_names=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                       "kubernetes.default.svc.cluster.local"],
            ip_addresses=["127.0.0.1", "10.96.0.1"], now=now, validity=YEAR)
        self.serving = self._write_pair("apiserver", serving)
        self.admin = self.client_cert("admin", groups=("system:masters",))
        self._controller_manager = self.client_cert("system:kube-controller-manager")
        self._scheduler = self.client_cert("system:kube-scheduler")
        self.front_proxy_ca = pki.generate_ca(common_name="metricscale-test-front-proxy-ca",
                                              now=now, validity=YEAR)
        self.front_proxy_ca_file = pki.write_certificate(self._path("front-proxy-ca.crt"),
                                                         self.front_proxy_ca.certificate)
        self.front_proxy_client = self._write_pair("front-proxy-client",
                                                   pki.issue_client_certificate(
                                                       self.front_proxy_ca, user=PROXY_CLIENT,
                                                       now=now, validity=YEAR))
        signing = ec.generate_private_key(ec.SECP256R1())
        self.sa_key = pki.write_private_key(self._path("sa.key"), signing)
        self.sa_pub = self._path("sa.pub")
        self.sa_pub.write_bytes(signing.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
        self.kubeconfig = self.write_kubeconfig("admin", self.admin)

    def client_cert(self, user: str, *, groups: Sequence[str] = ()) -> ClientCert:
        """A client certificate of the cluster's CA for `user` in `groups`."""
        pair = pki.issue_client_certificate(self.ca, user=user, groups=tuple(groups),
                                            now=datetime.now(UTC) - timedelta(minutes=5),
                                            validity=YEAR)
        return self._write_pair("user-" + user.replace(":", "-"), pair)

    def write_kubeconfig(self, name: str, credentials: ClientCert | str, *,
                         namespace: str | None = None, path: Path | None = None) -> Path:
        """A kubeconfig for a client certificate, or for a bearer token given as a string."""
        user: dict[str, Any]
        if isinstance(credentials, ClientCert):
            user = {"client-certificate": str(credentials.cert),
                    "client-key": str(credentials.key)}
        else:
            user = {"token": credentials}
        context: dict[str, Any] = {"cluster": "test", "user": name}
        if namespace:
            context["namespace"] = namespace
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {
                "server": self.server, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": name, "user": user}],
            "contexts": [{"name": "test", "context": context}],
        }
        target = path or self._path(f"kubeconfig-{name.replace(':', '-')}")
        target.write_text(yaml.safe_dump(config))
        target.chmod(0o600)
        return target

    # ---- lifecycle ----------------------------------------------------------------------

    def _start(self, name: str, argv: Sequence[str]) -> Child:
        child = Child(name, argv, log=self._path(f"{name}.log"), cwd=CHECKOUT)
        self.children.append(child)
        return child

    def start(self) -> None:
        began = time.monotonic()
        try:
            self._start_etcd()
            self._start_apiserver()
            self._start_controller_manager()
            self._start_scheduler()
            wait_until(self._controllers_ready, what="the controllers' service accounts",
                       timeout=180, children=self.children, interval=0.2)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        logger.info("control plane ready at %s in %.1f s (dir %s)", self.server,
                    self.startup_seconds, self.dir)

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        etcd = self._start("etcd", [
            str(find_peer("etcd")), "--name=test", f"--data-dir={self._path('etcd')}",
            f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=test=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync", "--log-level=warn", "--quota-backend-bytes=2147483648"])

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=5) as reply:
                    return bool(json.loads(reply.read()).get("health") == "true")
            except (OSError, ValueError):
                return False

        wait_until(healthy, what="etcd healthy", timeout=120, children=[etcd])

    def _start_apiserver(self) -> None:
        apiserver = self._start("kube-apiserver", [
            str(find_peer("kube-apiserver")),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.api_port}",
            f"--cert-dir={self._path('apiserver-certs')}",
            f"--tls-cert-file={self.serving.cert}", f"--tls-private-key-file={self.serving.key}",
            f"--client-ca-file={self.ca_file}",
            "--authorization-mode=RBAC",
            f"--service-account-issuer={ISSUER}",
            f"--service-account-key-file={self.sa_pub}",
            f"--service-account-signing-key-file={self.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # The front proxy: kube-apiserver proxies to aggregated servers as this client and
            # they trust the identity headers it sets because of this CA.
            f"--requestheader-client-ca-file={self.front_proxy_ca_file}",
            f"--requestheader-allowed-names={PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-uid-headers=X-Remote-Uid",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={self.front_proxy_client.cert}",
            f"--proxy-client-key-file={self.front_proxy_client.key}",
            "--enable-aggregator-routing=false",
            # 127.0.0.1 may not be written into the kubernetes Service's Endpoints.
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true", "--profiling=false",
            f"--v={self.verbosity}"])
        wait_until(lambda: self._get_ok("/readyz"), what="kube-apiserver /readyz", timeout=180,
                   children=[apiserver], interval=0.2)

    def _start_controller_manager(self) -> None:
        kubeconfig = self.write_kubeconfig("system:kube-controller-manager",
                                           self._controller_manager)
        self._start("kube-controller-manager", [
            str(find_peer("kube-controller-manager")),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--secure-port=0", "--leader-elect=false",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={self.sa_key}",
            f"--root-ca-file={self.ca_file}",
            f"--controllers={','.join(self.controllers)}",
            f"--horizontal-pod-autoscaler-sync-period={self.hpa_sync_period}",
            "--horizontal-pod-autoscaler-downscale-stabilization="
            f"{self.hpa_downscale_stabilization}",
            f"--v={self.verbosity}"])

    def _start_scheduler(self) -> None:
        kubeconfig = self.write_kubeconfig("system:kube-scheduler", self._scheduler)
        self._start("kube-scheduler", [
            str(find_peer("kube-scheduler")),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--secure-port=0", "--leader-elect=false", f"--v={self.verbosity}"])

    def _controllers_ready(self) -> bool:
        # The controllers act with their own service accounts, which the manager creates first;
        # the default service account of `default` shows the service-account controller runs.
        try:
            if "horizontal-pod-autoscaler-controller" in self.controllers:
                self.get("/api/v1/namespaces/kube-system/serviceaccounts/"
                         "horizontal-pod-autoscaler")
            self.get("/api/v1/namespaces/default/serviceaccounts/default")
        except KubeError:
            return False
        return True

    def stop(self) -> None:
        """Stops every process (the controllers first, etcd last) and removes the directory."""
        for child in reversed(self.children):
            child.stop()
        self.children.clear()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def check_running(self) -> None:
        for child in self.children:
            child.check_running()

    # ---- a small synchronous client (the admin's certificate) ----------------------------

    def _context(self, cert: ClientCert | None = None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        chosen = cert or self.admin
        context.load_cert_chain(str(chosen.cert), str(chosen.key))
        return context

    def _get_ok(self, path: str) -> bool:
        try:
            self.request("GET", path)
        except (KubeError, OSError):
            return False
        return True

    def request(self, method: str, path: str, body: Any = None, *,
                content_type: str = "application/json", token: str | None = None,
                cert: ClientCert | None = None, timeout: float = 60.0) -> Any:
        data = None if body is None else (body if isinstance(body, bytes)
                                          else json.dumps(body).encode())
        request = urllib.request.Request(self.server + path, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", content_type)
        context = ssl.create_default_context(cafile=str(self.ca_file)) if token else \
            self._context(cert)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, context=context, timeout=timeout) as reply:
                raw = reply.read()
        except urllib.error.HTTPError as error:
            raw = error.read()
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = raw.decode(errors="replace")
            raise KubeError(error.code, parsed) from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def apply(self, obj: Mapping[str, Any], *, field_manager: str = "testbed") -> Any:
        """Server-side apply of one object (created or updated)."""
        path = self.object_path(obj) + f"?fieldManager={field_manager}&force=true"
        return self.request("PATCH", path, dict(obj),
                            content_type="application/apply-patch+yaml")

    def delete(self, obj: Mapping[str, Any]) -> None:
        with contextlib.suppress(KubeError):
            self.request("DELETE", self.object_path(obj))

    def object_path(self, obj: Mapping[str, Any]) -> str:
        api_version = str(obj["apiVersion"])
        kind = str(obj["kind"])
        metadata = obj.get("metadata") or {}
        prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        resource = self._plural(api_version, kind)
        namespace = metadata.get("namespace")
        if namespace:
            prefix += f"/namespaces/{namespace}"
        return f"{prefix}/{resource}/{metadata['name']}"

    def _plural(self, api_version: str, kind: str) -> str:
        path = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        for resource in self.get(path).get("resources", []):
            if resource.get("kind") == kind and "/" not in resource.get("name", ""):
                return str(resource["name"])
        raise KubeError(404, {"message": f"no resource of kind {kind} in {api_version}"})

    def service_account_token(self, namespace: str, name: str, *,
                              seconds: int = 3600, audiences: Sequence[str] = ()) -> str:
        """A bound token of a service account (created if missing), from the TokenRequest API."""
        with contextlib.suppress(KubeError):
            self.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts",
                         {"apiVersion": "v1", "kind": "ServiceAccount",
                          "metadata": {"name": name, "namespace": namespace}})
        spec: dict[str, Any] = {"expirationSeconds": seconds}
        if audiences:
            spec["audiences"] = list(audiences)
        reply = self.request(
            "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
        return str(reply["status"]["token"])

    def admin_token(self) -> str:
        """A token of a cluster-admin service account (kube-system/testbed-admin), for clients
        that cannot present the admin's certificate (through the fault proxy)."""
        if self._admin_token is None:
            self.apply({"apiVersion": "rbac.authorization.k8s.io/v1",
                        "kind": "ClusterRoleBinding",
                        "metadata": {"name": "testbed-admin"},
                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                    "kind": "ClusterRole", "name": "cluster-admin"},
                        "subjects": [{"kind": "ServiceAccount", "name": "testbed-admin",
                                      "namespace": "kube-system"}]})
            self._admin_token = self.service_account_token("kube-system", "testbed-admin",
                                                           seconds=24 * 3600)
        return self._admin_token

    def api_client_configuration(self, token: str | None = None,
                                 server: str | None = None) -> Any:
        """A kubernetes_asyncio Configuration with a bearer token (the admin's by default)."""
        from kubernetes_asyncio.client import Configuration

        configuration = Configuration(host=server or self.server)
        configuration.ssl_ca_cert = str(self.ca_file)
        configuration.api_key = {"BearerToken": token or self.admin_token()}
        configuration.api_key_prefix = {"BearerToken": "Bearer"}
        return configuration

    # ---- aggregation ----------------------------------------------------------------------

    def register_apiservice(self, group: str, version: str, *, port: int, ca_pem: bytes,
                            namespace: str = "metricscale", service: str = "metricscale-adapter",
                            priority: tuple[int, int] = (100, 100)) -> None:
        """An APIService for group/version served at https://localhost:`port`, through an
        ExternalName Service (see the module docstring)."""
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        self.apply({"apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": service, "namespace": namespace},
                    "spec": {"type": "ExternalName", "externalName": "localhost",
                             "ports": [{"name": "https", "port": port}]}})
        self.apply({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                    "metadata": {"name": f"{version}.{group}"},
                    "spec": {"group": group, "version": version,
                             "groupPriorityMinimum": priority[0],
                             "versionPriority": priority[1],
                             "service": {"namespace": namespace, "name": service, "port": port},
                             "caBundle": base64.b64encode(ca_pem).decode()}})

    def apiservice_available(self, group: str, version: str) -> tuple[bool, str]:
        try:
            obj = self.get(f"/apis/apiregistration.k8s.io/v1/apiservices/{version}.{group}")
        except KubeError as error:
            return False, str(error)
        for condition in (obj.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "Available":
                return condition.get("status") == "True", str(condition.get("message", ""))
        return False, "no Available condition yet"

    def wait_apiservice_available(self, group: str, version: str, *,
                                  timeout: float = 120) -> None:
        last = [""]

        def available() -> bool:
            ok, last[0] = self.apiservice_available(group, version)
            return ok

        try:
            wait_until(available, what=f"APIService {version}.{group} Available",
                       timeout=timeout, children=self.children, interval=0.2)
        except ChildFailed as error:
            raise ChildFailed(f"{error}\nlast condition: {last[0]}") from None

    # ---- the kubelet stand-in ------------------------------------------------------------

    def start_kubelet(self, nodes: Sequence[str] = ("node-a", "node-b")) -> Kubelet:
        """`testbed.kubelet` for `nodes`, once they are registered."""
        now = datetime.now(UTC) - timedelta(minutes=5)
        serving = self._write_pair("kubelet-serving", pki.issue_serving_certificate(
            self.ca, common_name="kubelet", dns_names=["localhost", *nodes],
            ip_addresses=["127.0.0.1"], now=now, validity=YEAR))
        ready = self._path("kubelet.ready")
        ready.unlink(missing_ok=True)
        child = self._start("kubelet", [
            sys.executable, "-m", "testbed.kubelet", f"--server={self.server}",
            f"--ca={self.ca_file}", f"--cert={self.admin.cert}", f"--key={self.admin.key}",
            f"--serving-cert={serving.cert}", f"--serving-key={serving.key}",
            f"--nodes={','.join(nodes)}", f"--ready-file={ready}"])
        wait_until(ready.exists, what="the kubelet stand-in's nodes registered", timeout=60,
                   children=[child])
        info = json.loads(ready.read_text())
        return Kubelet(control_port=int(info["control_port"]),
                       node_ports={k: int(v) for k, v in info["node_ports"].items()})

    # ---- kubectl --------------------------------------------------------------------------

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                kubeconfig: Path | None = None, timeout: float = 120
                ) -> subprocess.CompletedProcess[str]:
        """The kubectl built with this control plane, as the admin unless told otherwise."""
        argv = [str(find_peer("kubectl")), f"--kubeconfig={kubeconfig or self.kubeconfig}",
                *args]
        result = subprocess.run(argv, input=input, capture_output=True, text=True,
                                timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise KubeError(result.returncode, {"message": f"kubectl {' '.join(args)}: "
                                                           f"{result.stderr.strip()}"})
        return result


def main() -> None:  # pragma: no cover - a manual check: python -m testbed.controlplane
    logging.basicConfig(level=logging.INFO)
    with ControlPlane() as cluster:
        print(f"ready in {cluster.startup_seconds:.1f} s; KUBECONFIG={cluster.kubeconfig}")
        print(cluster.kubectl("get", "--raw", "/version").stdout)
        print(cluster.kubectl("get", "serviceaccounts", "-A").stdout)


if __name__ == "__main__":  # pragma: no cover
    main()
