"""The container image: built by `make image`, it runs read-only as UID 65532 with no
capabilities, checks the default rules, and serves /readyz against the session's real control
plane (`control_plane`, reached over the host's loopback: see tests/image/cluster_support.py)
and a real Prometheus; on the image's own Python (Debian's 3.11.2), Prometheus down at start or
killed while serving leaves the adapter running, retrying, and serving what it last discovered;
the real aggregator reaches the image's adapter through an APIService."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from adapter.rules.defaults import DEFAULT_CONFIG_YAML
from testbed.aggregated import apiservice_given_back
from testbed.controlplane import ControlPlane
from testbed.fakes.exporter import Exporter
from testbed.fakes.prometheus import PrometheusServer
from testbed.fakes.prometheus_fixtures import PrometheusFactory
from testbed.fakes.tools import require_tool
from tests.image.cluster_support import SERVICE, adapter_kubeconfig, serving_pair

pytestmark = [pytest.mark.image]

REPO = Path(__file__).resolve().parents[2]
IMAGE = "ghcr.io/metricscale/metricscale:0.1.0"
UID = 65532
CERT_DIR = "/var/run/metricscale/certs"
CONTAINERS_CONF = REPO / "scripts" / "containers.conf"


def podman_environment() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


@pytest.fixture(scope="session")
def image() -> str:
    """The image, built once per session the way `make image` builds it."""
    require_tool("podman")
    require_tool("mmdebstrap")
    require_tool("runc")
    built = subprocess.run(["make", "image", f"IMAGE={IMAGE}"], cwd=REPO, capture_output=True,
                           text=True, check=False, timeout=900, env=podman_environment())
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    return IMAGE


def hardened_run(image: str, *args: str, mounts: tuple[Path, ...] = ()) -> list[str]:
    """`podman run` with what the manifests impose: read-only root, fixed UID, no capabilities."""
    volumes = [f"--volume={path}:{path}:ro" for path in mounts]
    return ["podman", "--runtime", "runc", "run", "--rm", "--network=host", "--read-only",
            f"--user={UID}:{UID}", "--cap-drop=ALL", "--security-opt=no-new-privileges",
            f"--tmpfs={CERT_DIR}:rw,mode=1777", *volumes, image, *args]


def readable_by_the_image_user(directory: Path) -> Path:
    """pytest's directories are private to root; the container's UID must read the mounted files."""
    for path in [directory, *directory.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return directory


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, check=False, timeout=120,
                          env=podman_environment())


def test_help_runs_as_the_non_root_uid(image: str) -> None:
    result = run(hardened_run(image, "--help"))
    assert result.returncode == 0, result.stderr
    assert "adapter" in result.stdout


def test_image_user_is_the_manifests_uid(image: str) -> None:
    result = run(["podman", "image", "inspect", "--format", "{{.Config.User}}", image])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{UID}:{UID}"


def test_image_is_under_150_mb(image: str) -> None:
    result = run(["podman", "image", "inspect", "--format", "{{.Size}}", image])
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) < 150_000_000


def test_slimmed_packages_import_and_verify_tls(image: str) -> None:
    """kubernetes_asyncio loads from its zip, byte code only; the CA bundle is found without
    Debian's openssl package; a standard-library module left without byte code still imports."""
    script = ("import ssl, kubernetes_asyncio, metricscale.kube.config, cli.main, pydoc;"
              "print(kubernetes_asyncio.__file__);"
              "print(len(ssl.create_default_context().get_ca_certs()) > 100)")
    result = run(["podman", "--runtime", "runc", "run", "--rm", "--read-only",
                  f"--user={UID}:{UID}", "--cap-drop=ALL", "--entrypoint",
                  "/opt/metricscale/bin/python", image, "-c", script])
    assert result.returncode == 0, result.stderr
    where, verified = result.stdout.split()
    assert where.endswith("kubernetes_asyncio.zip/kubernetes_asyncio/__init__.pyc")
    assert verified == "True"


def test_default_rules_pass_check_config(image: str, tmp_path: Path) -> None:
    rules = tmp_path / "config.yaml"
    rules.write_text(DEFAULT_CONFIG_YAML)
    result = run(hardened_run(image, "adapter", "--check-config", str(rules),
                              mounts=(readable_by_the_image_user(tmp_path),)))
    assert result.returncode == 0, result.stdout + result.stderr


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def readyz(port: int) -> int | None:
    # The pair is self-signed inside a tmpfs the host cannot read: this only checks the
    # status, the TLS of the adapter is covered by tests/adapter.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session, \
                session.get(f"https://127.0.0.1:{port}/readyz") as response:
            return response.status
    except (aiohttp.ClientError, OSError):
        return None


@pytest.fixture
def cluster_kubeconfig(control_plane: ControlPlane, namespace: str,
                       tmp_path: Path) -> Iterator[Path]:
    """The container's kubeconfig for the session's kube-apiserver: the manifests' adapter
    account in the test's namespace; it lives under tmp_path, which the tests mount."""
    with adapter_kubeconfig(control_plane, namespace, tmp_path / "kube") as kubeconfig:
        yield kubeconfig


@pytest.fixture
def container_name() -> Iterator[str]:
    name = f"metricscale-image-test-{os.getpid()}"
    yield name
    run(["podman", "rm", "--force", "--ignore", name])


@pytest.mark.prometheus
async def test_adapter_serves_readyz_read_only(
        image: str, cluster_kubeconfig: Path, prometheus: PrometheusServer, tmp_path: Path,
        container_name: str) -> None:
    rules = tmp_path / "config.yaml"
    rules.write_text(DEFAULT_CONFIG_YAML)
    port = free_port()
    command = hardened_run(
        image, "adapter", "--config", str(rules), "--prometheus-url", prometheus.url,
        "--kubeconfig", str(cluster_kubeconfig), "--secure-port", str(port),
        "--bind-address", "127.0.0.1", "--cert-dir", CERT_DIR,
        mounts=(readable_by_the_image_user(tmp_path),))  # the kubeconfig's too
    command.insert(command.index("--rm"), f"--name={container_name}")
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=podman_environment())
    try:
        deadline = time.monotonic() + HANG_GUARD_SECONDS
        status = None
        while time.monotonic() < deadline and process.returncode is None:
            status = await readyz(port)
            if status == 200:
                break
            await asyncio.sleep(0.2)
        assert status == 200, "the adapter in the container did not become ready"
        stopped = await asyncio.create_subprocess_exec(
            "podman", "--runtime", "runc", "stop", f"--time={GRACE_SECONDS}", container_name,
            env=podman_environment())
        await stopped.wait()
        async with asyncio.timeout(HANG_GUARD_SECONDS):
            _, stderr = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    log = stderr.decode()
    assert process.returncode == 0, log
    assert "Traceback" not in log


# --------------------------------------------------------------------------------------------
# Prometheus down at start, and killed while serving (the image's Python is 3.11.2, where a
# failed discovery pass once ended the adapter: `raise` inside `except*` came out wrapped)

# Only ends a wedged test (a container that neither logs what is awaited nor exits); no
# behaviour is timed against it.
HANG_GUARD_SECONDS = 180
# How long `podman stop` waits after SIGTERM before SIGKILL: what a cluster gives the adapter's
# pod (Kubernetes' default terminationGracePeriodSeconds; the manifests keep it). It must exit
# 0 within it; 10 s was once too short for a run whose machine was loaded far beyond a node's
# (the log said "shutting down", then nothing, until the SIGKILL).
GRACE_SECONDS = 30
RULES = """
rules:
- seriesQuery: 'image_requests'
  resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}}}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
"""
CUSTOM = "/apis/custom.metrics.k8s.io/v1beta2"


async def get(port: int, path: str) -> tuple[int, str]:
    """Status and body of a GET to the adapter in the container (its self-signed pair is in a
    tmpfs the host cannot read: TLS is not verified here; tests/adapter covers it)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session, \
            session.get(f"https://127.0.0.1:{port}{path}") as response:
        return response.status, await response.text()


class RunningContainer:
    """`podman run` of the adapter, its log (stderr) read line by line as it comes."""

    def __init__(self, process: asyncio.subprocess.Process, name: str) -> None:
        self.process = process
        self.name = name
        self.lines: list[str] = []
        self._ended = False
        self._changed = asyncio.Condition()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process.stderr is not None
        async for raw in self.process.stderr:
            async with self._changed:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._changed.notify_all()
        async with self._changed:
            self._ended = True
            self._changed.notify_all()

    @property
    def log(self) -> str:
        return "\n".join(self.lines)

    def _find(self, wanted: Callable[[str], bool], after: int) -> int | None:
        return next((index for index in range(after, len(self.lines))
                     if wanted(self.lines[index])), None)

    async def wait_for_line(self, text: str, *, after: int = 0) -> int:
        """Index of the first log line from `after` on containing `text`; fails as soon as the
        container ends without logging it."""
        def wanted(line: str) -> bool:
            return text in line

        async with asyncio.timeout(HANG_GUARD_SECONDS), self._changed:
            await self._changed.wait_for(
                lambda: self._find(wanted, after) is not None or self._ended)
        index = self._find(wanted, after)
        if index is None:
            status = await self.process.wait()
            raise AssertionError(f"the adapter exited with {status} before logging {text!r}:\n"
                                 f"{self.log}")
        return index

    async def stop(self) -> int:
        """SIGTERM through podman; the adapter's exit status."""
        stopped = await asyncio.create_subprocess_exec(
            "podman", "--runtime", "runc", "stop", f"--time={GRACE_SECONDS}", self.name,
            env=podman_environment(), stdout=asyncio.subprocess.DEVNULL)
        async with asyncio.timeout(HANG_GUARD_SECONDS):
            await stopped.wait()
            await self._reader
            return await self.process.wait()

    async def close(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        self._reader.cancel()


async def run_adapter(image: str, *, container_name: str, rules: Path, kubeconfig: Path,
                      prometheus_url: str, port: int, extra: tuple[str, ...] = (),
                      ) -> RunningContainer:
    command = hardened_run(
        image, "adapter", "--config", str(rules), "--prometheus-url", prometheus_url,
        "--kubeconfig", str(kubeconfig), "--secure-port", str(port),
        "--bind-address", "127.0.0.1", "--cert-dir", CERT_DIR,
        "--metrics-relist-interval", "2s", *extra,
        mounts=(readable_by_the_image_user(rules.parent.parent),))  # the kubeconfig's too
    command.insert(command.index("--rm"), f"--name={container_name}")
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env=podman_environment())
    return RunningContainer(process, container_name)


def assert_clean_log(log: str) -> None:
    assert "Traceback" not in log, log
    assert "ExceptionGroup" not in log, log
    assert "ended unexpectedly" not in log, log


def rules_file(tmp_path: Path) -> Path:
    directory = tmp_path / "rules"
    directory.mkdir()
    rules = directory / "config.yaml"
    rules.write_text(RULES)
    return rules


@pytest.mark.prometheus
async def test_prometheus_down_at_start_is_retried_until_it_answers(
        image: str, cluster_kubeconfig: Path, prometheus_factory: PrometheusFactory,
        tmp_path: Path, container_name: str) -> None:
    server = prometheus_factory(start=False)
    port = free_port()
    container = await run_adapter(image, container_name=container_name,
                                  rules=rules_file(tmp_path), kubeconfig=cluster_kubeconfig,
                                  prometheus_url=server.url, port=port)
    try:
        serving = await container.wait_for_line("serving custom.metrics.k8s.io")
        await container.wait_for_line("pass failed (3 in a row)")
        status, body = await get(port, "/readyz?verbose")
        assert status == 500, body
        assert "[-]metric-discovery failed: reason withheld" in body
        with Exporter() as exporter:
            exporter.set("image_requests", {"namespace": "shop", "pod": "web-0"}, 1)
            await asyncio.to_thread(server.start)
            server.add_target(exporter)
            await server.wait_for_scrape_async(exporter, series="image_requests")
            await container.wait_for_line(" pass took ", after=serving)
            status, body = await get(port, "/readyz")
            assert status == 200, body
        assert await container.stop() == 0, container.log
    finally:
        await container.close()
    assert_clean_log(container.log)


@pytest.mark.prometheus
async def test_prometheus_killed_after_a_healthy_start_leaves_the_last_snapshot_serving(
        image: str, cluster_kubeconfig: Path, prometheus_factory: PrometheusFactory,
        tmp_path: Path, container_name: str) -> None:
    with Exporter() as exporter:
        exporter.set("image_requests", {"namespace": "shop", "pod": "web-0"}, 1)
        server = prometheus_factory()
        server.add_target(exporter)
        await server.wait_for_scrape_async(exporter, series="image_requests")
        port = free_port()
        container = await run_adapter(image, container_name=container_name,
                                      rules=rules_file(tmp_path), kubeconfig=cluster_kubeconfig,
                                      prometheus_url=server.url, port=port,
                                      extra=("--insecure-disable-auth",))
        try:
            await container.wait_for_line("serving custom.metrics.k8s.io")
            passed = await container.wait_for_line(" pass took ")
            assert (await get(port, "/readyz"))[0] == 200
            await asyncio.to_thread(server.stop)
            await container.wait_for_line("pass failed (2 in a row)", after=passed)
            status, body = await get(port, "/readyz?verbose")
            assert status == 200, body
            assert ("[+]metric-discovery ok: the last discovery pass failed; serving the last "
                    "good snapshot (built ") in body
            status, body = await get(port, CUSTOM)
            assert status == 200, body
            assert '"pods/image_requests"' in body
            assert await container.stop() == 0, container.log
        finally:
            await container.close()
    assert_clean_log(container.log)


CUSTOM_V1BETA1 = ("custom.metrics.k8s.io", "v1beta1")


@pytest.mark.prometheus
async def test_the_real_aggregator_reaches_the_images_adapter(
        image: str, control_plane: ControlPlane, namespace: str, cluster_kubeconfig: Path,
        prometheus_factory: PrometheusFactory, tmp_path: Path, container_name: str) -> None:
    """kube-apiserver proxies to the container as the front proxy (the adapter authenticates
    it with the CA of kube-system/extension-apiserver-authentication and authorizes the admin
    with a SubjectAccessReview) and checks the adapter's certificate against the APIService's
    caBundle; the APIService is given back afterwards as it was."""
    group, version = CUSTOM_V1BETA1
    with Exporter() as exporter:
        exporter.set("image_requests", {"namespace": namespace, "pod": "web-0"}, 7)
        server = prometheus_factory()
        server.add_target(exporter)
        await server.wait_for_scrape_async(exporter, series="image_requests")
        pair = serving_pair(control_plane, tmp_path / "serving", namespace)
        port = free_port()
        container = await run_adapter(
            image, container_name=container_name, rules=rules_file(tmp_path),
            kubeconfig=cluster_kubeconfig, prometheus_url=server.url, port=port,
            extra=("--tls-cert-file", str(pair.cert), "--tls-private-key-file", str(pair.key)))
        try:
            await container.wait_for_line(" pass took ")
            with apiservice_given_back(control_plane, f"{version}.{group}"):
                await asyncio.to_thread(
                    control_plane.register_apiservice, group, version, port=port,
                    ca_pem=control_plane.ca_file.read_bytes(), namespace=namespace,
                    service=SERVICE)
                await asyncio.to_thread(control_plane.wait_apiservice_available, group,
                                        version)
                discovery: Any = await asyncio.to_thread(
                    control_plane.get, f"/apis/{group}/{version}")
                assert "pods/image_requests" in {
                    resource["name"] for resource in discovery["resources"]}, discovery
                values: Any = await asyncio.to_thread(
                    control_plane.get, f"/apis/{group}/{version}/namespaces/{namespace}"
                                       "/pods/web-0/image_requests")
                assert [(item["describedObject"]["name"], item["value"])
                        for item in values["items"]] == [("web-0", "7")], values
            assert await container.stop() == 0, container.log
        finally:
            await container.close()
    assert_clean_log(container.log)


def test_check_config_against_an_unreachable_prometheus_says_so_in_one_line(
        image: str, prometheus_factory: PrometheusFactory, tmp_path: Path) -> None:
    dead = prometheus_factory(start=False)
    rules = rules_file(tmp_path)
    result = run(hardened_run(image, "adapter", "--check-config", str(rules),
                              "--prometheus-url", dead.url,
                              mounts=(readable_by_the_image_user(rules.parent),)))
    assert result.returncode == 1, result.stdout + result.stderr
    assert (f"discovery against {dead.url} failed: a series request failed: Prometheus cannot "
            "be reached") in result.stdout
    assert_clean_log(result.stdout + result.stderr)


def test_make_test_shipped_runs_the_images_python(image: str) -> None:
    """`make test-shipped` runs the tests marked shipped_interpreter on /usr/bin/python3: it
    must be the image's interpreter, to the patch release, or those tests prove nothing."""
    version = "import platform; print(platform.python_version())"
    shipped = run(["podman", "--runtime", "runc", "run", "--rm", "--entrypoint",
                   "/opt/metricscale/bin/python", image, "-c", version])
    assert shipped.returncode == 0, shipped.stderr
    host = subprocess.run(["/usr/bin/python3", "-c", version], capture_output=True, text=True,
                          check=True)
    assert host.stdout == shipped.stdout
