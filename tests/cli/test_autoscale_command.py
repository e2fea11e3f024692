"""`metricscale autoscale` against the fake API server with the Autoscaler CRD, run as users do."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from testbed.fakes.kube_api import FakeKubeAPI
from testbed.fakes.tools import require_tool

# Every test here runs against the fake API server with the Autoscaler CRD.
pytestmark = pytest.mark.usefixtures("autoscaler_api")


async def run(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(60):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def autoscale(kubeconfig: Path, *args: str) -> tuple[int, str, str]:
    return await run(sys.executable, "-m", "metricscale", "autoscale",
                     "--kubeconfig", str(kubeconfig), *args)


async def kubectl_get_msa(kubeconfig: Path, namespace: str) -> tuple[int, str, str]:
    return await run(require_tool("kubectl", env_var="KUBECTL"), "--kubeconfig", str(kubeconfig),
                     "get", "msa", "-n", namespace, "-o", "name")


@pytest.mark.kubectl
async def test_create_then_kubectl_get_msa_shows_it(fake_kube: FakeKubeAPI,
                                                    kubeconfig: Path) -> None:
    code, out, err = await autoscale(kubeconfig, "deployment/web", "--min", "2", "--max", "10",
                                     "--cpu-percent", "50", "-n", "shop")
    assert (code, out.strip(), err) == (0, "autoscaler.metricscale.dev/web autoscaled", "")
    code, out, err = await kubectl_get_msa(kubeconfig, "shop")
    assert code == 0, err
    assert out.strip() == "autoscaler.metricscale.dev/web"


async def test_second_create_reports_already_exists(fake_kube: FakeKubeAPI,
                                                    kubeconfig: Path) -> None:
    code, _, err = await autoscale(kubeconfig, "deploy", "web", "--max", "3", "-n", "shop")
    assert code == 0, err
    code, _, err = await autoscale(kubeconfig, "deploy", "web", "--max", "3", "-n", "shop")
    assert code == 1
    assert err.strip() == ('Error from server (AlreadyExists): autoscalers.metricscale.dev '
                           '"web" already exists')


async def test_server_dry_run_sends_dry_run_all(fake_kube: FakeKubeAPI,
                                               kubeconfig: Path) -> None:
    # The fake API server does not implement dryRun (it would persist the object), so this
    # pins the wire contract that makes a real API server create nothing.
    code, out, err = await autoscale(kubeconfig, "sts/db", "--max", "4", "--metric", "rps=100",
                                     "--dry-run=server", "-n", "shop")
    assert code == 0, err
    assert out.strip() == "autoscaler.metricscale.dev/db autoscaled (server dry run)"
    [post] = fake_kube.requests_to(r"/apis/metricscale\.dev/v1alpha1/namespaces/shop/autoscalers$",
                                   method="POST")
    assert post.param("dryRun") == "All"


async def test_client_dry_run_sends_nothing(fake_kube: FakeKubeAPI, kubeconfig: Path) -> None:
    code, out, err = await autoscale(kubeconfig, "rc/old", "--max", "2", "--dry-run=client",
                                     "-o", "name")
    assert (code, out.strip(), err) == (0, "autoscaler.metricscale.dev/old", "")
    assert fake_kube.requests_to(r"autoscalers", method="POST") == []
