"""`metricscale autoscale` against the session's real kube-apiserver with the Autoscaler CRD
installed (tests/cluster/conftest.py's `installation`), run as users do."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from urllib.parse import parse_qs

import pytest

from testbed.binaries import find_peer
from testbed.controlplane import ControlPlane, KubeError
from testbed.faultproxy import FaultProxy
from testbed.install import Installation


async def run(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(120):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def autoscale(kubeconfig: Path, *args: str) -> tuple[int, str, str]:
    return await run(sys.executable, "-m", "metricscale", "autoscale",
                     "--kubeconfig", str(kubeconfig), *args)


async def kubectl_get_msa(kubeconfig: Path, namespace: str) -> tuple[int, str, str]:
    return await run(str(find_peer("kubectl")), "--kubeconfig", str(kubeconfig),
                     "get", "msa", "-n", namespace, "-o", "name")


def exists(cluster: ControlPlane, namespace: str, name: str) -> bool:
    try:
        cluster.get(f"/apis/metricscale.dev/v1alpha1/namespaces/{namespace}/autoscalers/{name}")
    except KubeError as error:
        if error.status == 404:
            return False
        raise
    return True


@pytest.mark.kubectl
async def test_create_then_kubectl_get_msa_shows_it(installation: Installation,
                                                    namespace: str) -> None:
    kubeconfig = installation.cluster.kubeconfig
    code, out, err = await autoscale(kubeconfig, "deployment/web", "--min", "2", "--max", "10",
                                     "--cpu-percent", "50", "-n", namespace)
    assert (code, out.strip(), err) == (0, "autoscaler.metricscale.dev/web autoscaled", "")
    code, out, err = await kubectl_get_msa(kubeconfig, namespace)
    assert code == 0, err
    assert out.strip() == "autoscaler.metricscale.dev/web"


async def test_second_create_reports_already_exists(installation: Installation,
                                                    namespace: str) -> None:
    kubeconfig = installation.cluster.kubeconfig
    code, _, err = await autoscale(kubeconfig, "deploy", "web", "--max", "3", "-n", namespace)
    assert code == 0, err
    code, _, err = await autoscale(kubeconfig, "deploy", "web", "--max", "3", "-n", namespace)
    assert code == 1
    assert err.strip() == ('Error from server (AlreadyExists): autoscalers.metricscale.dev '
                           '"web" already exists')


async def test_server_dry_run_sends_dry_run_all(installation: Installation, namespace: str,
                                               fault_proxy: FaultProxy,
                                               tmp_path: Path) -> None:
    # Through the fault proxy, which records every request (it injects no fault here). A real
    # API server honours dryRun=All: it validates the object and persists nothing, so besides
    # the wire contract the fake could only pin, its effect is checked too.
    cluster = installation.cluster
    kubeconfig = fault_proxy.write_kubeconfig("admin", cluster.admin_token(),
                                              path=tmp_path / "kubeconfig")
    code, out, err = await autoscale(kubeconfig, "sts/db", "--max", "4", "--metric", "rps=100",
                                     "--dry-run=server", "-n", namespace)
    assert code == 0, err
    assert out.strip() == "autoscaler.metricscale.dev/db autoscaled (server dry run)"
    [post] = fault_proxy.requests_to(
        rf"^/apis/metricscale\.dev/v1alpha1/namespaces/{namespace}/autoscalers$", method="POST")
    assert parse_qs(post.query).get("dryRun") == ["All"]
    assert not exists(cluster, namespace, "db")


async def test_client_dry_run_sends_nothing(control_plane: ControlPlane,
                                            fault_proxy: FaultProxy, tmp_path: Path) -> None:
    # Through the fault proxy, which records every request (it injects no fault here).
    kubeconfig = fault_proxy.write_kubeconfig("admin", control_plane.admin_token(),
                                              path=tmp_path / "kubeconfig")
    code, out, err = await autoscale(kubeconfig, "rc/old", "--max", "2", "--dry-run=client",
                                     "-o", "name")
    assert (code, out.strip(), err) == (0, "autoscaler.metricscale.dev/old", "")
    assert fault_proxy.requests_to(r"autoscalers", method="POST") == []
