"""The authentication ConfigMap over time: CA rotation without a restart, readiness gated on the
first read, and a deleted ConfigMap.

The adapter follows the real kube-system/extension-apiserver-authentication of the session's
control plane (through a recording fault proxy), which the tests change as an operator rotating
a front-proxy CA would, and which is written back as it was after the module. Tests run in
order on one adapter: each rotation leaves the trust the next test starts from. A deleted
ConfigMap is the real one deleted: kube-apiserver writes it back at once, as in a cluster.

The last test rotates kube-apiserver's own front-proxy CA and client certificate (its files,
which kube-apiserver reloads) while requests go through the aggregator to the adapter: on a
control plane of the test's own, since the session's serves other aggregated servers too.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from cryptography import x509

from metricscale import pki
from metricscale.kube.retry import Backoff
from metricscale.pki import CertifiedKey
from testbed.controlplane import ControlPlane, KubeError
from testbed.fakes.prometheus import PrometheusServer
from testbed.faultproxy import ServerError
from testbed.pytest_plugin import require_peers
from tests.adapter.auth_support import (
    CUSTOM,
    SERVICE_NAME,
    YEAR,
    AuthPKI,
    CertPair,
    HandshakeFailed,
    SecuredAdapter,
    ShiftedClock,
    capture_all_logs,
    client_context,
    https_request,
    make_pki,
    register_real_apiservices,
    secured_adapter,
)
from tests.adapter.cluster import (
    AUTH_CONFIGMAP_PATH,
    ModuleCluster,
    Names,
    RecordingProxy,
    authentication_configmap_restored,
    proxy_for,
    set_request_header_cas,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

EMPTY_RULES = """\
rules:
- seriesQuery: 'msauth_no_such_series{job="nobody"}'
  resources: {overrides: {namespace: {resource: namespace}}}
  name: {matches: "^(.*)$", as: "${1}"}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
"""
AGGREGATOR = [("X-Remote-User", "system:kube-aggregator"), ("X-Remote-Group", "system:masters")]
DISCOVERY = f"{CUSTOM}/v1beta1"
QUICK_INFORMER: dict[str, Any] = {"backoff": Backoff(initial=0.05, cap=0.2)}


@dataclass
class Rotation:
    module: ModuleCluster
    kube: RecordingProxy
    adapter: SecuredAdapter
    pki: AuthPKI
    workdir: Path
    prometheus_url: str
    ca_a: CertifiedKey
    ca_b: CertifiedKey
    original: dict[str, str]  # the ConfigMap's data as kube-apiserver wrote it

    def set_request_header_cas(self, *cas: CertifiedKey) -> None:
        set_request_header_cas(self.module.control_plane, [ca.certificate_pem for ca in cas])

    def adapter_kubeconfig(self) -> Path:
        return self.module.adapter_kubeconfig(server=self.kube.server)

    async def changed(self, change: Callable[[], None]) -> None:
        """Make `change` to the cluster and wait (bounded) until the adapter has applied it."""
        await changed(self.adapter, change)


async def changed(adapter: SecuredAdapter, change: Callable[[], None]) -> None:
    source = adapter.security.source
    assert source is not None
    before = source.generation
    change()
    await until(lambda: source.generation > before, what="the new configuration")


async def until(condition: Callable[[], bool], *, what: str, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"the adapter did not pick up {what} within {within}s")
        await asyncio.sleep(0.01)


def trust_also(control_plane: ControlPlane, ca: CertifiedKey) -> None:
    """`ca` joins the front-proxy CA bundle kube-apiserver published (its own CA stays)."""
    published = control_plane.get(AUTH_CONFIGMAP_PATH)["data"]["requestheader-client-ca-file"]
    set_request_header_cas(control_plane, [published.encode(), ca.certificate_pem])


def _cas() -> tuple[CertifiedKey, CertifiedKey]:
    start = datetime.now(UTC) - timedelta(minutes=5)
    return (pki.generate_ca(common_name="request-header-ca-a", now=start, validity=YEAR),
            pki.generate_ca(common_name="request-header-ca-b", now=start, validity=YEAR))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def rotation(cluster: ModuleCluster, tmp_path_factory: pytest.TempPathFactory,
                   prometheus: PrometheusServer) -> AsyncIterator[Rotation]:
    workdir = tmp_path_factory.mktemp("adapter-rotation")
    control_plane = cluster.control_plane
    test_pki = make_pki(workdir / "pki", proxy_ca=control_plane.front_proxy_ca)
    ca_a, ca_b = _cas()
    with authentication_configmap_restored(control_plane) as original:
        trust_also(control_plane, ca_a)
        async with proxy_for(control_plane) as kube, secured_adapter(
                workdir=workdir / "adapter", test_pki=test_pki,
                kubeconfig=cluster.adapter_kubeconfig(server=kube.server),
                prometheus_url=prometheus.url, config_text=EMPTY_RULES, clock=ShiftedClock(),
                informer_options=QUICK_INFORMER) as adapter:
            yield Rotation(cluster, kube, adapter, test_pki, workdir, prometheus.url, ca_a,
                           ca_b, original)


@dataclass
class KeptAlive:
    """One TLS connection carrying several requests (HTTP/1.1 keep-alive)."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    @classmethod
    async def open(cls, port: int, ca_file: Path, cert: CertPair | None) -> KeptAlive:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_context(ca_file, cert), server_hostname="localhost")
        return cls(reader, writer)

    async def get(self, path: str) -> int:
        lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1",
                 *(f"{name}: {value}" for name, value in AGGREGATOR)]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        async with asyncio.timeout(10):
            head = await self.reader.readuntil(b"\r\n\r\n")
            status_line, *header_lines = head.decode("latin-1").split("\r\n")
            length = next(int(line.split(":", 1)[1]) for line in header_lines
                          if line.lower().startswith("content-length:"))
            await self.reader.readexactly(length)
        return int(status_line.split(" ")[1])

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            await self.writer.wait_closed()


async def status_with(rotation: Rotation, cert: CertPair) -> int:
    reply = await rotation.adapter.request(DISCOVERY, cert=cert, headers=AGGREGATOR)
    return reply.status


async def test_rotated_request_header_ca_applies_without_a_restart(rotation: Rotation) -> None:
    cert_a = rotation.pki.client_pair("proxy-a", rotation.ca_a, user="front-proxy-client")
    cert_b = rotation.pki.client_pair("proxy-b", rotation.ca_b, user="front-proxy-client")
    assert await status_with(rotation, cert_a) == 200
    with pytest.raises(HandshakeFailed):
        await status_with(rotation, cert_b)
    kept_alive = await KeptAlive.open(rotation.adapter.port, rotation.pki.serving_ca_file, cert_a)
    try:
        assert await kept_alive.get(DISCOVERY) == 200
        # kube-apiserver's rotation: the new CA joins the bundle, later the old one leaves.
        await rotation.changed(lambda: rotation.set_request_header_cas(
            rotation.ca_b, rotation.ca_a))
        assert await status_with(rotation, cert_a) == 200
        assert await status_with(rotation, cert_b) == 200
        await rotation.changed(lambda: rotation.set_request_header_cas(rotation.ca_b))
        with pytest.raises(HandshakeFailed):
            await status_with(rotation, cert_a)
        assert await status_with(rotation, cert_b) == 200
        # A connection opened under the old CA gets no more trust than a new one would.
        assert await kept_alive.get(DISCOVERY) == 401
    finally:
        await kept_alive.close()


async def test_readyz_fails_until_the_configmap_has_been_read(rotation: Rotation) -> None:
    fault = rotation.kube.add_fault("/api/v1/namespaces/kube-system/configmaps",
                                    ServerError(503), method="GET", times=None)
    try:
        async with secured_adapter(
                workdir=rotation.workdir / "late", test_pki=rotation.pki,
                kubeconfig=rotation.adapter_kubeconfig(),
                prometheus_url=rotation.prometheus_url, config_text=EMPTY_RULES,
                clock=ShiftedClock(), wait=False, sync_timeout=0.05,
                informer_options=QUICK_INFORMER) as late:
            reply = await late.request("/readyz?verbose")
            assert reply.status == 500, reply
            assert "[-]authentication-config failed" in reply.text
            assert fault.hits >= 1
            rotation.kube.clear_faults()
            deadline = time.monotonic() + 10.0
            while (reply := await late.request("/readyz?verbose")).status != 200:
                assert time.monotonic() < deadline, reply
                await asyncio.sleep(0.02)
            assert "[+]authentication-config ok" in reply.text
    finally:
        rotation.kube.clear_faults()


async def test_deleted_configmap_keeps_the_last_configuration(rotation: Rotation) -> None:
    # The real kube-apiserver writes its ConfigMap back as soon as it is deleted (its
    # cluster-authentication-trust controller watches it), with what it wrote at start: the
    # adapter sees the deletion and, at once, the ConfigMap again. Started from exactly that
    # content, neither the deletion nor the re-creation may change the adapter's configuration:
    # the next change the test makes is then the only one it applies.
    control_plane = rotation.module.control_plane
    adapter = rotation.adapter
    source = adapter.security.source
    assert source is not None

    def restore_original() -> None:
        current = control_plane.get(AUTH_CONFIGMAP_PATH)
        current["data"] = dict(rotation.original)
        control_plane.request("PUT", AUTH_CONFIGMAP_PATH, current)

    await rotation.changed(restore_original)
    kube_proxy = rotation.pki.client_pair("kube-front-proxy", control_plane.front_proxy_ca,
                                          user="front-proxy-client")
    assert await status_with(rotation, kube_proxy) == 200
    before = source.generation
    with capture_all_logs() as logs:
        await asyncio.to_thread(control_plane.request, "DELETE", AUTH_CONFIGMAP_PATH)
        await until(lambda: "extension-apiserver-authentication was deleted" in logs.text,
                    what="the deletion")
        assert await status_with(rotation, kube_proxy) == 200
        reply = await adapter.request("/readyz")
        assert reply.status == 200, reply
        recreated = await asyncio.to_thread(_written_back, control_plane)
    assert recreated == rotation.original, "kube-apiserver wrote back other data"
    # Events arrive in order: once this change is applied, the deletion and the re-creation
    # have been handled, and they changed nothing.
    await rotation.changed(lambda: trust_also(control_plane, rotation.ca_b))
    assert source.generation == before + 1
    cert_b = rotation.pki.client_pair("proxy-b2", rotation.ca_b, user="front-proxy-client")
    assert await status_with(rotation, cert_b) == 200
    assert await status_with(rotation, kube_proxy) == 200


def _written_back(control_plane: ControlPlane) -> dict[str, str]:
    """The ConfigMap's data once kube-apiserver has written it back after its deletion."""
    deadline = time.monotonic() + 60.0
    while True:
        try:
            return dict(control_plane.get(AUTH_CONFIGMAP_PATH)["data"])
        except KubeError as error:
            if error.status != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.05)  # polling kube-apiserver (in a thread) until the object is back


async def test_serving_certificate_reload_swaps_new_connections_and_keeps_open_ones(
        rotation: Rotation) -> None:
    adapter = rotation.adapter

    async def served_serial() -> int:
        _, writer = await asyncio.open_connection(
            "127.0.0.1", adapter.port, ssl=client_context(rotation.pki.serving_ca_file),
            server_hostname="localhost")
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            await writer.wait_closed()
        return int(x509.load_der_x509_certificate(der).serial_number)

    before = await served_serial()
    kept_alive = await KeptAlive.open(adapter.port, rotation.pki.serving_ca_file, None)
    try:
        assert await kept_alive.get("/livez") == 200
        now = datetime.now(UTC) - timedelta(minutes=1)
        renewed = pki.issue_serving_certificate(
            rotation.pki.serving_ca, common_name="metricscale-adapter-renewed",
            dns_names=("localhost",), ip_addresses=("127.0.0.1",), now=now, validity=YEAR)
        pki.write_private_key(rotation.pki.serving_key, renewed.private_key)
        pki.write_certificate(rotation.pki.serving_cert, renewed.certificate)
        assert adapter.tls.reload_if_changed() is True
        assert await served_serial() == renewed.certificate.serial_number != before
        assert await kept_alive.get("/livez") == 200  # the open connection was not dropped
        assert adapter.tls.current.minimum_version is ssl.TLSVersion.TLSv1_2
    finally:
        await kept_alive.close()


async def test_flags_give_the_cas_and_names_without_reading_the_configmap(
        rotation: Rotation) -> None:
    flags_dir = rotation.workdir / "flags"
    flags_dir.mkdir()
    proxy_ca_file = pki.write_certificate(flags_dir / "proxy-ca.crt", rotation.ca_a.certificate)
    client_ca_file = pki.write_certificate(flags_dir / "client-ca.crt",
                                           rotation.ca_b.certificate)
    configmap_reads = len(rotation.kube.requests_to("/namespaces/kube-system/configmaps"))
    async with secured_adapter(
            workdir=flags_dir, test_pki=rotation.pki,
            kubeconfig=rotation.adapter_kubeconfig(),
            prometheus_url=rotation.prometheus_url, config_text=EMPTY_RULES,
            clock=ShiftedClock(), args=[
                "--requestheader-client-ca-file", str(proxy_ca_file),
                "--requestheader-allowed-names", "aggregator-a",
                "--requestheader-username-headers", "X-Who",
                "--requestheader-group-headers", "X-Teams",
                "--client-ca-file", str(client_ca_file)]) as flagged:
        proxy = rotation.pki.client_pair("flag-proxy", rotation.ca_a, user="aggregator-a")
        reply = await flagged.request(DISCOVERY, cert=proxy, headers=[
            ("X-Who", "system:kube-aggregator"), ("X-Teams", "system:masters"),
            ("X-Remote-User", "ignored"), ("X-Remote-Group", "ignored")])
        assert reply.status == 200, reply
        user = rotation.pki.client_pair("flag-user", rotation.ca_b, user="dana")
        reply = await flagged.request(DISCOVERY, cert=user)
        assert reply.status == 200, reply
        assert [r["spec"]["user"] for r in rotation.kube.subject_access_reviews()][-1] == "dana"
        # A renewed CA file is picked up (the server checks every 10 s; driven here).
        source = flagged.security.source
        assert source is not None and not source.needs_lookup
        pki.write_certificate(proxy_ca_file, rotation.ca_b.certificate)
        assert source.reload_files() is True
        with pytest.raises(HandshakeFailed):
            await flagged.request(DISCOVERY, cert=proxy)
    assert len(rotation.kube.requests_to("/namespaces/kube-system/configmaps")) == \
        configmap_reads


# --------------------------------------------------------------------------------------------
# kube-apiserver's own front-proxy CA rotated, on a control plane of the test's own
#
# kube-apiserver (1.36) reloads --requestheader-client-ca-file and
# --proxy-client-cert-file/--proxy-client-key-file when they change: it publishes the new CA
# bundle in the ConfigMap (adding to what is there: it never takes a CA out) and its aggregator
# rebuilds each APIService's transport with the new client certificate. Those are a control
# plane's own files, so this runs on a private one: rotating the session's would change the
# front proxy of every aggregated server of the session.

SERVER_PEERS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")


@dataclass
class PrivateRotation:
    control_plane: ControlPlane
    adapter: SecuredAdapter
    pki: AuthPKI
    ca_b: CertifiedKey
    presented: list[int]  # serial numbers of the client certificates the adapter was shown

    def trusted(self) -> set[int]:
        """The serial numbers of the request-header CAs the adapter trusts now."""
        source = self.adapter.security.source
        assert source is not None
        header = source.config.request_header
        if header is None:
            return set()
        return {c.serial_number for c in pki.load_certificates_pem(header.ca_pem)}

    async def through_aggregator(self) -> int:
        """The admin (system:masters) calling kube-apiserver, which proxies to the adapter."""
        control_plane = self.control_plane
        reply = await https_request(
            control_plane.api_port, f"{CUSTOM}/v1beta2", ca_file=control_plane.ca_file,
            cert=(control_plane.admin.cert, control_plane.admin.key))
        return reply.status


def _spy_on_client_certificates(adapter: SecuredAdapter, presented: list[int]) -> None:
    """Record the serial number of the client certificate of every request the adapter
    authenticates (the middleware looks `authenticate` up on each request)."""
    authenticator: Any = adapter.security.authenticator
    authenticate = authenticator.authenticate

    async def recording(request: Any, *args: Any, **kwargs: Any) -> Any:
        der = request.peer_certificate_der
        if der is not None:
            presented.append(int(x509.load_der_x509_certificate(der).serial_number))
        return await authenticate(request, *args, **kwargs)

    authenticator.authenticate = recording


@pytest_asyncio.fixture(loop_scope="module")
async def private_rotation(tmp_path: Path,
                           prometheus: PrometheusServer) -> AsyncIterator[PrivateRotation]:
    """The adapter Available behind the aggregator of a control plane of the test's own."""
    require_peers(*SERVER_PEERS)
    control_plane = ControlPlane(workdir=tmp_path / "cluster",
                                 controllers=("serviceaccount-controller",))
    # Started and stopped off the event loop: the module's other adapter serves on it.
    await asyncio.to_thread(control_plane.start)
    try:
        module = ModuleCluster(control_plane, Names.unique("rotation-private"))
        namespace = module.namespace("adapter")
        kubeconfig = await asyncio.to_thread(module.adapter_kubeconfig)
        test_pki = make_pki(tmp_path / "pki",
                            service_dns=f"{SERVICE_NAME}.{namespace}.svc",
                            proxy_ca=control_plane.front_proxy_ca)
        _, ca_b = _cas()
        async with secured_adapter(
                workdir=tmp_path / "adapter", test_pki=test_pki, kubeconfig=kubeconfig,
                prometheus_url=prometheus.url, config_text=EMPTY_RULES, clock=ShiftedClock(),
                informer_options=QUICK_INFORMER) as adapter:
            presented: list[int] = []
            _spy_on_client_certificates(adapter, presented)
            await asyncio.to_thread(
                register_real_apiservices, control_plane, port=adapter.port,
                ca_pem=test_pki.serving_ca.certificate_pem, namespace=namespace)
            yield PrivateRotation(control_plane, adapter, test_pki, ca_b, presented)
    finally:
        await asyncio.to_thread(control_plane.stop)


async def test_aggregator_keeps_working_through_a_front_proxy_ca_rotation(
        private_rotation: PrivateRotation) -> None:
    rotation = private_rotation
    control_plane = rotation.control_plane
    ca_a, ca_b = control_plane.front_proxy_ca, rotation.ca_b
    serial_a, serial_b = ca_a.certificate.serial_number, ca_b.certificate.serial_number
    old_client = pki.load_certificate_pem(control_plane.front_proxy_client.cert.read_bytes())
    assert rotation.trusted() == {serial_a}
    assert await rotation.through_aggregator() == 200
    assert rotation.presented[-1] == old_client.serial_number

    async def keeps_working_until(condition: Callable[[], bool], *, what: str) -> None:
        """Requests through the aggregator all succeed until `condition` holds (bounded)."""
        deadline = time.monotonic() + 90.0
        while not condition():
            assert await rotation.through_aggregator() == 200, f"while waiting for {what}"
            assert time.monotonic() < deadline, f"{what} did not happen within 90 s"
            await asyncio.sleep(0.05)

    # 1. The new CA joins kube-apiserver's bundle file; kube-apiserver publishes it in the
    #    ConfigMap (beside the old one) and the adapter takes it without a restart.
    pki.write_certificate(control_plane.front_proxy_ca_file, [ca_b.certificate, ca_a.certificate])
    await keeps_working_until(lambda: rotation.trusted() == {serial_a, serial_b},
                              what="the adapter trusting both front-proxy CAs")
    # 2. kube-apiserver's front-proxy client certificate is renewed under the new CA (key
    #    first: a certificate never meets a key it does not match once both are written).
    renewed = pki.issue_client_certificate(
        ca_b, user="front-proxy-client", now=datetime.now(UTC) - timedelta(minutes=5),
        validity=YEAR)
    pki.write_private_key(control_plane.front_proxy_client.key, renewed.private_key)
    pki.write_certificate(control_plane.front_proxy_client.cert, renewed.certificate)
    await keeps_working_until(
        lambda: bool(rotation.presented) and
        rotation.presented[-1] == renewed.certificate.serial_number,
        what="the aggregator presenting its renewed client certificate")
    # 3. The old CA leaves the file and, by the operator's hand, the ConfigMap (kube-apiserver
    #    only ever adds CAs to it).
    pki.write_certificate(control_plane.front_proxy_ca_file, ca_b.certificate)
    await asyncio.to_thread(set_request_header_cas, control_plane, [ca_b.certificate_pem])
    await keeps_working_until(lambda: rotation.trusted() == {serial_b},
                              what="the adapter dropping the old front-proxy CA")
    assert await rotation.through_aggregator() == 200
    assert rotation.presented[-1] == renewed.certificate.serial_number
    # The old CA's certificate is refused now, the aggregator's new one taken.
    old_proxy = rotation.pki.client_pair("old-front-proxy", ca_a, user="front-proxy-client")
    with pytest.raises(HandshakeFailed):
        await rotation.adapter.request(DISCOVERY, cert=old_proxy, headers=AGGREGATOR)
