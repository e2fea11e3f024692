"""Self-managed certificates against the fake API server: Secret, caBundles, rotation, RBAC."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from adapter.security.selfcerts import (
    PermissionMissing,
    SelfCertsConfig,
    SelfManagedCertificates,
    needs_renewal,
    serving_dns_names,
)
from adapter.security.tls import ReloadingServerContext
from metricscale import pki
from metricscale.kube.http import connect
from testbed.fakes.kube_api import FakeKubeAPI, RequestAttributes

NAMESPACE = "metricscale"
SERVICE = "metricscale-adapter"
SECRET = "metricscale-adapter-certs"
GROUP_VERSIONS = (("custom.metrics.k8s.io", "v1beta1", 100),
                  ("custom.metrics.k8s.io", "v1beta2", 200),
                  ("external.metrics.k8s.io", "v1beta1", 100))
APISERVICES = tuple(f"{version}.{group}" for group, version, _ in GROUP_VERSIONS)
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _config(cert_dir: Path, *, validity: timedelta = timedelta(days=365)) -> SelfCertsConfig:
    return SelfCertsConfig(namespace=NAMESPACE, secret_name=SECRET, service_name=SERVICE,
                           cert_dir=cert_dir, apiservices=APISERVICES,
                           optional_apiservices=("v1beta1.metrics.k8s.io",),
                           serving_validity=validity)


def _register(kube: FakeKubeAPI) -> None:
    with contextlib.suppress(Exception):
        kube.create_namespace(NAMESPACE)
    for group, version, priority in GROUP_VERSIONS:
        kube.create_apiservice(group=group, version=version, service_namespace=NAMESPACE,
                               service_name=SERVICE, version_priority=priority)


def _secret(kube: FakeKubeAPI) -> dict[str, object]:
    obj = kube.store.try_get("", "v1", "secrets", SECRET, namespace=NAMESPACE)
    assert obj is not None
    return obj


async def _discovery(request: web.Request) -> web.Response:
    group, version = request.match_info["group"], request.match_info["version"]
    return web.json_response({"kind": "APIResourceList", "apiVersion": "v1",
                              "groupVersion": f"{group}/{version}", "resources": []})


@contextlib.asynccontextmanager
async def _serving(tls: ReloadingServerContext) -> AsyncIterator[int]:
    """A stand-in adapter that answers discovery over the reloading TLS context."""
    app = web.Application()
    app.router.add_get("/apis/{group}/{version}", _discovery)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls.listening_context)
    await site.start()
    server = site._server
    assert server is not None
    port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
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
# Against the fake API server


async def test_first_start_creates_the_secret_and_the_aggregator_reaches_the_adapter(
        fake_kube: FakeKubeAPI, kubeconfig: Path, tmp_path: Path) -> None:
    _register(fake_kube)
    async with connect(kubeconfig=str(kubeconfig), user_agent="test") as http:
        certificates = SelfManagedCertificates(http, _config(tmp_path / "certs"))
        bundle = await certificates.reconcile_once(now=datetime.now(UTC))
    secret = _secret(fake_kube)
    assert secret["type"] == "kubernetes.io/tls"
    assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt", "ca.key"}  # type: ignore
    for name in APISERVICES:
        obj = fake_kube.store.try_get("apiregistration.k8s.io", "v1", "apiservices", name)
        assert obj is not None
        assert base64.b64decode(obj["spec"]["caBundle"]) == bundle.ca_pem
    cert, key = certificates.files()
    leaf = pki.load_certificates_pem(cert.read_bytes())[0]
    names = leaf.extensions.get_extension_for_class(
        pki.x509.SubjectAlternativeName).value.get_values_for_type(pki.x509.DNSName)
    assert f"{SERVICE}.{NAMESPACE}.svc" in names
    tls = ReloadingServerContext(cert_file=cert, key_file=key)
    async with _serving(tls) as port:
        fake_kube.set_service_endpoint(NAMESPACE, SERVICE, "127.0.0.1", port)
        for name in APISERVICES:
            await fake_kube.wait_for_apiservice(name)
        # A proxied request verifies the adapter against the caBundle (ServerName ...svc).
        headers = {"Authorization": f"Bearer {fake_kube.admin_token}"}
        async with aiohttp.ClientSession() as session, session.get(
                f"{fake_kube.url}/apis/custom.metrics.k8s.io/v1beta2",
                headers=headers, ssl=ssl.create_default_context(
                    cafile=str(fake_kube.ca_file))) as response:
            assert response.status == 200, await response.text()


async def test_a_second_replica_reuses_the_secret_and_its_ca(
        fake_kube: FakeKubeAPI, kubeconfig: Path, tmp_path: Path) -> None:
    _register(fake_kube)
    async with connect(kubeconfig=str(kubeconfig), user_agent="test") as http:
        first, second = await asyncio.gather(
            SelfManagedCertificates(http, _config(tmp_path / "a")).reconcile_once(
                now=datetime.now(UTC)),
            SelfManagedCertificates(http, _config(tmp_path / "b")).reconcile_once(
                now=datetime.now(UTC)))
    assert first.ca_pem == second.ca_pem
    assert (tmp_path / "a" / "serving.crt").read_bytes() == \
        (tmp_path / "b" / "serving.crt").read_bytes()


async def test_rotation_updates_secret_and_files_without_failing_a_request(
        fake_kube: FakeKubeAPI, kubeconfig: Path, tmp_path: Path) -> None:
    _register(fake_kube)
    config = _config(tmp_path / "certs", validity=timedelta(days=3))
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
    secret = _secret(fake_kube)
    assert base64.b64decode(secret["data"]["tls.crt"]) == after.cert_pem  # type: ignore
    assert (tmp_path / "other" / "serving.crt").read_bytes().startswith(after.cert_pem)


@pytest.mark.parametrize(("denied_verb", "denied_resource", "expected"), [
    ("patch", "apiservices",
     'the adapter may not patch apiservices.apiregistration.k8s.io '
     '"v1beta1.custom.metrics.k8s.io": grant it in the adapter\'s ClusterRole'),
    ("create", "secrets",
     'the adapter may not create secrets "metricscale-adapter-certs" in namespace '
     "'metricscale': grant it in the adapter's Role"),
])
async def test_missing_rbac_names_the_permission(
        fake_kube: FakeKubeAPI, tmp_path: Path, denied_verb: str, denied_resource: str,
        expected: str) -> None:
    _register(fake_kube)
    fake_kube.add_user(token="adapter-token", username="system:serviceaccount:metricscale:a")

    def authorize(attributes: RequestAttributes) -> bool:
        return not (attributes.verb == denied_verb and attributes.resource == denied_resource)

    fake_kube.authorizer = authorize
    kubeconfig = fake_kube.write_kubeconfig(tmp_path / "kc", token="adapter-token")
    async with connect(kubeconfig=str(kubeconfig), user_agent="test") as http:
        with pytest.raises(PermissionMissing) as caught:
            await SelfManagedCertificates(http, _config(tmp_path / "c")).reconcile_once(
                now=datetime.now(UTC))
    assert str(caught.value).startswith(expected)
