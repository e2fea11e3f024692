"""kube.py against the real kube-apiserver: scale targets, scale updates, retries, status, events.

The client under test talks through the fault proxy in front of the session's kube-apiserver:
the proxy records every request (discovery caching is counted there) and injects what a real
server cannot be made to do on demand (429, 5xx, dropped connections, persistent conflicts).
Objects are made with the admin's own client (`control_plane`), directly, so they are not
counted. Namespaced objects live in the test's `namespace`; the CRDs of a test are in a group of
its own (`Names`), deleted afterwards; the Autoscaler CRD is the shipped one, applied as every
module applies it and left installed (other modules' Autoscalers live in it)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from autoscaler.kube.operations import KubeClient, ObjectReference, ScaleTargetRef, TargetNotFound
from metricscale.kube import errors
from metricscale.kube.http import KubeHTTP, Response, open_kube_http
from metricscale.kube.retry import RetryPolicy
from testbed.binaries import CHECKOUT
from testbed.controlplane import ControlPlane
from testbed.faultproxy import DropConnection, FaultProxy, ServerError, TooManyRequests
from tests.adapter.cluster import Names
from tests.cluster.support import until

NOW = datetime(2024, 5, 1, 12, 0, 21, tzinfo=UTC)
MICRO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
WIDGET_SCALE = {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                "labelSelectorPath": ".status.selector"}
MERGE_PATCH = "application/merge-patch+json"
AUTOSCALERS = "/apis/metricscale.dev/v1alpha1/namespaces/{namespace}/autoscalers"
HPAS = "/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers"
DEPLOYMENTS = "/apis/apps/v1/namespaces/{namespace}/deployments"
EVENTS = "/apis/events.k8s.io/v1/namespaces/{namespace}/events"


class Sleeps:
    """An injected sleep: records the delays, never waits."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


class RecordingHTTP(KubeHTTP):
    """KubeHTTP noting each request's Content-Type (the fault proxy records no headers)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.content_types: list[tuple[str, str, str | None]] = []

    async def request(self, verb: str, path: str, **options: Any) -> Response:
        body, content_type = options.get("body"), options.get("content_type")
        self.content_types.append((verb, path, content_type if body is not None else None))
        return await super().request(verb, path, **options)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def configuration(control_plane: ControlPlane, fault_proxy: FaultProxy) -> Any:
    """The admin's token, through the fault proxy."""
    return control_plane.api_client_configuration(server=fault_proxy.server)


@pytest.fixture
async def http(configuration: Any) -> AsyncIterator[RecordingHTTP]:
    async with RecordingHTTP(configuration) as session:
        assert isinstance(session, RecordingHTTP)
        yield session


@pytest.fixture
def kube(http: RecordingHTTP, sleeps: Sleeps, registry: CollectorRegistry) -> KubeClient:
    return KubeClient(http, registry=registry, reporting_instance="autoscaler-0",
                      sleep=sleeps, jitter=lambda: 0.0)


def requests(fault_proxy: FaultProxy, pattern: str) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in fault_proxy.requests_to(pattern)]


# --- objects on the real cluster ------------------------------------------------------------


def paused_deployment(namespace: str, name: str, *, replicas: int,
                      labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A paused Deployment: its controller makes no ReplicaSet and no pod, so once it has
    observed the object nothing writes it again (status.replicas stays 0)."""
    selector = dict(labels or {"app": name})
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace, "labels": selector},
            "spec": {"replicas": replicas, "paused": True,
                     "selector": {"matchLabels": selector},
                     "template": {"metadata": {"labels": selector},
                                  "spec": {"containers": [{
                                      "name": "app", "image": "registry.invalid/app:1"}]}}}}


async def create_deployment(cluster: ControlPlane, namespace: str, name: str = "web", *,
                            replicas: int, labels: Mapping[str, str] | None = None
                            ) -> dict[str, Any]:
    """Creates the paused Deployment and waits until the deployment controller has written
    its status (observedGeneration) and so leaves it alone: the Deployment as it then is."""
    cluster.request("POST", DEPLOYMENTS.format(namespace=namespace),
                    paused_deployment(namespace, name, replicas=replicas, labels=labels))
    path = f"{DEPLOYMENTS.format(namespace=namespace)}/{name}"
    settled: list[dict[str, Any]] = []

    def observed() -> bool:
        obj: dict[str, Any] = cluster.get(path)
        conditions = (obj.get("status") or {}).get("conditions") or []
        if (obj.get("status") or {}).get("observedGeneration") == obj["metadata"]["generation"] \
                and any(c.get("reason") == "DeploymentPaused" for c in conditions):
            settled.append(obj)
            return True
        return False

    await until(observed, what=f"the deployment controller observing {namespace}/{name}")
    return settled[-1]


@dataclass
class CRDs:
    """CRDs in a group of the test's own, once kube-apiserver serves them in discovery."""

    cluster: ControlPlane
    probe: KubeClient  # straight to kube-apiserver: its discovery reads are not recorded
    group: str = field(default_factory=lambda: f"{Names.unique('kubeio').prefix}.example.com")
    created: list[dict[str, Any]] = field(default_factory=list)

    async def create(self, *, kind: str, plural: str,
                     scale: Mapping[str, str] | None = None) -> None:
        subresources: dict[str, Any] = {"status": {}}
        if scale is not None:
            subresources["scale"] = dict(scale)
        name = f"{plural}.{self.group}"
        crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
               "metadata": {"name": name},
               "spec": {"group": self.group, "scope": "Namespaced",
                        "names": {"kind": kind, "plural": plural, "singular": kind.lower(),
                                  "listKind": f"{kind}List"},
                        "versions": [{"name": "v1", "served": True, "storage": True,
                                      "schema": {"openAPIV3Schema": {
                                          "type": "object",
                                          "x-kubernetes-preserve-unknown-fields": True}},
                                      "subresources": subresources}]}}
        self.created.append(crd)
        self.cluster.apply(crd)
        await until(lambda: established(self.cluster, name), what=f"CRD {name} Established")
        await until(lambda: self.discovered(kind), what=f"{kind} in discovery")

    async def discovered(self, kind: str) -> bool:
        try:
            await self.probe.resolve_kind(group=self.group, kind=kind)
        except errors.KindNotFound:
            return False
        return True

    def delete(self) -> None:
        for crd in self.created:
            self.cluster.delete(crd)


def established(cluster: ControlPlane, name: str) -> bool:
    found = cluster.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    return any(c.get("type") == "Established" and c.get("status") == "True"
               for c in (found.get("status") or {}).get("conditions") or [])


@pytest.fixture
async def crds(control_plane: ControlPlane) -> AsyncIterator[CRDs]:
    async with open_kube_http(control_plane.api_client_configuration()) as direct:
        made = CRDs(control_plane, KubeClient(direct, registry=CollectorRegistry(),
                                              reporting_instance="probe"))
        try:
            yield made
        finally:
            made.delete()


@pytest.fixture
async def autoscaler_crd(control_plane: ControlPlane) -> None:
    """The shipped Autoscaler CRD (the client's group is fixed), as every module applies it.
    Not deleted: it is the one CRD of that name, and other modules' Autoscalers are in it."""
    crd = yaml.safe_load((CHECKOUT / "manifests/autoscaler/crd.yaml").read_text())
    control_plane.apply(crd)
    await until(lambda: established(control_plane, crd["metadata"]["name"]),
                what="the Autoscaler CRD Established")


async def write_on_what_was_read(
        read: Callable[[], dict[str, Any]],
        write: Callable[[dict[str, Any]], Awaitable[Mapping[str, Any]]],
) -> tuple[dict[str, Any], Mapping[str, Any]]:
    """Reads the object, then writes with the read resourceVersion as a precondition; again
    after a Conflict. A controller of the session may write the object's status meanwhile
    (kube-controller-manager's HPA controller, one sync period after an HPA appears; an
    installed metricscale autoscaler, at once): the write then lands on what it read."""
    for _ in range(20):
        current = read()
        try:
            return current, await write(current)
        except errors.Conflict:
            continue
    raise AssertionError("another writer kept changing the object")


# --- resolving scaleTargetRef ------------------------------------------------------------------


@pytest.mark.parametrize(("api_version", "kind", "resource"), [
    ("apps/v1", "Deployment", "deployments"),
    ("apps/v1", "StatefulSet", "statefulsets"),
    ("apps/v1", "ReplicaSet", "replicasets"),
    ("apps/v1beta2", "Deployment", "deployments"),  # only the group counts, as upstream
])
async def test_builtin_workloads_resolve_to_their_scale_subresource(
        kube: KubeClient, api_version: str, kind: str, resource: str) -> None:
    mapping = await kube.resolve_scale_target(ScaleTargetRef(api_version, kind, "web"))
    assert (mapping.group, mapping.version, mapping.resource) == ("apps", "v1", resource)
    assert mapping.namespaced and mapping.has_scale


async def test_crd_with_scale_resolves(crds: CRDs, kube: KubeClient) -> None:
    await crds.create(kind="Widget", plural="widgets", scale=WIDGET_SCALE)
    mapping = await kube.resolve_scale_target(ScaleTargetRef(f"{crds.group}/v1", "Widget", "w"))
    assert mapping.group_resource == f"widgets.{crds.group}"


async def test_crd_without_scale_is_no_scale_subresource_with_upstreams_text(
        crds: CRDs, kube: KubeClient) -> None:
    await crds.create(kind="Gadget", plural="gadgets")
    with pytest.raises(errors.NoScaleSubresource) as caught:
        await kube.resolve_scale_target(ScaleTargetRef(f"{crds.group}/v1", "Gadget", "g"))
    assert str(caught.value) == (f"could not find scale subresource for {crds.group}/v1, "
                                 "Resource=gadgets in discovery information")


@pytest.mark.parametrize(("api_version", "kind", "message"), [
    ("apps/v1", "Deploymnet", 'no matches for kind "Deploymnet" in group "apps"'),
    ("nothing.example/v1", "Thing", 'no matches for kind "Thing" in group "nothing.example"'),
])
async def test_unknown_kind_is_kind_not_found_with_upstreams_text(
        kube: KubeClient, api_version: str, kind: str, message: str) -> None:
    with pytest.raises(errors.KindNotFound) as caught:
        await kube.resolve_scale_target(ScaleTargetRef(api_version, kind, "x"))
    assert str(caught.value) == message


async def test_discovery_is_cached_and_refreshed_on_a_miss(
        fault_proxy: FaultProxy, crds: CRDs, kube: KubeClient) -> None:
    await kube.resolve_scale_target(ScaleTargetRef("apps/v1", "Deployment", "web"))
    await kube.resolve_scale_target(ScaleTargetRef("apps/v1", "StatefulSet", "db"))
    assert len(requests(fault_proxy, r"^/apis$")) == 1
    # A CRD installed after the first lookup is found by refreshing on the miss.
    await crds.create(kind="Widget", plural="widgets", scale=WIDGET_SCALE)
    await kube.resolve_scale_target(ScaleTargetRef(f"{crds.group}/v1", "Widget", "w"))
    assert len(requests(fault_proxy, r"^/apis$")) == 2


async def test_concurrent_resolutions_share_one_discovery_fetch(
        fault_proxy: FaultProxy, kube: KubeClient) -> None:
    refs = [ScaleTargetRef("apps/v1", kind, "x")
            for kind in ("Deployment", "StatefulSet", "ReplicaSet") * 3]
    await asyncio.gather(*(kube.resolve_scale_target(ref) for ref in refs))
    assert len(requests(fault_proxy, r"^/apis$")) == 1
    # The real server answers /apis as aggregated discovery, which holds every group version's
    # resources: no per-version GET at all (the fake, legacy only, had one of apps/v1).
    assert requests(fault_proxy, r"^/apis/apps/v1$") == []


async def test_discovery_expires_after_its_ttl(fault_proxy: FaultProxy, http: RecordingHTTP,
                                               ) -> None:
    now = [0.0]
    kube = KubeClient(http, registry=CollectorRegistry(), reporting_instance="a",
                      discovery_ttl=30.0, monotonic=lambda: now[0])
    ref = ScaleTargetRef("apps/v1", "Deployment", "web")
    await kube.resolve_scale_target(ref)
    now[0] = 29.0
    await kube.resolve_scale_target(ref)
    assert len(requests(fault_proxy, r"^/apis$")) == 1
    now[0] = 30.0
    await kube.resolve_scale_target(ref)
    assert len(requests(fault_proxy, r"^/apis$")) == 2


# --- scale ---------------------------------------------------------------------------------


async def test_get_scale_reads_replicas_selector_and_resource_version(
        control_plane: ControlPlane, fault_proxy: FaultProxy, namespace: str,
        kube: KubeClient) -> None:
    stored = await create_deployment(control_plane, namespace, replicas=3,
                                     labels={"app": "web", "tier": "front"})
    target = await kube.resolve_scale_target(ScaleTargetRef("apps/v1", "Deployment", "web"))
    scale = await kube.get_scale(target, namespace=namespace, name="web")
    # Paused, the Deployment has no pod: status.replicas is the controller's 0, not spec's 3.
    assert (scale.spec_replicas, scale.status_replicas, scale.selector) == (3, 0,
                                                                            "app=web,tier=front")
    assert scale.resource_version == stored["metadata"]["resourceVersion"]
    assert requests(fault_proxy, "/scale$") == [
        ("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments/web/scale")]
    assert kube.request_count == len(fault_proxy.requests_to(""))


async def test_scale_of_a_missing_target_is_target_not_found(namespace: str,
                                                             kube: KubeClient) -> None:
    target = await kube.resolve_scale_target(ScaleTargetRef("apps/v1", "Deployment", "gone"))
    with pytest.raises(TargetNotFound) as caught:
        await kube.get_scale(target, namespace=namespace, name="gone")
    assert str(caught.value) == 'deployments.apps "gone" not found'


async def test_crd_scale_reads_and_writes_through_its_paths(
        control_plane: ControlPlane, namespace: str, crds: CRDs, kube: KubeClient) -> None:
    await crds.create(kind="Widget", plural="widgets", scale=WIDGET_SCALE)
    widgets = f"/apis/{crds.group}/v1/namespaces/{namespace}/widgets"
    control_plane.request("POST", widgets, {
        "apiVersion": f"{crds.group}/v1", "kind": "Widget",
        "metadata": {"name": "w", "namespace": namespace}, "spec": {"replicas": 2}})
    # With the status subresource, a create drops the status: it is written through /status.
    control_plane.request("PATCH", f"{widgets}/w/status",
                          {"status": {"replicas": 2, "selector": "app=w"}},
                          content_type=MERGE_PATCH)
    target = await kube.resolve_scale_target(ScaleTargetRef(f"{crds.group}/v1", "Widget", "w"))
    scale = await kube.get_scale(target, namespace=namespace, name="w")
    assert (scale.spec_replicas, scale.selector) == (2, "app=w")
    updated = await kube.update_scale(target, namespace=namespace, name="w", scale=scale,
                                      replicas=5)
    assert updated.spec_replicas == 5
    assert control_plane.get(f"{widgets}/w")["spec"]["replicas"] == 5


async def test_update_scale_puts_with_the_read_resource_version(
        control_plane: ControlPlane, fault_proxy: FaultProxy, namespace: str,
        kube: KubeClient) -> None:
    await create_deployment(control_plane, namespace, replicas=3)
    target = await kube.resolve_scale_target(ScaleTargetRef("apps/v1", "Deployment", "web"))
    scale = await kube.get_scale(target, namespace=namespace, name="web")
    updated = await kube.update_scale(target, namespace=namespace, name="web", scale=scale,
                                      replicas=6)
    assert updated.spec_replicas == 6
    assert updated.resource_version != scale.resource_version
    assert [r.method for r in fault_proxy.requests_to("/scale$")] == ["GET", "PUT"]
    stored = control_plane.get(f"{DEPLOYMENTS.format(namespace=namespace)}/web")
    assert stored["spec"]["replicas"] == 6


async def test_conflict_rereads_the_scale_and_succeeds(
        control_plane: ControlPlane, fault_proxy: FaultProxy, namespace: str,
        kube: KubeClient, sleeps: Sleeps) -> None:
    await create_deployment(control_plane, namespace, replicas=3)
    target = await kube.resolve_scale_target(ScaleTargetRef("apps/v1", "Deployment", "web"))
    stale = await kube.get_scale(target, namespace=namespace, name="web")
    # Someone else writes the deployment: our resourceVersion is now stale.
    control_plane.request("PATCH", f"{DEPLOYMENTS.format(namespace=namespace)}/web",
                          {"metadata": {"labels": {"touched": "yes"}}}, content_type=MERGE_PATCH)
    updated = await kube.update_scale(target, namespace=namespace, name="web", scale=stale,
                                      replicas=4)
    assert updated.spec_replicas == 4
    assert [r.method for r in fault_proxy.requests_to("/scale$")] == ["GET", "PUT", "GET", "PUT"]
    assert [r.status for r in fault_proxy.requests_to("/scale$", method="PUT")] == [409, 200]
    assert sleeps.delays == [pytest.approx(0.010)]


async def test_persistent_conflicts_give_up_after_five_tries(
        control_plane: ControlPlane, fault_proxy: FaultProxy, namespace: str,
        kube: KubeClient, sleeps: Sleeps) -> None:
    await create_deployment(control_plane, namespace, replicas=3)
    target = await kube.resolve_scale_target(ScaleTargetRef("apps/v1", "Deployment", "web"))
    scale = await kube.get_scale(target, namespace=namespace, name="web")
    fault_proxy.add_fault("/scale$", ServerError(code=409, message="the object has been modified"),
                          method="PUT", times=None)
    with pytest.raises(errors.Conflict, match="the object has been modified"):
        await kube.update_scale(target, namespace=namespace, name="web", scale=scale, replicas=4)
    assert [r.method for r in fault_proxy.requests_to("/scale$")] == ["GET"] + ["PUT", "GET"] * 5
    assert len(sleeps.delays) == 4
    assert all(0.010 <= d <= 0.011 for d in sleeps.delays)


async def test_non_conflict_update_error_is_not_retried_as_a_conflict(
        control_plane: ControlPlane, fault_proxy: FaultProxy, namespace: str,
        kube: KubeClient) -> None:
    await create_deployment(control_plane, namespace, replicas=3)
    target = await kube.resolve_scale_target(ScaleTargetRef("apps/v1", "Deployment", "web"))
    scale = await kube.get_scale(target, namespace=namespace, name="web")
    with pytest.raises(errors.Invalid):
        await kube.update_scale(target, namespace=namespace, name="web", scale=scale, replicas=-1)
    assert [r.method for r in fault_proxy.requests_to("/scale$")] == ["GET", "PUT", "GET"]


# --- transient failures -------------------------------------------------------------------------


async def test_429_is_retried_after_exactly_retry_after(
        control_plane: ControlPlane, fault_proxy: FaultProxy, namespace: str,
        kube: KubeClient, sleeps: Sleeps, registry: CollectorRegistry) -> None:
    await create_deployment(control_plane, namespace, replicas=3)
    target = await kube.resolve_scale_target(ScaleTargetRef("apps/v1", "Deployment", "web"))
    fault_proxy.add_fault("/scale$", TooManyRequests(retry_after=2))
    scale = await kube.get_scale(target, namespace=namespace, name="web")
    assert scale.spec_replicas == 3
    assert sleeps.delays == [2.0]
    labels = {"operation": "get_scale", "verb": "GET", "resource": "deployments.apps/scale"}
    assert registry.get_sample_value("metricscale_autoscaler_api_request_duration_seconds_count",
                                     {**labels, "code": "429"}) == 1
    assert registry.get_sample_value("metricscale_autoscaler_api_request_duration_seconds_count",
                                     {**labels, "code": "200"}) == 1


async def test_server_errors_back_off_then_surface(
        control_plane: ControlPlane, fault_proxy: FaultProxy, namespace: str,
        http: RecordingHTTP, sleeps: Sleeps) -> None:
    await create_deployment(control_plane, namespace, replicas=3)
    kube = KubeClient(http, registry=CollectorRegistry(), reporting_instance="a",
                      retry=RetryPolicy(attempts=3, initial=0.1, cap=1.0), sleep=sleeps,
                      jitter=lambda: 1.0)
    target = await kube.resolve_scale_target(ScaleTargetRef("apps/v1", "Deployment", "web"))
    fault_proxy.add_fault("/scale$", ServerError(
        code=500, message="Internal error occurred: injected fault"), times=None)
    with pytest.raises(errors.ServerError, match="Internal error occurred: injected fault"):
        await kube.get_scale(target, namespace=namespace, name="web")
    assert sleeps.delays == [pytest.approx(0.1), pytest.approx(0.2)]
    assert len(fault_proxy.requests_to("/scale$")) == 3


async def test_dropped_connection_is_retried(
        control_plane: ControlPlane, fault_proxy: FaultProxy, namespace: str,
        kube: KubeClient, sleeps: Sleeps) -> None:
    await create_deployment(control_plane, namespace, replicas=3)
    target = await kube.resolve_scale_target(ScaleTargetRef("apps/v1", "Deployment", "web"))
    # Two drops: aiohttp itself retries an idempotent request once on a reused connection.
    fault_proxy.add_fault("/scale$", DropConnection(), times=2)
    scale = await kube.get_scale(target, namespace=namespace, name="web")
    assert scale.spec_replicas == 3
    assert sleeps.delays


async def test_forbidden_is_not_retried(control_plane: ControlPlane, fault_proxy: FaultProxy,
                                        namespace: str, sleeps: Sleeps) -> None:
    # The account may read deployments (and, as every authenticated user, discovery), not
    # their scale subresource.
    control_plane.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                         "metadata": {"name": "deployments-reader", "namespace": namespace},
                         "rules": [{"apiGroups": ["apps"], "resources": ["deployments"],
                                    "verbs": ["get", "list", "watch"]}]})
    control_plane.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                         "metadata": {"name": "deployments-reader", "namespace": namespace},
                         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                     "name": "deployments-reader"},
                         "subjects": [{"kind": "ServiceAccount", "name": "autoscaler",
                                       "namespace": namespace}]})
    token = control_plane.service_account_token(namespace, "autoscaler")
    configuration = control_plane.api_client_configuration(token=token,
                                                           server=fault_proxy.server)
    async with open_kube_http(configuration) as http:
        kube = KubeClient(http, registry=CollectorRegistry(), reporting_instance="a",
                          sleep=sleeps)
        target = await kube.resolve_scale_target(ScaleTargetRef("apps/v1", "Deployment", "web"))
        with pytest.raises(errors.Forbidden) as caught:
            await kube.get_scale(target, namespace=namespace, name="web")
    assert str(caught.value).startswith(
        f'deployments.apps "web" is forbidden: User "system:serviceaccount:{namespace}:'
        'autoscaler" cannot get resource "deployments/scale"')
    assert sleeps.delays == []
    assert [r.status for r in fault_proxy.requests_to("/scale$")] == [403]


# --- status ----------------------------------------------------------------------------------


def web_autoscaler(namespace: str) -> dict[str, Any]:
    return {"apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
            "metadata": {"name": "web", "namespace": namespace},
            # The shipped CRD requires a scaleTargetRef (the fake's schemaless CRD did not).
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": "web"},
                     "maxReplicas": 10}}


@pytest.mark.usefixtures("autoscaler_crd")
async def test_autoscaler_status_is_replaced_through_the_status_subresource(
        control_plane: ControlPlane, fault_proxy: FaultProxy, namespace: str,
        http: RecordingHTTP, kube: KubeClient) -> None:
    path = f"{AUTOSCALERS.format(namespace=namespace)}/web"
    control_plane.request("POST", AUTOSCALERS.format(namespace=namespace),
                          web_autoscaler(namespace))
    old_status = {"currentReplicas": 3, "desiredReplicas": 3,
                  "lastScaleTime": "2024-05-01T11:00:00Z",
                  "conditions": [{"type": "AbleToScale", "status": "True"}]}
    # The status subresource drops a created object's status: it is written through /status.
    control_plane.request("PATCH", f"{path}/status", {"status": old_status},
                          content_type=MERGE_PATCH)
    new_status = {"currentReplicas": 3, "desiredReplicas": 5,
                  "conditions": [{"type": "AbleToScale", "status": "False"}]}
    read, written = await write_on_what_was_read(
        lambda: dict(control_plane.get(path)),
        lambda current: kube.write_autoscaler_status(
            namespace=namespace, name="web", status=new_status, previous=current["status"],
            resource_version=current["metadata"]["resourceVersion"]))
    assert written["status"] == new_status
    assert written["spec"] == read["spec"]
    assert written["spec"]["maxReplicas"] == 10
    patches = fault_proxy.requests_to("/autoscalers/web/status$", method="PATCH")
    assert {r.path for r in patches} == {
        f"/apis/metricscale.dev/v1alpha1/namespaces/{namespace}/autoscalers/web/status"}
    assert {c for v, p, c in http.content_types if v == "PATCH"} == {MERGE_PATCH}


@pytest.mark.usefixtures("autoscaler_crd")
async def test_status_write_with_a_stale_resource_version_is_a_conflict(
        control_plane: ControlPlane, namespace: str, kube: KubeClient) -> None:
    path = f"{AUTOSCALERS.format(namespace=namespace)}/web"
    control_plane.request("POST", AUTOSCALERS.format(namespace=namespace),
                          web_autoscaler(namespace))
    read, _ = await write_on_what_was_read(
        lambda: dict(control_plane.get(path)),
        lambda current: kube.write_autoscaler_status(
            namespace=namespace, name="web", status={"desiredReplicas": 1}, previous={},
            resource_version=current["metadata"]["resourceVersion"]))
    with pytest.raises(errors.Conflict):
        await kube.write_autoscaler_status(
            namespace=namespace, name="web", status={"desiredReplicas": 2}, previous={},
            resource_version=read["metadata"]["resourceVersion"])


def hpa(name: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": name},
                     "minReplicas": 1, "maxReplicas": 10,
                     "metrics": [{"type": "Resource", "resource": {
                         "name": "cpu", "target": {"type": "Utilization",
                                                   "averageUtilization": 80}}}]}}


HPA_STATUS = {"currentReplicas": 2, "desiredReplicas": 2, "lastScaleTime": "2024-05-01T11:00:00Z"}


def create_hpa(cluster: ControlPlane, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    """Creates the HPA and writes its status (a create drops it), as the HPA controller would."""
    collection = HPAS.format(namespace=namespace)
    cluster.request("POST", collection, body)
    created: dict[str, Any] = cluster.request(
        "PATCH", f"{collection}/{body['metadata']['name']}/status", {"status": HPA_STATUS},
        content_type=MERGE_PATCH)
    return created


async def test_hpa_status_is_replaced_through_the_status_subresource(
        control_plane: ControlPlane, fault_proxy: FaultProxy, namespace: str,
        kube: KubeClient) -> None:
    create_hpa(control_plane, namespace, hpa("web", namespace))
    path = f"{HPAS.format(namespace=namespace)}/web"
    new_status = {"currentReplicas": 2, "desiredReplicas": 4,
                  "conditions": [{"type": "AbleToScale", "status": "True",
                                  "reason": "SucceededRescale",
                                  "message": "the HPA controller was able to update the target "
                                             "scale to 4",
                                  "lastTransitionTime": "2024-05-01T12:00:21Z"}]}
    _, written = await write_on_what_was_read(
        lambda: dict(control_plane.get(path)),
        lambda current: kube.write_hpa_status(
            namespace=namespace, name="web", status=new_status, previous=current["status"],
            resource_version=current["metadata"]["resourceVersion"]))
    # autoscaling/v2 serializes an empty currentMetrics as null (not omitempty upstream).
    assert written["status"] == {**new_status, "currentMetrics": None}
    assert fault_proxy.requests_to("horizontalpodautoscalers/web/status$", method="PATCH")


async def test_hpa_annotations_are_merge_patched_leaving_the_others_and_the_spec(
        control_plane: ControlPlane, fault_proxy: FaultProxy, namespace: str,
        http: RecordingHTTP, kube: KubeClient) -> None:
    body = hpa("web", namespace)
    body["metadata"]["annotations"] = {"team": "shop", "stale": "x"}
    created = create_hpa(control_plane, namespace, body)
    patched = await kube.patch_hpa_annotations(
        namespace=namespace, name="web",
        annotations={"metricscale.dev/history": '{"recommendations":[]}', "stale": None})
    assert patched["metadata"]["annotations"] == {
        "team": "shop", "metricscale.dev/history": '{"recommendations":[]}'}
    stored = control_plane.get(f"{HPAS.format(namespace=namespace)}/web")
    assert stored["metadata"]["annotations"] == patched["metadata"]["annotations"]
    assert stored["spec"] == patched["spec"] == created["spec"]
    # What the patch set, as the server tracks it: the one annotation, nothing else (the status
    # is the HPA controller's to change meanwhile, so it is not compared).
    [ours] = [m for m in patched["metadata"]["managedFields"] if m["manager"] == "metricscale"]
    assert (ours["operation"], ours.get("subresource")) == ("Update", None)
    assert ours["fieldsV1"] == {"f:metadata": {"f:annotations": {
        "f:metricscale.dev/history": {}}}}
    (request,) = fault_proxy.requests_to("horizontalpodautoscalers/web$", method="PATCH")
    assert request.status == 200
    assert [c for v, p, c in http.content_types if v == "PATCH"] == [MERGE_PATCH]


async def test_hpa_annotations_of_a_missing_hpa_are_not_found(namespace: str,
                                                               kube: KubeClient) -> None:
    with pytest.raises(errors.NotFound):
        await kube.patch_hpa_annotations(namespace=namespace, name="gone",
                                         annotations={"a": "b"})


# --- events ----------------------------------------------------------------------------------


def our_events(cluster: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    """The namespace's Events of the client under test (controllers may post their own)."""
    items: list[dict[str, Any]] = cluster.get(EVENTS.format(namespace=namespace))["items"]
    return [e for e in items if e.get("reportingController") == "metricscale.dev/autoscaler"]


async def test_event_is_stored_with_six_digit_micro_time(control_plane: ControlPlane,
                                                        namespace: str,
                                                        kube: KubeClient) -> None:
    regarding = ObjectReference(api_version="metricscale.dev/v1alpha1", kind="Autoscaler",
                                namespace=namespace, name="web", uid="uid-1")
    accepted = await kube.create_event(regarding=regarding, event_type="Normal",
                                       reason="SuccessfulRescale",
                                       note="New size: 4; reason: pods metric qps above target",
                                       now=NOW)
    assert accepted
    [event] = our_events(control_plane, namespace)
    assert event["eventTime"] == "2024-05-01T12:00:21.000000Z"
    assert MICRO.match(event["eventTime"])
    assert event["reportingController"] == "metricscale.dev/autoscaler"
    assert event["reportingInstance"] == "autoscaler-0"
    assert (event["reason"], event["type"], event["action"]) == ("SuccessfulRescale", "Normal",
                                                                 "Scale")
    assert event["note"] == "New size: 4; reason: pods metric qps above target"
    assert event["regarding"]["name"] == "web" and event["regarding"]["uid"] == "uid-1"


async def test_failed_event_is_swallowed_and_not_retried(fault_proxy: FaultProxy, namespace: str,
                                                         kube: KubeClient,
                                                         sleeps: Sleeps) -> None:
    fault_proxy.add_fault("/events$", ServerError(code=503), times=None)
    regarding = ObjectReference(api_version="metricscale.dev/v1alpha1", kind="Autoscaler",
                                namespace=namespace, name="web")
    assert await kube.create_event(regarding=regarding, event_type="Warning",
                                   reason="FailedGetScale", note="x", now=NOW) is False
    assert len(fault_proxy.requests_to("/events$", method="POST")) == 1
    assert sleeps.delays == []


async def test_events_of_one_reconcile_share_its_time_and_all_are_stored(
        control_plane: ControlPlane, namespace: str, kube: KubeClient) -> None:
    regarding = ObjectReference(api_version="metricscale.dev/v1alpha1", kind="Autoscaler",
                                namespace=namespace, name="web", uid="uid-1")
    for reason in ("FailedGetPodsMetric", "FailedComputeMetricsReplicas", "FailedUpdateStatus"):
        assert await kube.create_event(regarding=regarding, event_type="Warning", reason=reason,
                                       note="x", now=NOW)
    events = our_events(control_plane, namespace)
    assert sorted(e["reason"] for e in events) == [
        "FailedComputeMetricsReplicas", "FailedGetPodsMetric", "FailedUpdateStatus"]
    assert {e["eventTime"] for e in events} == {"2024-05-01T12:00:21.000000Z"}
    nanos = int(NOW.timestamp()) * 10**9
    assert sorted(e["metadata"]["name"] for e in events) == [
        f"web.{nanos + i:x}" for i in range(3)]  # client-go's scheme, made unique


# Found on the real server (the fake took it): the fallback's generateName was "<name>.", which
# kube-apiserver refuses with 422 (only a trailing "-" is allowed), and the event was lost.
async def test_an_event_name_taken_by_another_process_falls_back_to_a_generated_one(
        control_plane: ControlPlane, fault_proxy: FaultProxy, namespace: str,
        kube: KubeClient) -> None:
    nanos = int(NOW.timestamp()) * 10**9
    control_plane.request("POST", EVENTS.format(namespace=namespace), {
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": f"web.{nanos:x}", "namespace": namespace},
        "eventTime": "2024-05-01T12:00:21.000000Z",
        "reportingController": "metricscale.dev/autoscaler",
        "reportingInstance": "old-replica", "action": "Scale", "reason": "SuccessfulRescale",
        "type": "Normal", "regarding": {"kind": "Autoscaler", "name": "web",
                                        "namespace": namespace}})
    regarding = ObjectReference(api_version="metricscale.dev/v1alpha1", kind="Autoscaler",
                                namespace=namespace, name="web")
    assert await kube.create_event(regarding=regarding, event_type="Normal",
                                   reason="SuccessfulRescale", note="x", now=NOW)
    names = sorted(e["metadata"]["name"] for e in our_events(control_plane, namespace))
    assert len(names) == 2 and names[0] != names[1]
    assert sorted(name.startswith("web-") for name in names) == [False, True]
    assert [r.status for r in fault_proxy.requests_to("/events$", method="POST")] == [409, 201]


def web_reference(namespace: str) -> ObjectReference:
    return ObjectReference(api_version="metricscale.dev/v1alpha1", kind="Autoscaler",
                           namespace=namespace, name="web", uid="uid-1")


async def test_a_repeated_event_is_one_event_whose_series_counts_the_repeats(
        control_plane: ControlPlane, fault_proxy: FaultProxy, namespace: str,
        kube: KubeClient) -> None:
    """A failure at every sync (15 s apart) is one Event, as upstream's HPA controller folds
    repeats, not an Event a sync; kube-apiserver takes the series as client-go writes it."""
    regarding = web_reference(namespace)
    for seconds in (0, 15, 30):
        assert await kube.create_event(regarding=regarding, event_type="Warning",
                                       reason="FailedGetPodsMetric", note="no metric qps",
                                       now=NOW + timedelta(seconds=seconds))
    [event] = our_events(control_plane, namespace)
    assert event["eventTime"] == "2024-05-01T12:00:21.000000Z"  # the first occurrence
    assert event["series"] == {"count": 3, "lastObservedTime": "2024-05-01T12:00:51.000000Z"}
    assert [r.method for r in fault_proxy.requests_to("/events(/|$)")] == \
        ["POST", "PATCH", "PATCH"]
    # kubectl reads the core/v1 Event it converts to (describe: "x3 over ...").
    [core] = control_plane.get(f"/api/v1/namespaces/{namespace}/events")["items"]
    assert core["series"]["count"] == 3


async def test_another_note_or_a_repeat_after_the_series_window_is_a_new_event(
        control_plane: ControlPlane, namespace: str, kube: KubeClient) -> None:
    regarding = web_reference(namespace)

    async def post(note: str, seconds: float) -> None:
        assert await kube.create_event(regarding=regarding, event_type="Warning",
                                       reason="FailedGetPodsMetric", note=note,
                                       now=NOW + timedelta(seconds=seconds))

    await post("no metric qps", 0)
    await post("no metric qps", 15)
    await post("no metric latency", 20)  # another message: an Event of its own
    await post("no metric qps", 15 + 6 * 60 + 1)  # silent for more than 6 minutes: a new one
    events = sorted(our_events(control_plane, namespace), key=lambda e: e["eventTime"])
    assert [(e["note"], (e.get("series") or {}).get("count")) for e in events] == [
        ("no metric qps", 2), ("no metric latency", None), ("no metric qps", None)]


async def test_a_series_whose_event_is_gone_starts_again_and_a_failed_count_is_not_lost(
        control_plane: ControlPlane, fault_proxy: FaultProxy, namespace: str,
        kube: KubeClient) -> None:
    regarding = web_reference(namespace)

    async def post(seconds: float) -> bool:
        return await kube.create_event(regarding=regarding, event_type="Warning",
                                       reason="FailedGetScale", note="x",
                                       now=NOW + timedelta(seconds=seconds))

    assert await post(0)
    [first] = our_events(control_plane, namespace)
    fault_proxy.add_fault("/events/", ServerError(code=503), method="PATCH")
    assert await post(15) is False  # not stored, not retried
    assert await post(30)  # counted now: 2 occurrences stored
    assert our_events(control_plane, namespace)[0]["series"]["count"] == 2
    control_plane.request(
        "DELETE", f"{EVENTS.format(namespace=namespace)}/{first['metadata']['name']}")
    assert await post(45)  # its Event deleted (or expired): a new Event
    [again] = our_events(control_plane, namespace)
    assert again["metadata"]["name"] != first["metadata"]["name"]
    assert "series" not in again or again["series"] is None

