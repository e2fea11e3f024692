"""The real `metricscale adapter` process behind the real aggregator: kubectl as an allowed and
a refused user, TLS as served, secrets in its whole log, `--insecure-disable-auth`, bad flags.

The process logs at debug level to a file and reaches kube-apiserver through a recording fault
proxy (the reviews it sends are seen as sent); kubectl's users are client certificates of the
cluster's CA (RBAC lets alice read metrics, not denied-bob) or service account tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import ssl
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from testbed.binaries import find_peer
from testbed.fakes.prometheus import ExporterPool, PrometheusServer
from testbed.pytest_plugin import require_peers
from tests.adapter.auth_support import (
    APISERVICE_NAMES,
    AuthPKI,
    HandshakeFailed,
    Reply,
    Seeded,
    client_context,
    export_series,
    https_request,
    prepare_real_cluster,
    register_real_apiservices,
    rules_yaml,
    secrets_in,
    wait_for_exported_series,
    write_file,
)
from tests.adapter.cluster import ModuleCluster, RecordingProxy, apiservices_given_back, proxy_for

pytestmark = [pytest.mark.prometheus, pytest.mark.asyncio(loop_scope="module")]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class AdapterProcess:
    process: asyncio.subprocess.Process
    port: int
    log_file: Path
    pki: AuthPKI

    @property
    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    async def request(self, path: str, **kwargs: object) -> Reply:
        return await https_request(self.port, path, ca_file=self.pki.serving_ca_file,
                                   **kwargs)  # type: ignore[arg-type]

    async def wait_ready(self, *, within: float = 120.0) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.process.returncode is not None:
                raise AssertionError(f"the adapter exited ({self.process.returncode}):\n"
                                     f"{self.log[-3000:]}")
            with contextlib.suppress(HandshakeFailed, OSError):
                if (await self.request("/readyz")).status == 200:
                    return
            await asyncio.sleep(0.1)
        raise AssertionError(f"the adapter was not ready within {within}s:\n{self.log[-3000:]}")

    async def stop(self) -> int:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(15):
                return await self.process.wait()
        except TimeoutError:
            self.process.kill()
            return await self.process.wait()


@contextlib.asynccontextmanager
async def adapter_process(workdir: Path, args: Sequence[str], *, test_pki: AuthPKI,
                          wait: bool = True) -> AsyncIterator[AdapterProcess]:
    port = free_port()
    log_file = workdir / f"adapter-{port}.log"
    with log_file.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "metricscale", "adapter", "--bind-address", "127.0.0.1",
            "--secure-port", str(port), "--tls-cert-file", str(test_pki.serving_cert),
            "--tls-private-key-file", str(test_pki.serving_key), "--log-level", "debug",
            "--metrics-relist-interval", "1h", *args,
            stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    running = AdapterProcess(process, port, log_file, test_pki)
    try:
        if wait:
            await running.wait_ready()
        yield running
    finally:
        await running.stop()


@dataclass
class World:
    module: ModuleCluster
    kube: RecordingProxy
    adapter: AdapterProcess
    workdir: Path
    pki: AuthPKI
    args: tuple[str, ...]
    seeded: Seeded
    users_namespace: str
    tokens: list[str]

    @property
    def path(self) -> str:
        return (f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{self.seeded.shop}/pods/*/"
                "http_requests")

    def kubeconfig(self, user: str) -> Path:
        """kubectl as `user`, by a client certificate of the cluster's CA."""
        control_plane = self.module.control_plane
        return control_plane.write_kubeconfig(
            user, control_plane.client_cert(user),
            path=self.workdir / f"{user}.kubeconfig")

    def token_kubeconfig(self, account: str) -> Path:
        """kubectl as service account `account` of the module's users namespace (a token)."""
        control_plane = self.module.control_plane
        token = control_plane.service_account_token(self.users_namespace, account)
        self.tokens.append(token)
        return control_plane.write_kubeconfig(account, token,
                                              path=self.workdir / f"{account}.kubeconfig")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(cluster: ModuleCluster, tmp_path_factory: pytest.TempPathFactory,
                prometheus: PrometheusServer, exporter_pool: ExporterPool,
                ) -> AsyncIterator[World]:
    workdir = tmp_path_factory.mktemp("adapter-process")
    control_plane = cluster.control_plane
    prepared = await prepare_real_cluster(cluster, workdir, readers=("alice",))
    with exporter_pool.exporter() as exporter:
        count = export_series(exporter, prepared.seeded)
        await wait_for_exported_series(prometheus, exporter, count)
        config = write_file(workdir / "config.yaml", rules_yaml(exporter.job))
        async with proxy_for(control_plane) as kube:
            args = ("--config", str(config), "--prometheus-url", prometheus.url,
                    "--kubeconfig", str(cluster.adapter_kubeconfig(server=kube.server)))
            async with adapter_process(workdir, args, test_pki=prepared.pki) as adapter:
                with apiservices_given_back(control_plane, APISERVICE_NAMES):
                    await asyncio.to_thread(
                        register_real_apiservices, control_plane, port=adapter.port,
                        ca_pem=prepared.pki.serving_ca.certificate_pem,
                        namespace=prepared.adapter_namespace)
                    yield World(cluster, kube, adapter, workdir, prepared.pki, args,
                                prepared.seeded, prepared.users_namespace, [])


async def kubectl(kubeconfig: Path, *args: str) -> tuple[int, str, str]:
    require_peers("kubectl")
    binary = find_peer("kubectl")
    assert binary is not None
    process = await asyncio.create_subprocess_exec(
        binary, "--kubeconfig", str(kubeconfig), *args, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(60):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@pytest.mark.kubectl
async def test_kubectl_get_raw_through_the_aggregator_as_an_authorized_user(
        world: World) -> None:
    code, out, err = await kubectl(world.kubeconfig("alice"), "get", "--raw",
                                   f"{world.path}?labelSelector=app%3Dweb")
    assert code == 0, err
    body = json.loads(out)
    assert body["kind"] == "MetricValueList"
    assert sorted(i["describedObject"]["name"] for i in body["items"]) == ["web-0", "web-1"]
    (review,) = world.kube.subject_access_reviews("alice")
    assert review["spec"]["resourceAttributes"]["subresource"] == "http_requests"


@pytest.mark.kubectl
async def test_kubectl_get_raw_through_the_aggregator_as_an_unauthorized_user(
        world: World) -> None:
    code, out, err = await kubectl(world.kubeconfig("denied-bob"), "get", "--raw", world.path)
    assert code != 0 and not out
    assert ('Error from server (Forbidden): pods.custom.metrics.k8s.io "*" is forbidden: '
            'User "denied-bob" cannot get resource "pods/http_requests" in API group '
            f'"custom.metrics.k8s.io" in the namespace "{world.seeded.shop}"') in err


async def test_process_serves_tls_12_or_later_and_never_h2(world: World) -> None:
    modern = client_context(world.pki.serving_ca_file)
    modern.set_alpn_protocols(["h2", "http/1.1"])
    _, writer = await asyncio.open_connection("127.0.0.1", world.adapter.port, ssl=modern,
                                              server_hostname="localhost")
    ssl_object = writer.get_extra_info("ssl_object")
    assert ssl_object.selected_alpn_protocol() == "http/1.1"
    assert ssl_object.version() in {"TLSv1.2", "TLSv1.3"}
    writer.close()
    with contextlib.suppress(ssl.SSLError, ConnectionError):
        await writer.wait_closed()
    old = client_context(world.pki.serving_ca_file)
    old.set_ciphers("ALL:@SECLEVEL=0")
    old.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    with pytest.warns(DeprecationWarning):
        old.maximum_version = ssl.TLSVersion.TLSv1_1
    with pytest.raises((ssl.SSLError, ConnectionError)):
        await asyncio.open_connection("127.0.0.1", world.adapter.port, ssl=old,
                                      server_hostname="localhost")


async def test_insecure_disable_auth_warns_at_start_and_says_so_in_readyz(
        world: World) -> None:
    async with adapter_process(world.workdir, [*world.args, "--insecure-disable-auth"],
                               test_pki=world.pki) as insecure:
        verbose = await insecure.request("/readyz?verbose")
        assert verbose.status == 200, verbose
        assert "[+]insecure-disable-auth ok" in verbose.text
        assert "--insecure-disable-auth: every caller may read every metric" in insecure.log
        anyone = await insecure.request(
            f"{world.path.replace('*', '%2A')}?labelSelector=app%3Dweb")
        assert anyone.status == 200, anyone
    secure = await world.adapter.request("/readyz?verbose")
    assert "[+]authentication-config ok" in secure.text
    assert "insecure-disable-auth" not in secure.text


async def test_unreadable_ca_file_stops_the_adapter_at_start(world: World) -> None:
    missing = world.workdir / "no-such-ca.crt"
    async with adapter_process(world.workdir, [
            *world.args, "--requestheader-client-ca-file", str(missing)],
            test_pki=world.pki, wait=False) as broken:
        async with asyncio.timeout(30):
            code = await broken.process.wait()
    assert code == 1
    assert f"cannot set up authentication: --requestheader-client-ca-file {missing}" in \
        broken.log


@pytest.mark.kubectl
async def test_no_token_or_private_key_appears_in_the_process_log(world: World) -> None:
    adapter = world.adapter
    good = world.token_kubeconfig("log-user")  # a token of its own
    token = world.tokens[-1]
    assert good.exists()
    bad = f"never-valid-{os.urandom(16).hex()}"
    for credential in (token, bad, bad * 500):
        for path in ("/livez", "/apis/custom.metrics.k8s.io/v1beta2"):
            with contextlib.suppress(HandshakeFailed):
                await adapter.request(path, headers=[("Authorization", f"Bearer {credential}")])
    code, _, err = await kubectl(good, "get", "--raw", world.path)
    assert code == 0, err
    log = adapter.log
    assert "TokenReview" in log or "token sha256:" in log
    leaked = secrets_in(log, tokens=[*world.tokens, bad],
                        key_files=[*world.pki.key_files(),
                                   *world.module.control_plane.dir.glob("*.key")])
    assert leaked == []
