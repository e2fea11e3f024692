"""`metricscale adapter` as a process: it serves with a self-signed pair from --cert-dir,
stops cleanly on SIGTERM, and `--check-config` exits 0 or 1. The adapter reads the real
kube-apiserver with the admin's kubeconfig. (How quickly it starts or stops is a timing, not a
test's to assert on a shared machine: bench/adapter.py is where it belongs.)"""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import ssl
import sys
from pathlib import Path

import aiohttp
import pytest

from testbed.controlplane import ControlPlane
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
        tmp_path: Path, prometheus: PrometheusServer, control_plane: ControlPlane) -> None:
    config = tmp_path / "rules.yaml"
    config.write_text(CONFIG)
    port = free_port()
    cert_dir = tmp_path / "certs"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "metricscale", "adapter", "--config", str(config),
        "--prometheus-url", prometheus.url, "--kubeconfig", str(control_plane.kubeconfig),
        "--secure-port", str(port), "--bind-address", "127.0.0.1", "--cert-dir",
        str(cert_dir), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        # Until ready, or until it exits (then the log says why): no bound on a busy machine
        # but the test's own timeout.
        status = None
        while process.returncode is None:
            if (cert_dir / "apiserver.crt").exists():
                status = await readyz(port, cert_dir / "apiserver.crt")
                if status == 200:
                    break
            await asyncio.sleep(0.1)
        if status != 200:
            _, stderr = await process.communicate()
            pytest.fail(f"the adapter exited before it was ready:\n{stderr.decode()}")
        process.send_signal(signal.SIGTERM)
        _, stderr = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    log = stderr.decode()
    assert process.returncode == 0, log
    assert "shutting down" in log
    # Each part of the shutdown says it is done (where a slow one stands when it is killed).
    assert re.search(r"requests, caches and discovery stopped \d+\.\d s after the signal", log)
    assert log.rstrip().endswith("stopped"), log
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
