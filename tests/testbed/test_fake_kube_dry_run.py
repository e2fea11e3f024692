"""Fake kube-apiserver: `dryRun=All` on create, update, patch, delete and deletecollection, on
objects and on their status and scale subresources, as kube-apiserver answers it: validation
runs, the answer is the object as it would be, and nothing is stored, watched or versioned.
An unsupported value gets the 422 that the options' validation gives (checked against the
pinned kube-apiserver v1.36: `CreateOptions.meta.k8s.io "" is invalid: dryRun: ...`)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.fakes.kube_api import FakeKubeAPI
from testbed.fakes.kube_http import KubeHTTPClient
from testbed.fakes.tools import require_tool

REPO = Path(__file__).resolve().parents[2]
DEPLOYMENTS = "/apis/apps/v1/namespaces/demo/deployments"
DEPLOYMENT = f"{DEPLOYMENTS}/web"
CONFIGMAPS = "/api/v1/namespaces/demo/configmaps"
AUTOSCALERS = "/apis/metricscale.dev/v1alpha1/namespaces/demo/autoscalers"
MERGE = "application/merge-patch+json"
APPLY = "application/apply-patch+yaml"
DRY_RUN = {"dryRun": "All"}


def _autoscaler(name: str, target: str) -> dict[str, Any]:
    return {"apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
            "metadata": {"name": name, "namespace": "demo"},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": target},
                     "minReplicas": 1, "maxReplicas": 10,
                     "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
                         "type": "Utilization", "averageUtilization": 50}}}]}}


@pytest.fixture
def autoscaler_crd(fake_kube: FakeKubeAPI) -> None:
    crd = yaml.safe_load((REPO / "manifests" / "autoscaler" / "crd.yaml").read_text())
    fake_kube.create("apiextensions.k8s.io", "v1", "customresourcedefinitions", crd)


class Unchanged:
    """Holds the store's resourceVersion and a watch opened at it; `check` asserts that the
    resourceVersion did not move and that the first event the watch sees after the dry runs
    is the marker write `check` makes itself (a dry run's event would come before it)."""

    def __init__(self, fake: FakeKubeAPI, http: KubeHTTPClient, watched: str) -> None:
        self.fake = fake
        self.before = fake.store.resource_version
        self.events: AsyncIterator[dict[str, Any]] = http.watch(
            watched, {"resourceVersion": str(self.before)})

    async def check(self, marker: Any) -> None:
        assert self.fake.store.resource_version == self.before
        marker()
        event = await anext(aiter(self.events))
        assert event["type"] in ("ADDED", "MODIFIED", "DELETED"), event
        assert int(event["object"]["metadata"]["resourceVersion"]) == self.before + 1, event
        await self.events.aclose()  # type: ignore[attr-defined]


# --- create --------------------------------------------------------------------------------------


async def test_dry_run_create_answers_the_object_and_stores_nothing(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    watch = Unchanged(fake_kube, kube_http, DEPLOYMENTS)
    reply = await kube_http.post(DEPLOYMENTS, {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "c", "image": "x"}]}}}},
        params=DRY_RUN)
    assert reply.status == 201, reply.text
    metadata = reply.json["metadata"]
    assert metadata["name"] == "web" and metadata["namespace"] == "demo"
    assert metadata["uid"] and metadata["creationTimestamp"] and metadata["generation"] == 1
    assert "resourceVersion" not in metadata  # nothing was written, so no version
    assert reply.json["spec"]["replicas"] == 2
    assert (await kube_http.get(DEPLOYMENT)).status == 404
    await watch.check(lambda: fake_kube.create_deployment("marker", namespace="demo"))


async def test_dry_run_create_with_generate_name_names_it_but_stores_nothing(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    watch = Unchanged(fake_kube, kube_http, CONFIGMAPS)
    reply = await kube_http.post(CONFIGMAPS, {"metadata": {"generateName": "cm-"},
                                              "data": {"a": "b"}}, params=DRY_RUN)
    assert reply.status == 201, reply.text
    assert reply.json["metadata"]["name"].startswith("cm-")
    assert len(reply.json["metadata"]["name"]) == len("cm-") + 5
    assert (await kube_http.get(CONFIGMAPS)).json["items"] == []
    await watch.check(lambda: fake_kube.create("", "v1", "configmaps", {
        "metadata": {"name": "marker", "namespace": "demo"}}))


async def test_dry_run_create_is_validated_like_a_real_one(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    fake_kube.create("", "v1", "configmaps", {"metadata": {"name": "cm1", "namespace": "demo"}})
    taken = await kube_http.post(CONFIGMAPS, {"metadata": {"name": "cm1"}}, params=DRY_RUN)
    assert (taken.status, taken.json["reason"]) == (409, "AlreadyExists")
    bad = await kube_http.post(CONFIGMAPS, {"metadata": {"name": "CM_bad"}}, params=DRY_RUN)
    assert (bad.status, bad.json["reason"]) == (422, "Invalid"), bad.text
    assert bad.json["details"]["causes"][0]["field"] == "metadata.name"


async def test_dry_run_create_of_a_second_autoscaler_leaves_the_first_alone(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient, autoscaler_crd: None) -> None:
    # Issue 21: `metricscale autoscale ... --dry-run=server` on the demo's cluster made a
    # second Autoscaler on php-apache.
    first = await kube_http.post(AUTOSCALERS, _autoscaler("php-apache", "php-apache"))
    assert first.status == 201, first.text
    watch = Unchanged(fake_kube, kube_http, AUTOSCALERS)
    reply = await kube_http.post(AUTOSCALERS, _autoscaler("php-apache-2", "php-apache"),
                                 params={**DRY_RUN, "fieldManager": "metricscale-autoscale"})
    assert reply.status == 201, reply.text
    assert reply.json["kind"] == "Autoscaler" and reply.json["metadata"]["name"] == "php-apache-2"
    names = [item["metadata"]["name"] for item in (await kube_http.get(AUTOSCALERS)).json["items"]]
    assert names == ["php-apache"]
    invalid = _autoscaler("broken", "php-apache")
    invalid["spec"]["maxReplicas"] = 0
    refused = await kube_http.post(AUTOSCALERS, invalid, params=DRY_RUN)
    assert refused.status == 422, refused.text
    await watch.check(lambda: fake_kube.create("metricscale.dev", "v1alpha1", "autoscalers",
                                               _autoscaler("marker", "web")))


# --- update and patch ----------------------------------------------------------------------------


async def test_dry_run_update_answers_the_new_object_at_the_old_version(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    stored = fake_kube.create_deployment("web", namespace="demo", replicas=3)
    version = stored["metadata"]["resourceVersion"]
    watch = Unchanged(fake_kube, kube_http, DEPLOYMENTS)
    changed = {**stored, "spec": {**stored["spec"], "replicas": 7}}
    reply = await kube_http.put(DEPLOYMENT, changed, params=DRY_RUN)
    assert reply.status == 200, reply.text
    assert reply.json["spec"]["replicas"] == 7
    assert reply.json["metadata"]["generation"] == 2  # what the write would have made
    assert reply.json["metadata"]["resourceVersion"] == version
    now = (await kube_http.get(DEPLOYMENT)).json
    assert now["spec"]["replicas"] == 3 and now["metadata"]["generation"] == 1
    stale = {**changed, "metadata": {**changed["metadata"], "resourceVersion": "1"}}
    conflict = await kube_http.put(DEPLOYMENT, stale, params=DRY_RUN)
    assert conflict.status == 409, conflict.text
    missing = await kube_http.put(f"{DEPLOYMENTS}/nope", {
        **changed, "metadata": {"name": "nope"}}, params=DRY_RUN)
    assert missing.status == 404, missing.text
    await watch.check(lambda: fake_kube.create_deployment("marker", namespace="demo"))


async def test_dry_run_patch_and_apply_store_nothing(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    stored = fake_kube.create_deployment("web", namespace="demo", replicas=3)
    watch = Unchanged(fake_kube, kube_http, DEPLOYMENTS)
    reply = await kube_http.patch(DEPLOYMENT, {"spec": {"replicas": 4}}, content_type=MERGE,
                                  params=DRY_RUN)
    assert reply.status == 200, reply.text
    assert reply.json["spec"]["replicas"] == 4
    assert reply.json["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
    applied = await kube_http.patch(f"{DEPLOYMENTS}/applied", {
        **stored, "metadata": {"name": "applied"}}, content_type=APPLY,
        params={**DRY_RUN, "fieldManager": "tests"})
    assert applied.status == 201, applied.text
    assert (await kube_http.get(f"{DEPLOYMENTS}/applied")).status == 404
    assert (await kube_http.get(DEPLOYMENT)).json["spec"]["replicas"] == 3
    invalid = await kube_http.patch(DEPLOYMENT, {"spec": {"replicas": -1}}, content_type=MERGE,
                                    params=DRY_RUN)
    assert invalid.status == 422, invalid.text
    await watch.check(lambda: fake_kube.create_deployment("marker", namespace="demo"))


async def test_dry_run_create_on_update_stores_nothing(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    leases = "/apis/coordination.k8s.io/v1/namespaces/demo/leases"
    watch = Unchanged(fake_kube, kube_http, leases)
    reply = await kube_http.put(f"{leases}/lock", {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "lock"}, "spec": {"holderIdentity": "me"}}, params=DRY_RUN)
    assert reply.status == 201, reply.text
    assert (await kube_http.get(f"{leases}/lock")).status == 404
    await watch.check(lambda: fake_kube.create("coordination.k8s.io", "v1", "leases", {
        "metadata": {"name": "marker", "namespace": "demo"}}))


# --- subresources: status and scale --------------------------------------------------------------


async def test_dry_run_status_writes_store_nothing(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    stored = fake_kube.create_deployment("web", namespace="demo", replicas=3)
    watch = Unchanged(fake_kube, kube_http, DEPLOYMENTS)
    patched = await kube_http.patch(f"{DEPLOYMENT}/status", {"status": {"replicas": 9}},
                                    content_type=MERGE, params=DRY_RUN)
    assert patched.status == 200, patched.text
    assert patched.json["status"]["replicas"] == 9
    replaced = await kube_http.put(f"{DEPLOYMENT}/status", {
        **stored, "status": {**stored["status"], "replicas": 8}}, params=DRY_RUN)
    assert replaced.status == 200, replaced.text
    assert replaced.json["status"]["replicas"] == 8
    assert (await kube_http.get(DEPLOYMENT)).json["status"]["replicas"] == 3
    await watch.check(lambda: fake_kube.create_deployment("marker", namespace="demo"))


async def test_dry_run_scale_answers_the_scale_and_keeps_the_replicas(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient, autoscaler_crd: None) -> None:
    stored = fake_kube.create_deployment("web", namespace="demo", replicas=3)
    watch = Unchanged(fake_kube, kube_http, DEPLOYMENTS)
    put = await kube_http.put(f"{DEPLOYMENT}/scale", {
        "kind": "Scale", "apiVersion": "autoscaling/v1",
        "metadata": {"name": "web", "namespace": "demo"}, "spec": {"replicas": 7}},
        params=DRY_RUN)
    assert put.status == 200, put.text
    assert put.json["kind"] == "Scale" and put.json["spec"]["replicas"] == 7
    assert put.json["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
    patched = await kube_http.patch(f"{DEPLOYMENT}/scale", {"spec": {"replicas": 5}},
                                    content_type=MERGE, params=DRY_RUN)
    assert patched.status == 200 and patched.json["spec"]["replicas"] == 5, patched.text
    invalid = await kube_http.patch(f"{DEPLOYMENT}/scale", {"spec": {"replicas": -5}},
                                    content_type=MERGE, params=DRY_RUN)
    assert invalid.status == 422, invalid.text
    assert (await kube_http.get(f"{DEPLOYMENT}/scale")).json["spec"]["replicas"] == 3
    await watch.check(lambda: fake_kube.create_deployment("marker", namespace="demo"))


# --- delete and deletecollection -----------------------------------------------------------------


async def test_dry_run_delete_answers_success_and_keeps_the_object(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    stored = fake_kube.create("", "v1", "configmaps", {
        "metadata": {"name": "cm1", "namespace": "demo"}})
    watch = Unchanged(fake_kube, kube_http, CONFIGMAPS)
    reply = await kube_http.delete(f"{CONFIGMAPS}/cm1", params=DRY_RUN)
    assert reply.status == 200, reply.text
    assert reply.json["status"] == "Success"
    assert reply.json["details"] == {"name": "cm1", "kind": "configmaps",
                                     "uid": stored["metadata"]["uid"]}
    in_body = await kube_http.delete(f"{CONFIGMAPS}/cm1", body={
        "kind": "DeleteOptions", "apiVersion": "v1", "dryRun": ["All"]})
    assert in_body.status == 200 and in_body.json["status"] == "Success", in_body.text
    # A body's DeleteOptions are the options: a dryRun in the query beside it is not read.
    beside = await kube_http.delete(f"{CONFIGMAPS}/cm1", body={"dryRun": ["All"]},
                                    params={"dryRun": "x"})
    assert beside.status == 200, beside.text
    now = (await kube_http.get(f"{CONFIGMAPS}/cm1")).json
    assert now["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
    missing = await kube_http.delete(f"{CONFIGMAPS}/nope", params=DRY_RUN)
    assert missing.status == 404, missing.text
    await watch.check(lambda: fake_kube.create("", "v1", "configmaps", {
        "metadata": {"name": "marker", "namespace": "demo"}}))
    really = await kube_http.delete(f"{CONFIGMAPS}/cm1", body={
        "kind": "DeleteOptions", "apiVersion": "v1"}, params=DRY_RUN)
    assert really.status == 200, really.text
    assert (await kube_http.get(f"{CONFIGMAPS}/cm1")).status == 404


async def test_dry_run_delete_of_a_finalized_object_shows_the_deletion_mark_only(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    stored = fake_kube.create("", "v1", "configmaps", {
        "metadata": {"name": "kept", "namespace": "demo", "finalizers": ["x.io/keep"]}})
    watch = Unchanged(fake_kube, kube_http, CONFIGMAPS)
    reply = await kube_http.delete(f"{CONFIGMAPS}/kept", params=DRY_RUN)
    assert reply.status == 200, reply.text
    assert reply.json["kind"] == "ConfigMap"
    assert reply.json["metadata"]["deletionTimestamp"]
    assert reply.json["metadata"]["deletionGracePeriodSeconds"] == 0
    assert reply.json["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
    assert "deletionTimestamp" not in (await kube_http.get(f"{CONFIGMAPS}/kept")).json["metadata"]
    await watch.check(lambda: fake_kube.create("", "v1", "configmaps", {
        "metadata": {"name": "marker", "namespace": "demo"}}))


async def test_dry_run_delete_collection_lists_what_it_would_delete(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    for name in ("a", "b"):
        fake_kube.create("", "v1", "configmaps", {"metadata": {"name": name,
                                                              "namespace": "demo"}})
    watch = Unchanged(fake_kube, kube_http, CONFIGMAPS)
    reply = await kube_http.delete(CONFIGMAPS, params=DRY_RUN)
    assert reply.status == 200, reply.text
    assert reply.json["kind"] == "ConfigMapList"
    assert [item["metadata"]["name"] for item in reply.json["items"]] == ["a", "b"]
    assert reply.json["metadata"]["resourceVersion"] == str(watch.before)
    in_body = await kube_http.delete(CONFIGMAPS, body={"dryRun": ["All"]})
    assert in_body.status == 200, in_body.text
    assert len((await kube_http.get(CONFIGMAPS)).json["items"]) == 2
    await watch.check(lambda: fake_kube.create("", "v1", "configmaps", {
        "metadata": {"name": "marker", "namespace": "demo"}}))


async def test_delete_collection_answers_the_objects_as_listed(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    # registry/store.go DeleteCollection returns its list, not the deletions' results.
    stored = fake_kube.create("", "v1", "configmaps", {
        "metadata": {"name": "a", "namespace": "demo"}})
    listed_at = fake_kube.store.resource_version
    reply = await kube_http.delete(CONFIGMAPS)
    assert reply.status == 200, reply.text
    assert reply.json["metadata"]["resourceVersion"] == str(listed_at)
    [item] = reply.json["items"]
    assert item["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
    assert (await kube_http.get(CONFIGMAPS)).json["items"] == []


# --- unsupported values --------------------------------------------------------------------------


def _unsupported(reply: Any, kind: str, values: list[str]) -> None:
    shown = json.dumps(values, separators=(",", ":"))
    message = f'Unsupported value: {shown}: supported values: "All"'
    assert reply.status == 422, reply.text
    assert reply.json == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": f'{kind}.meta.k8s.io "" is invalid: dryRun: {message}',
        "reason": "Invalid",
        "details": {"group": "meta.k8s.io", "kind": kind, "causes": [
            {"reason": "FieldValueNotSupported", "message": message, "field": "dryRun"}]},
        "code": 422}


@pytest.mark.parametrize("values", [["all"], [""], ["All", "x"], ["true"]])
async def test_unsupported_dry_run_values_are_refused_before_anything_else(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient, values: list[str]) -> None:
    fake_kube.create_deployment("web", namespace="demo")
    before = fake_kube.store.resource_version
    query = [("dryRun", value) for value in values]
    # before the body is decoded, and before the object is looked up
    _unsupported(await kube_http.request("POST", DEPLOYMENTS, raw=b"{bad", params=query,
                                         content_type="application/json"),
                 "CreateOptions", values)
    _unsupported(await kube_http.request("PUT", DEPLOYMENT, raw=b"{bad", params=query,
                                         content_type="application/json"),
                 "UpdateOptions", values)
    _unsupported(await kube_http.patch(f"{DEPLOYMENTS}/nope", {}, content_type=MERGE,
                                       params=query), "PatchOptions", values)
    _unsupported(await kube_http.patch(f"{DEPLOYMENT}/scale", {"spec": {"replicas": 2}},
                                       content_type=MERGE, params=query),
                 "PatchOptions", values)
    _unsupported(await kube_http.delete(f"{DEPLOYMENTS}/nope", params=query),
                 "DeleteOptions", values)
    _unsupported(await kube_http.delete(DEPLOYMENTS, params=query), "DeleteOptions", values)
    _unsupported(await kube_http.delete(DEPLOYMENT, body={"dryRun": values}),
                 "DeleteOptions", values)
    assert fake_kube.store.resource_version == before
    assert (await kube_http.get(DEPLOYMENT)).status == 200


async def test_the_media_type_is_checked_before_the_options(kube_http: KubeHTTPClient) -> None:
    reply = await kube_http.request("POST", CONFIGMAPS, raw=b"{}", content_type="text/plain",
                                    params={"dryRun": "x"})
    assert reply.status == 415, reply.text


async def test_option_errors_are_reported_together(kube_http: KubeHTTPClient) -> None:
    reply = await kube_http.post(CONFIGMAPS, {"metadata": {"name": "cm"}},
                                 params={"dryRun": "x", "fieldValidation": "bad"})
    assert reply.status == 422, reply.text
    assert reply.json["message"] == (
        'CreateOptions.meta.k8s.io "" is invalid: [dryRun: Unsupported value: ["x"]: supported '
        'values: "All", fieldValidation: Unsupported value: "bad": supported values: "", '
        '"Ignore", "Strict", "Warn"]')
    apply = await kube_http.patch(f"{CONFIGMAPS}/cm", {}, content_type=APPLY,
                                  params={"dryRun": "x"})
    assert apply.json["message"] == (
        'PatchOptions.meta.k8s.io "" is invalid: [fieldManager: Required value: is required '
        'for apply patch, dryRun: Unsupported value: ["x"]: supported values: "All"]')


# --- kubectl --dry-run=server ------------------------------------------------------------------


@pytest.mark.kubectl
async def test_kubectl_server_dry_runs_change_nothing(
        fake_kube: FakeKubeAPI, kubeconfig: Path, tmp_path: Path, autoscaler_crd: None) -> None:
    kubectl = require_tool("kubectl", env_var="KUBECTL")
    fake_kube.create_deployment("php-apache", namespace="demo", replicas=1)
    fake_kube.create("metricscale.dev", "v1alpha1", "autoscalers",
                     _autoscaler("php-apache", "php-apache"))
    manifest = tmp_path / "second.yaml"
    manifest.write_text(yaml.safe_dump(_autoscaler("php-apache-2", "php-apache")))
    before = fake_kube.store.resource_version

    async def run(*args: str) -> str:
        result = await asyncio.to_thread(
            subprocess.run, [kubectl, "--kubeconfig", str(kubeconfig),
                             "--cache-dir", str(tmp_path / "cache"), *args],
            capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    assert await run("apply", "--dry-run=server", "-f", str(manifest)) == \
        "autoscaler.metricscale.dev/php-apache-2 created (server dry run)"
    assert await run("scale", "deployment/php-apache", "-n", "demo", "--replicas=5",
                     "--dry-run=server") == \
        "deployment.apps/php-apache scaled (server dry run)"
    assert await run("delete", "msa/php-apache", "-n", "demo", "--dry-run=server") == \
        'autoscaler.metricscale.dev "php-apache" deleted (server dry run)'
    assert await run("get", "msa", "-n", "demo", "-o", "name") == \
        "autoscaler.metricscale.dev/php-apache"
    assert fake_kube.store.get("apps", "v1", "deployments", "php-apache",
                               namespace="demo")["spec"]["replicas"] == 1
    assert fake_kube.store.resource_version == before
