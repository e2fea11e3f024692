"""The container image: built by `make image`, it runs read-only as UID 65532 with no
capabilities, checks the default rules, and serves /readyz against the test doubles."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from adapter.rules.defaults import DEFAULT_CONFIG_YAML
from tests.fakes.kube_api import FakeKubeAPI
from tests.fakes.prometheus import PrometheusServer
from tests.fakes.tools import require_tool

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
    # status, the TLS of the adapter is covered by tests/e2e.
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
def container_name() -> Iterator[str]:
    name = f"metricscale-image-test-{os.getpid()}"
    yield name
    run(["podman", "rm", "--force", "--ignore", name])


@pytest.mark.prometheus
async def test_adapter_serves_readyz_read_only(
        image: str, fake_kube: FakeKubeAPI, kubeconfig: Path, prometheus: PrometheusServer,
        tmp_path: Path, container_name: str) -> None:
    rules = tmp_path / "config.yaml"
    rules.write_text(DEFAULT_CONFIG_YAML)
    port = free_port()
    command = hardened_run(
        image, "adapter", "--config", str(rules), "--prometheus-url", prometheus.url,
        "--kubeconfig", str(kubeconfig), "--secure-port", str(port),
        "--bind-address", "127.0.0.1", "--cert-dir", CERT_DIR,
        mounts=(readable_by_the_image_user(tmp_path),))
    command.insert(command.index("--rm"), f"--name={container_name}")
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=podman_environment())
    try:
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline and process.returncode is None:
            status = await readyz(port)
            if status == 200:
                break
            await asyncio.sleep(0.2)
        assert status == 200, "the adapter in the container did not become ready"
        stopped = await asyncio.create_subprocess_exec(
            "podman", "--runtime", "runc", "stop", "--time=10", container_name,
            env=podman_environment())
        await stopped.wait()
        async with asyncio.timeout(30):
            _, stderr = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    log = stderr.decode()
    assert process.returncode == 0, log
    assert "Traceback" not in log
