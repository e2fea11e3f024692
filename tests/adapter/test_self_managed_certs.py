"""Self-managed certificates on the session's real control plane: the Secret, the caBundles of
the APIServices (the real aggregator verifying the adapter against them), rotation, RBAC.

Each test works in a namespace of its own (module-unique names, deleted at the module's end)
under a service account given the manifests' certificate RBAC (manifests/adapter/rbac.yaml: the
Role on the Secret, the ClusterRole patching the APIServices by name), or that RBAC with one verb
taken out. The APIServices are cluster-scoped and other modules of the session own them: the
tests that need them register them for a Service of their own and give them back as they were
(v1beta1.metrics.k8s.io too, which the adapter patches when it exists).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import functools
import itertools
import ssl
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from cryptography import x509

from adapter.security.selfcerts import (
    PermissionMissing,
    SelfCertsConfig,
    SelfManagedCertificates,
    default_apiservices,
    needs_renewal,
    serving_dns_names,
)
from adapter.security.tls import ReloadingServerContext
from metricscale import pki
from metricscale.kube.http import connect
from testbed.binaries import CHECKOUT
from testbed.controlplane import ControlPlane
from testbed.processes import free_port, wait_until
from tests.adapter.cluster import GROUP_VERSIONS, ModuleCluster, apiservices_given_back

SERVICE = "metricscale-adapter"
SECRET = "metricscale-adapter-certs"
APISERVICES = tuple(f"{version}.{group}" for group, version, _ in GROUP_VERSIONS)
OPTIONAL_APISERVICES = ("v1beta1.metrics.k8s.io",)
NOW = datetime(2026, 1, 1, tzinfo=UTC)
DAY = 24 * 3600
# Bound on waits for the cluster (RBAC caches, the availability controller) on a busy machine.
WAIT = 120.0
_SERIAL = itertools.count(1)


def _manifest_rbac() -> tuple[dict[str, Any], dict[str, Any]]:
    """The manifests' Role on the certificate Secret and ClusterRole on the APIServices."""
    documents = [d for d in yaml.safe_load_all(
        (CHECKOUT / "manifests/adapter/rbac.yaml").read_text()) if d]
    role = next(d for d in documents
                if d["kind"] == "Role" and d["metadata"]["name"] == "metricscale-adapter-certs")
    cluster_role = next(d for d in documents if d["kind"] == "ClusterRole"
                        and d["metadata"]["name"] == "metricscale-adapter-apiservices")
    return copy.deepcopy(role), copy.deepcopy(cluster_role)


def _without(rules: list[dict[str, Any]],
             denied: tuple[str, str] | None) -> list[dict[str, Any]]:
    """`rules` with verb `denied[0]` on resource `denied[1]` taken out."""
    if denied is None:
        return rules
    verb, resource = denied
    kept = []
    for rule in rules:
        if resource in rule.get("resources", ()):
            rule = {**rule, "verbs": [v for v in rule["verbs"] if v != verb]}
        if rule["verbs"]:
            kept.append(rule)
    return kept


@dataclass
class Certs:
    """One test's namespace in the shared cluster, and accounts of the adapter in it."""

    module: ModuleCluster
    namespace: str
    workdir: Path
    port: int  # where the APIServices send the aggregator (the stand-in adapter listens there)

    @property
    def control_plane(self) -> ControlPlane:
        return self.module.control_plane

    def config(self, cert_dir: Path, *,
               validity: timedelta = timedelta(days=365)) -> SelfCertsConfig:
        return SelfCertsConfig(namespace=self.namespace, secret_name=SECRET,
                               service_name=SERVICE, cert_dir=cert_dir, apiservices=APISERVICES,
                               optional_apiservices=OPTIONAL_APISERVICES,
                               serving_validity=validity)

    def account(self, *, denied: tuple[str, str] | None = None) -> Path:
        """A kubeconfig of a new service account with the manifests' certificate RBAC (but
        `denied`: verb and resource), once kube-apiserver's authorizer applies it."""
        cluster = self.control_plane
        name = f"adapter-{next(_SERIAL)}"
        role, cluster_role = _manifest_rbac()
        role["metadata"] = {"name": f"{name}-certs", "namespace": self.namespace}
        role["rules"] = _without(role["rules"], denied)
        # Cluster-scoped: named after the test's namespace (unique), deleted at the module's end.
        cluster_role["metadata"] = {"name": f"{self.namespace}-{name}-apiservices"}
        cluster_role["rules"] = _without(cluster_role["rules"], denied)
        subjects = [{"kind": "ServiceAccount", "name": name, "namespace": self.namespace}]
        role_binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                        "metadata": dict(role["metadata"]), "subjects": subjects,
                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                    "name": role["metadata"]["name"]}}
        cluster_role_binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": dict(cluster_role["metadata"]), "subjects": subjects,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": cluster_role["metadata"]["name"]}}
        self.module.cleanup.add(cluster_role, cluster_role_binding)
        for obj in (role, role_binding, cluster_role, cluster_role_binding):
            cluster.apply(obj)
        token = cluster.service_account_token(self.namespace, name, seconds=DAY)
        kubeconfig = cluster.write_kubeconfig(name, token,
                                              path=self.workdir / f"{name}.kubeconfig")
        granted = [(verb, "", "secrets", self.namespace, SECRET if verb != "create" else "")
                   for verb in ("create", "get", "update")]
        granted += [("patch", "apiregistration.k8s.io", "apiservices", "", apiservice)
                    for apiservice in APISERVICES]
        user = f"system:serviceaccount:{self.namespace}:{name}"
        # RBAC objects reach the authorizer through its informers: wait until they apply.
        for verb, group, resource, namespace, object_name in granted:
            if denied == (verb, resource):
                continue
            wait_until(functools.partial(self.allowed, user, verb, group, resource, namespace,
                                         object_name),
                       what=f"{user} may {verb} {resource}", timeout=WAIT, interval=0.05)
        return kubeconfig

    def allowed(self, user: str, verb: str, group: str, resource: str, namespace: str,
                name: str) -> bool:
        review = self.control_plane.request(
            "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", {
                "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "spec": {"user": user, "groups": ["system:serviceaccounts",
                                                  f"system:serviceaccounts:{self.namespace}",
                                                  "system:authenticated"],
                         "resourceAttributes": {"verb": verb, "group": group,
                                                "resource": resource, "namespace": namespace,
                                                "name": name}}})
        return bool(review["status"].get("allowed"))

    def register_apiservices(self) -> None:
        """The three APIServices for this test's Service, with a caBundle the adapter must
        replace (the cluster's CA: not the adapter's)."""
        for group, version, priority in GROUP_VERSIONS:
            self.control_plane.register_apiservice(
                group, version, port=self.port, ca_pem=self.control_plane.ca_file.read_bytes(),
                namespace=self.namespace, service=SERVICE, priority=(100, priority))

    def secret(self) -> dict[str, Any]:
        secret: dict[str, Any] = self.control_plane.get(
            f"/api/v1/namespaces/{self.namespace}/secrets/{SECRET}")
        return secret

    def ca_bundle(self, apiservice: str) -> bytes:
        obj = self.control_plane.get(f"/apis/apiregistration.k8s.io/v1/apiservices/{apiservice}")
        return base64.b64decode(obj["spec"]["caBundle"])


@pytest.fixture
def certs(cluster: ModuleCluster, tmp_path: Path) -> Certs:
    """A namespace of the test's own (the Secret of one test is not the next one's)."""
    namespace = cluster.namespace(f"certs-{next(_SERIAL)}")
    return Certs(cluster, namespace, tmp_path, free_port())


@pytest.fixture
def apiservices(certs: Certs) -> Iterator[None]:
    """The APIServices registered for the test's Service, given back as they were after."""
    with apiservices_given_back(certs.control_plane,
                                (*default_apiservices()[0], *default_apiservices()[1])):
        certs.register_apiservices()
        yield


async def _discovery(request: web.Request) -> web.Response:
    group, version = request.match_info["group"], request.match_info["version"]
    return web.json_response({"kind": "APIResourceList", "apiVersion": "v1",
                              "groupVersion": f"{group}/{version}", "resources": []})


@contextlib.asynccontextmanager
async def _serving(tls: ReloadingServerContext, port: int = 0) -> AsyncIterator[int]:
    """A stand-in adapter that answers discovery over the reloading TLS context."""
    app = web.Application()
    app.router.add_get("/apis/{group}/{version}", _discovery)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=tls.listening_context)
    await site.start()
    server = site._server
    assert server is not None
    port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    try:
        yield port
    finally:
        await runner.cleanup()


def _client_context(ca_pem: bytes) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=ca_pem.decode())
    return context


# --------------------------------------------------------------------------------------------
# Pure decisions


def test_renewal_is_due_when_less_than_a_third_of_the_life_is_left() -> None:
    ca = pki.generate_ca(common_name="ca", now=NOW, validity=timedelta(days=30))
    leaf = pki.issue_serving_certificate(ca, common_name="x", dns_names=("x",), now=NOW,
                                         validity=timedelta(days=30)).certificate
    assert not needs_renewal(leaf, now=NOW + timedelta(days=19))
    assert needs_renewal(leaf, now=NOW + timedelta(days=21))


def test_serving_names_cover_every_form_of_the_service_name() -> None:
    assert serving_dns_names("a", "b") == ("a", "a.b", "a.b.svc", "a.b.svc.cluster.local")


# --------------------------------------------------------------------------------------------
# Against the session's control plane
#
# The stand-in adapter below answers on the test's own event loop: every blocking call to the
# cluster made while it must answer runs in a thread (asyncio.to_thread).


@pytest.mark.usefixtures("apiservices")
async def test_first_start_creates_the_secret_and_the_aggregator_reaches_the_adapter(
        certs: Certs, tmp_path: Path) -> None:
    kubeconfig = await asyncio.to_thread(certs.account)
    async with connect(kubeconfig=str(kubeconfig), user_agent="test") as http:
        certificates = SelfManagedCertificates(http, certs.config(tmp_path / "certs"))
        bundle = await certificates.reconcile_once(now=datetime.now(UTC))
    secret = await asyncio.to_thread(certs.secret)
    assert secret["type"] == "kubernetes.io/tls"
    assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt", "ca.key"}
    for name in APISERVICES:
        assert await asyncio.to_thread(certs.ca_bundle, name) == bundle.ca_pem
    cert, key = certificates.files()
    leaf = pki.load_certificates_pem(cert.read_bytes())[0]
    names = leaf.extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert f"{SERVICE}.{certs.namespace}.svc" in names
    tls = ReloadingServerContext(cert_file=cert, key_file=key)
    control_plane = certs.control_plane
    async with _serving(tls, certs.port):
        for group, version, _ in GROUP_VERSIONS:
            await asyncio.to_thread(control_plane.wait_apiservice_available, group, version,
                                    timeout=WAIT)
        # Proxied by the real aggregator, which verifies the adapter against the caBundle
        # (ServerName <service>.<namespace>.svc).
        answer = await asyncio.to_thread(control_plane.get, "/apis/custom.metrics.k8s.io/v1beta2")
        assert answer["groupVersion"] == "custom.metrics.k8s.io/v1beta2", answer


@pytest.mark.usefixtures("apiservices")
async def test_a_second_replica_reuses_the_secret_and_its_ca(
        certs: Certs, tmp_path: Path) -> None:
    kubeconfig = await asyncio.to_thread(certs.account)
    async with connect(kubeconfig=str(kubeconfig), user_agent="test") as http:
        first, second = await asyncio.gather(
            SelfManagedCertificates(http, certs.config(tmp_path / "a")).reconcile_once(
                now=datetime.now(UTC)),
            SelfManagedCertificates(http, certs.config(tmp_path / "b")).reconcile_once(
                now=datetime.now(UTC)))
    assert first.ca_pem == second.ca_pem
    assert (tmp_path / "a" / "serving.crt").read_bytes() == \
        (tmp_path / "b" / "serving.crt").read_bytes()


@pytest.mark.usefixtures("apiservices")
async def test_rotation_updates_secret_and_files_without_failing_a_request(
        certs: Certs, tmp_path: Path) -> None:
    kubeconfig = await asyncio.to_thread(certs.account)
    config = certs.config(tmp_path / "certs", validity=timedelta(days=3))
    start = datetime.now(UTC)
    async with connect(kubeconfig=str(kubeconfig), user_agent="test") as http:
        replica = SelfManagedCertificates(http, config)
        other = SelfManagedCertificates(http, replace(config, cert_dir=tmp_path / "other"))
        before = await replica.reconcile_once(now=start)
        await other.reconcile_once(now=start)
        cert, key = replica.files()
        tls = ReloadingServerContext(cert_file=cert, key_file=key)
        async with _serving(tls) as port, aiohttp.ClientSession() as session:
            url = f"https://127.0.0.1:{port}/apis/custom.metrics.k8s.io/v1beta1"
            context = _client_context(before.ca_pem)
            context.check_hostname = False
            seen: set[bytes] = set()
            failures: list[BaseException] = []
            stop = asyncio.Event()

            async def loop() -> int:
                count = 0
                while not stop.is_set():
                    try:
                        async with session.get(url, ssl=context) as response:
                            assert response.status == 200
                            count += 1
                    except (aiohttp.ClientError, AssertionError) as error:
                        failures.append(error)
                    await asyncio.sleep(0)
                return count

            def served() -> bytes:
                return ssl.get_server_certificate(("127.0.0.1", port)).encode()

            requests = asyncio.create_task(loop())
            seen.add(await asyncio.to_thread(served))
            # Two days in, less than a third of three days is left: renew.
            later = start + timedelta(days=2, hours=1)
            after = await replica.reconcile_once(now=later)
            assert after.cert_pem != before.cert_pem
            assert after.ca_pem == before.ca_pem
            assert tls.reload_if_changed()
            seen.add(await asyncio.to_thread(served))
            # The other replica follows the Secret rather than renewing again.
            followed = await other.reconcile_once(now=later)
            assert followed.cert_pem == after.cert_pem
            stop.set()
            count = await requests
    assert not failures
    assert count > 0
    assert len(seen) == 2
    secret = await asyncio.to_thread(certs.secret)
    assert base64.b64decode(secret["data"]["tls.crt"]) == after.cert_pem
    assert (tmp_path / "other" / "serving.crt").read_bytes().startswith(after.cert_pem)


@pytest.mark.parametrize(("denied_verb", "denied_resource", "expected"), [
    ("patch", "apiservices",
     'the adapter may not patch apiservices.apiregistration.k8s.io '
     '"v1beta1.custom.metrics.k8s.io": grant it in the adapter\'s ClusterRole'),
    ("create", "secrets",
     'the adapter may not create secrets "metricscale-adapter-certs" in namespace '
     "'{namespace}': grant it in the adapter's Role"),
])
async def test_missing_rbac_names_the_permission(
        certs: Certs, tmp_path: Path, denied_verb: str, denied_resource: str,
        expected: str) -> None:
    # The manifests' RBAC less one verb. No APIService is registered: kube-apiserver authorizes
    # a patch before it looks the object up, so the refusal is the same (and nothing shared is
    # touched).
    kubeconfig = await asyncio.to_thread(certs.account,
                                         denied=(denied_verb, denied_resource))
    async with connect(kubeconfig=str(kubeconfig), user_agent="test") as http:
        with pytest.raises(PermissionMissing) as caught:
            await SelfManagedCertificates(http, certs.config(tmp_path / "c")).reconcile_once(
                now=datetime.now(UTC))
    assert str(caught.value).startswith(expected.format(namespace=certs.namespace)), \
        caught.value
