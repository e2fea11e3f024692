"""Fake kube-apiserver with the real clients: kubernetes_asyncio (typed APIs, custom objects,
Watch with bookmarks, 409/410 as ApiException) and kubectl (get --raw, get -o json)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from testbed.fakes.kube_api import FakeKubeAPI
from testbed.fakes.tools import require_tool


async def test_core_v1_lists_pods_with_a_selector(fake_kube: FakeKubeAPI,
                                                  kube_api_client: Any) -> None:
    fake_kube.create_pod("web-1", namespace="demo", labels={"app": "web"})
    fake_kube.create_pod("db-1", namespace="demo", labels={"app": "db"})
    pods = await client.CoreV1Api(kube_api_client).list_namespaced_pod(
        "demo", label_selector="app=web")
    assert [p.metadata.name for p in pods.items] == ["web-1"]
    pod = pods.items[0]
    assert pod.status.phase == "Running"
    ready = next(c for c in pod.status.conditions if c.type == "Ready")
    assert ready.status == "True" and ready.last_transition_time is not None
    assert pod.spec.containers[0].resources.requests == {"cpu": "100m"}


async def test_kubeconfig_loads_into_kubernetes_asyncio(fake_kube: FakeKubeAPI,
                                                        tmp_path: Path) -> None:
    path = fake_kube.write_kubeconfig(tmp_path / "kubeconfig")
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(path), client_configuration=configuration)
    async with client.ApiClient(configuration=configuration) as api:
        namespaces = await client.CoreV1Api(api).list_namespace()
    assert "kube-system" in [n.metadata.name for n in namespaces.items]


async def test_apps_v1_reads_and_replaces_scale_with_conflicts(
        fake_kube: FakeKubeAPI, kube_api_client: Any) -> None:
    fake_kube.create_deployment("web", namespace="demo", replicas=2)
    apps = client.AppsV1Api(kube_api_client)
    scale = await apps.read_namespaced_deployment_scale("web", "demo")
    assert scale.spec.replicas == 2 and scale.status.selector == "app=web"
    scale.spec.replicas = 4
    updated = await apps.replace_namespaced_deployment_scale("web", "demo", scale)
    assert updated.spec.replicas == 4
    scale.spec.replicas = 5  # the resourceVersion in `scale` is now stale
    with pytest.raises(ApiException) as raised:
        await apps.replace_namespaced_deployment_scale("web", "demo", scale)
    assert raised.value.status == 409
    assert json.loads(raised.value.body)["reason"] == "Conflict"
    patched = await apps.patch_namespaced_deployment_scale("web", "demo",
                                                           {"spec": {"replicas": 1}})
    assert patched.spec.replicas == 1


async def test_autoscaling_v2_status_patch_is_strategic(fake_kube: FakeKubeAPI,
                                                        kube_api_client: Any) -> None:
    hpa_api = client.AutoscalingV2Api(kube_api_client)
    await hpa_api.create_namespaced_horizontal_pod_autoscaler("demo", {  # type: ignore[arg-type]
        "metadata": {"name": "web"}, "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "minReplicas": 1, "maxReplicas": 5}})
    patched = await hpa_api.patch_namespaced_horizontal_pod_autoscaler_status("web", "demo", {
        "status": {"desiredReplicas": 3, "currentReplicas": 2, "conditions": [
            {"type": "AbleToScale", "status": "True", "reason": "SucceededRescale",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})
    assert patched.status.desired_replicas == 3
    assert fake_kube.requests_to(r"/status$", method="PATCH")[0].header("Content-Type") == \
        "application/strategic-merge-patch+json"


async def test_custom_objects_api_with_merge_patch(fake_kube: FakeKubeAPI,
                                                   kube_api_client: Any) -> None:
    fake_kube.create_crd(group="example.com", kind="Widget", plural="widgets",
                         scale={"specReplicasPath": ".spec.replicas",
                                "statusReplicasPath": ".status.replicas"})
    objects = client.CustomObjectsApi(kube_api_client)
    await objects.create_namespaced_custom_object("example.com", "v1", "demo", "widgets", {
        "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
        "spec": {"replicas": 1}})
    await objects.patch_namespaced_custom_object_status(  # type: ignore[call-arg]
        "example.com", "v1", "demo", "widgets", "w", {"status": {"replicas": 1}},
        _content_type="application/merge-patch+json")
    scale = await objects.get_namespaced_custom_object_scale("example.com", "v1", "demo",
                                                             "widgets", "w")
    assert scale["spec"]["replicas"] == 1 and scale["status"]["replicas"] == 1
    # kubernetes_asyncio's default for a dict body on custom objects is JSON patch; the
    # apiserver rejects a dict as a JSON patch document, and so does the fake.
    with pytest.raises(ApiException) as raised:
        await objects.patch_namespaced_custom_object("example.com", "v1", "demo", "widgets",
                                                     "w", {"spec": {"replicas": 2}})
    assert raised.value.status in (400, 422)


async def test_watch_stream_with_bookmarks_and_resumption(fake_kube: FakeKubeAPI,
                                                          kube_api_client: Any) -> None:
    fake_kube.watch_settings.bookmark_interval = 0.05
    core = client.CoreV1Api(kube_api_client)
    listing = await core.list_namespaced_pod("demo")
    seen: list[tuple[str, str]] = []
    async with watch.Watch() as stream:
        async with asyncio.timeout(10):
            async for event in stream.stream(core.list_namespaced_pod, "demo",
                                             resource_version=listing.metadata.resource_version,
                                             allow_watch_bookmarks=True, timeout_seconds=30):
                if event["type"] == "BOOKMARK":
                    seen.append(("BOOKMARK", event["raw_object"]["metadata"]["resourceVersion"]))
                    if not any(kind == "ADDED" for kind, _ in seen):
                        fake_kube.create_pod("web-1", namespace="demo")
                    else:
                        break
                else:
                    seen.append((event["type"], event["object"].metadata.name))
            last = stream.resource_version
    assert ("ADDED", "web-1") in seen
    assert int(last) == fake_kube.resource_version  # advanced by the last bookmark


async def test_watch_from_a_compacted_version_raises_410(fake_kube: FakeKubeAPI,
                                                         kube_api_client: Any) -> None:
    old = fake_kube.create_pod("a", namespace="demo")["metadata"]["resourceVersion"]
    fake_kube.create_pod("b", namespace="demo")
    fake_kube.compact()
    core = client.CoreV1Api(kube_api_client)
    with pytest.raises(ApiException) as raised:
        async with watch.Watch() as stream:
            async for _ in stream.stream(core.list_namespaced_pod, "demo",
                                         resource_version=old, timeout_seconds=5):
                pass
    assert raised.value.status == 410


# --- kubectl -------------------------------------------------------------------------------------


def _kubectl(kubectl: str, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([kubectl, "--kubeconfig", str(kubeconfig), *args],
                          capture_output=True, text=True, timeout=60, check=False)


async def _run_kubectl(kubectl: str, kubeconfig: Path,
                       *args: str) -> subprocess.CompletedProcess[str]:
    # The fake lives on this event loop; kubectl must run in a thread to let it answer.
    return await asyncio.to_thread(_kubectl, kubectl, kubeconfig, *args)


@pytest.mark.kubectl
async def test_kubectl_get_raw_lists_pods(fake_kube: FakeKubeAPI, kubeconfig: Path) -> None:
    kubectl = require_tool("kubectl")
    fake_kube.create_namespace("demo")
    fake_kube.create_pod("web-1", namespace="demo", labels={"app": "web"})
    result = await _run_kubectl(kubectl, kubeconfig, "get", "--raw",
                                "/api/v1/namespaces/demo/pods")
    assert result.returncode == 0, result.stderr
    listing = json.loads(result.stdout)
    assert listing["kind"] == "PodList"
    assert [p["metadata"]["name"] for p in listing["items"]] == ["web-1"]


@pytest.mark.kubectl
async def test_kubectl_get_pods_as_json_and_table(fake_kube: FakeKubeAPI,
                                                  kubeconfig: Path) -> None:
    kubectl = require_tool("kubectl")
    fake_kube.create_namespace("demo")
    fake_kube.create_pod("web-1", namespace="demo", labels={"app": "web"})
    fake_kube.create_pod("web-2", namespace="demo", labels={"app": "web"}, ready=False)
    result = await _run_kubectl(kubectl, kubeconfig, "get", "pods", "-n", "demo", "-o", "json")
    assert result.returncode == 0, result.stderr
    assert [p["metadata"]["name"] for p in json.loads(result.stdout)["items"]] == [
        "web-1", "web-2"]
    table = await _run_kubectl(kubectl, kubeconfig, "get", "pods", "-n", "demo")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert lines[1].split()[:3] == ["web-1", "1/1", "Running"]
    assert lines[2].split()[:2] == ["web-2", "0/1"]


@pytest.mark.kubectl
async def test_kubectl_scale_and_errors(fake_kube: FakeKubeAPI, kubeconfig: Path) -> None:
    kubectl = require_tool("kubectl")
    fake_kube.create_namespace("demo")  # kubectl looks the namespace up after a NotFound
    fake_kube.create_deployment("web", namespace="demo", replicas=2)
    scaled = await _run_kubectl(kubectl, kubeconfig, "scale", "deployment/web", "-n", "demo",
                                "--replicas=3")
    assert scaled.returncode == 0, scaled.stderr
    stored = fake_kube.store.get("apps", "v1", "deployments", "web", namespace="demo")
    assert stored["spec"]["replicas"] == 3
    missing = await _run_kubectl(kubectl, kubeconfig, "get", "deployment", "nope", "-n", "demo")
    assert missing.returncode != 0
    assert 'deployments.apps "nope" not found' in missing.stderr


@pytest.mark.kubectl
async def test_kubectl_apply_validates_on_the_server(fake_kube: FakeKubeAPI, kubeconfig: Path,
                                                     tmp_path: Path) -> None:
    kubectl = require_tool("kubectl")
    fake_kube.create_namespace("demo")
    manifest = tmp_path / "app.yaml"
    manifest.write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: api, namespace: demo}\n"
        "spec:\n  replicas: 2\n  selector: {matchLabels: {app: api}}\n"
        "  template:\n    metadata: {labels: {app: api}}\n"
        "    spec: {containers: [{name: api, image: nginx}]}\n")
    applied = await _run_kubectl(kubectl, kubeconfig, "apply", "-f", str(manifest))
    assert applied.returncode == 0, applied.stderr
    assert fake_kube.requests_to(r"/deployments$", method="POST")[0].param(
        "fieldValidation") == "Strict"
    manifest.write_text(manifest.read_text().replace("replicas: 2", "replicaz: 2"))
    rejected = await _run_kubectl(kubectl, kubeconfig, "apply", "-f", str(manifest))
    assert rejected.returncode != 0
    assert 'strict decoding error: unknown field "spec.replicaz"' in rejected.stderr
