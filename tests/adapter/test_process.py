"""`metricscale adapter` as a process: it serves with a self-signed pair from --cert-dir,
stops cleanly on SIGTERM, and `--check-config` exits 0 or 1. (How quickly it stops is a
timing, not a test's to assert on a shared machine: bench/adapter.py is where it belongs.)"""

from __future__ import annotations

import asyncio
import signal
import socket
import ssl
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from testbed.fakes.kube_api import FakeKubeAPI
from testbed.fakes.prometheus import PrometheusServer

pytestmark = [pytest.mark.prometheus]

CONFIG = """
rules:
- seriesQuery: 'process_start_time_seconds'
  resources:
    overrides:
      namespace: {resource: namespace}
  metricsQuery: 'max(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def readyz(port: int, ca_file: Path) -> int | None:
    context = ssl.create_default_context(cafile=str(ca_file))
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session, \
                session.get(f"https://127.0.0.1:{port}/readyz?verbose") as response:
            return response.status
    except (aiohttp.ClientError, OSError):
        return None


async def test_sigterm_stops_a_serving_adapter_cleanly(
        tmp_path: Path, prometheus: PrometheusServer) -> None:
    async with FakeKubeAPI(workdir=tmp_path / "kube") as kube:
        config = tmp_path / "rules.yaml"
        config.write_text(CONFIG)
        port = free_port()
        cert_dir = tmp_path / "certs"
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "metricscale", "adapter", "--config", str(config),
            "--prometheus-url", prometheus.url, "--kubeconfig",
            str(kube.write_kubeconfig(tmp_path / "kubeconfig")), "--secure-port", str(port),
            "--bind-address", "127.0.0.1", "--cert-dir", str(cert_dir),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            deadline = time.monotonic() + 30
            status = None
            while time.monotonic() < deadline and process.returncode is None:
                if (cert_dir / "apiserver.crt").exists():
                    status = await readyz(port, cert_dir / "apiserver.crt")
                    if status == 200:
                        break
                await asyncio.sleep(0.1)
            assert status == 200, "the adapter did not become ready"
            process.send_signal(signal.SIGTERM)
            async with asyncio.timeout(60):  # a hang, not a slow machine
                _, stderr = await process.communicate()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    log = stderr.decode()
    assert process.returncode == 0, log
    assert "shutting down" in log
    assert "Traceback" not in log


@pytest.mark.parametrize(("text", "code"), [(CONFIG, 0), ("rules: {default: false}\n", 1)])
async def test_check_config_exit_code(tmp_path: Path, text: str, code: int) -> None:
    config = tmp_path / "rules.yaml"
    config.write_text(text)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "metricscale", "adapter", "--check-config", str(config),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    stdout, _ = await process.communicate()
    assert process.returncode == code, stdout.decode()
    if code:
        assert "cannot unmarshal !!map into []config.DiscoveryRule" in stdout.decode()
