"""The real control plane as the adapter's tests use it: objects, the adapter's account, RBAC,
APIServices given back, and a fault proxy that also records the reviews the adapter sends.

Tests share the session's cluster (testbed.pytest_plugin): every namespace and cluster-scoped
name here carries a name of the module's own (`Names`), APIServices other tests may own are
given back as they were, and kube-system/extension-apiserver-authentication is restored after a
test changes it. Objects are created through the API with the admin's certificate, many at
once where a test needs thousands.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import ssl
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from testbed.aggregated import apiservice_given_back
from testbed.controlplane import ControlPlane, KubeError
from testbed.faultproxy import FaultAction, FaultProxy
from testbed.metricscale_adapter import ACCOUNT, adapter_rbac

__all__ = [
    "AUTH_CONFIGMAP_PATH",
    "GROUP_VERSIONS",
    "Names",
    "Objects",
    "RecordingProxy",
    "adapter_account",
    "apiservices_given_back",
    "authentication_configmap_restored",
    "grant_metrics_readers",
    "grant_paths",
    "node_manifest",
    "pod_manifest",
    "set_request_header_cas",
]

AUTH_CONFIGMAP_PATH = "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication"
GROUP_VERSIONS = (("custom.metrics.k8s.io", "v1beta1", 100),
                  ("custom.metrics.k8s.io", "v1beta2", 200),
                  ("external.metrics.k8s.io", "v1beta1", 100))
# No scheduler binds these pods (and so no kubelet runs them): they stay Pending unless a test
# sets their status as a kubelet would.
UNSCHEDULED = "metricscale-tests-unscheduled"
DAY = 24 * 3600
_SERIAL = itertools.count(1)
_CONCURRENCY = 32
# What makes names unique to a run: under pytest-xdist, the test run id all workers share.
_RUN = (os.environ.get("PYTEST_XDIST_TESTRUNUID", "")[:5].lower()
        or str(os.getpid() % 100000))


@dataclass(frozen=True)
class Names:
    """Names of one module's own in the shared cluster: `names.namespace("shop")` and
    `names.cluster("node-1")` are unique to the module and the run. Under pytest-xdist every
    worker must collect the same test ids, and some ids carry these names: the run's part is
    then xdist's test run id, which all the workers share, instead of the process id."""

    prefix: str

    @classmethod
    def unique(cls, stem: str) -> Names:
        return cls(f"{stem}-{_RUN}-{next(_SERIAL)}")

    def namespace(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def cluster(self, name: str) -> str:
        return f"{self.prefix}-{name}"


def pod_manifest(name: str, namespace: str, *, labels: Mapping[str, str] | None = None,
                 node: str | None = None, containers: Sequence[str] = ("app",),
                 annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A pod; bound to `node` when given, else never scheduled (it stays Pending)."""
    spec: dict[str, Any] = {
        "containers": [{"name": c, "image": "registry.invalid/metricscale-test"}
                       for c in containers],
        "terminationGracePeriodSeconds": 0}
    if node is not None:
        spec["nodeName"] = node
    else:
        spec["schedulerName"] = UNSCHEDULED
    metadata: dict[str, Any] = {"name": name, "namespace": namespace,
                                "labels": dict(labels or {})}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def node_manifest(name: str, *, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A Node no kubelet runs, unschedulable so that no pod lands on it."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": dict(labels or {})},
            "spec": {"unschedulable": True}}


def running_status(*, pod_ip: str = "10.244.0.10") -> dict[str, Any]:
    """What a kubelet writes for a pod whose containers run."""
    return {"phase": "Running", "podIP": pod_ip, "podIPs": [{"ip": pod_ip}],
            "conditions": [{"type": "Ready", "status": "True"}]}


def _collection(obj: Mapping[str, Any], plural: str | None) -> str:
    api_version = str(obj["apiVersion"])
    kind = str(obj["kind"])
    prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    namespace = (obj.get("metadata") or {}).get("namespace")
    if namespace:
        prefix += f"/namespaces/{namespace}"
    return f"{prefix}/{plural or kind.lower() + 's'}"


class Objects:
    """Async writes with the admin's certificate on one keep-alive session."""

    def __init__(self, cluster: ControlPlane) -> None:
        self.cluster = cluster
        context = ssl.create_default_context(cafile=str(cluster.ca_file))
        context.load_cert_chain(str(cluster.admin.cert), str(cluster.admin.key))
        self._context = context
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Objects:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._context, limit=_CONCURRENCY))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def _send(self, method: str, path: str, body: Any, *,
                    content_type: str = "application/json") -> Any:
        assert self._session is not None, "use `async with Objects(cluster)`"
        async with self._session.request(method, self.cluster.server + path,
                                         data=json.dumps(body),
                                         headers={"Content-Type": content_type,
                                                  "Accept": "application/json"}) as reply:
            answer = await reply.read()
            if reply.status >= 300:
                raise KubeError(reply.status, json.loads(answer) if answer else {})
            return json.loads(answer)

    async def create(self, *objects: Mapping[str, Any], plural: str | None = None) -> None:
        """POST every object to its collection, `_CONCURRENCY` at a time."""
        limit = asyncio.Semaphore(_CONCURRENCY)

        async def one(obj: Mapping[str, Any]) -> None:
            async with limit:
                await self._send("POST", _collection(obj, plural), dict(obj))

        await asyncio.gather(*(one(obj) for obj in objects))

    async def crd(self, *, group: str, kind: str, plural: str, scope: str) -> dict[str, Any]:
        """A CustomResourceDefinition (any fields kept), once kube-apiserver serves it."""
        crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
               "metadata": {"name": f"{plural}.{group}"},
               "spec": {"group": group, "scope": scope,
                        "names": {"kind": kind, "plural": plural,
                                  "singular": kind.lower(), "listKind": f"{kind}List"},
                        "versions": [{"name": "v1", "served": True, "storage": True,
                                      "schema": {"openAPIV3Schema": {
                                          "type": "object",
                                          "x-kubernetes-preserve-unknown-fields": True}}}]}}
        await self.create(crd)
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.{group}"
        while True:  # until Established (and so served): pytest-timeout bounds it
            assert self._session is not None
            async with self._session.get(self.cluster.server + path) as reply:
                conditions = (await reply.json()).get("status", {}).get("conditions") or []
            if any(c.get("type") == "Established" and c.get("status") == "True"
                   for c in conditions):
                return crd
            await asyncio.sleep(0.05)

    async def set_status(self, obj: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        """A merge patch of the object's status subresource (a kubelet's part for a pod)."""
        name = obj["metadata"]["name"]
        await self._send("PATCH", f"{_collection(obj, None)}/{name}/status",
                         {"status": dict(status)}, content_type="application/merge-patch+json")

    async def run(self, *pods: Mapping[str, Any]) -> None:
        """Create pods and mark them Running and Ready, as a kubelet would."""
        await self.create(*pods)
        await self.run_existing(*pods)

    async def run_existing(self, *pods: Mapping[str, Any]) -> None:
        """Mark created pods Running and Ready, as a kubelet would."""
        await asyncio.gather(*(self.set_status(pod, running_status(pod_ip=f"10.244.1.{i % 250}"))
                               for i, pod in enumerate(pods)))


# --------------------------------------------------------------------------------------------
# Accounts and RBAC


def adapter_account(cluster: ControlPlane, namespace: str, *,
                    extra_rules: Sequence[Mapping[str, Any]] = (),
                    server: str | None = None) -> Path:
    """The adapter's service account in `namespace` with its manifests' RBAC (and
    `extra_rules`, as the manifests say to add for other resources), as a token kubeconfig
    (for `server` instead of kube-apiserver: a fault proxy)."""
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    for obj in adapter_rbac(namespace):
        cluster.apply(obj)
    if extra_rules:
        name = f"metricscale-adapter-extra-{namespace}"
        cluster.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                       "metadata": {"name": name}, "rules": [dict(r) for r in extra_rules]})
        cluster.apply({"apiVersion": "rbac.authorization.k8s.io/v1",
                       "kind": "ClusterRoleBinding", "metadata": {"name": name},
                       "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                   "kind": "ClusterRole", "name": name},
                       "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT,
                                     "namespace": namespace}]})
    token = cluster.service_account_token(namespace, ACCOUNT, seconds=DAY)
    path = cluster.dir / f"kubeconfig-adapter-{namespace}-{next(_SERIAL)}"
    cluster.write_kubeconfig(f"adapter-{namespace}", token, path=path)
    if server is not None:
        path.write_text(path.read_text().replace(cluster.server, server))
    return path


def remove_adapter_account(cluster: ControlPlane, namespace: str) -> None:
    """The cluster-scoped objects of `adapter_account` (the namespace's go with it)."""
    for obj in adapter_rbac(namespace):
        if obj["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            cluster.delete(obj)
    for kind in ("ClusterRole", "ClusterRoleBinding"):
        cluster.delete({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
                        "metadata": {"name": f"metricscale-adapter-extra-{namespace}"}})


def grant_metrics_readers(cluster: ControlPlane, name: str, *, users: Sequence[str] = (),
                          groups: Sequence[str] = (),
                          verbs: Sequence[str] = ("get", "list")) -> None:
    """RBAC for `users` and `groups` to get and list every metric of the three metrics APIs
    (what the HPA's bootstrap role grants; `verbs` ["*"] is what prometheus-adapter's
    manifests grant), under ClusterRole and binding `name`."""
    cluster.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                   "metadata": {"name": name},
                   "rules": [{"apiGroups": ["custom.metrics.k8s.io", "external.metrics.k8s.io",
                                            "metrics.k8s.io"],
                              "resources": ["*"], "verbs": list(verbs)}]})
    subjects = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
                for user in users]
    subjects += [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}
                 for group in groups]
    cluster.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": name},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                               "name": name},
                   "subjects": subjects})


def grant_paths(cluster: ControlPlane, name: str, *, users: Sequence[str],
                paths: Sequence[str]) -> None:
    """RBAC for `users` to GET non-resource `paths` (e.g. /metrics), as ClusterRole and
    binding `name`."""
    cluster.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                   "metadata": {"name": name},
                   "rules": [{"nonResourceURLs": list(paths), "verbs": ["get"]}]})
    cluster.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": name},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                               "name": name},
                   "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                 "name": user} for user in users]})


def revoke_metrics_readers(cluster: ControlPlane, name: str) -> None:
    for kind in ("ClusterRoleBinding", "ClusterRole"):
        cluster.delete({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
                        "metadata": {"name": name}})


# --------------------------------------------------------------------------------------------
# Shared cluster state, given back


@contextlib.contextmanager
def apiservices_given_back(cluster: ControlPlane,
                           names: Sequence[str]) -> Iterator[None]:
    """Whatever a test does to these APIServices, each is given back as it was."""
    with contextlib.ExitStack() as stack:
        for name in names:
            stack.enter_context(apiservice_given_back(cluster, name))
        yield


@contextlib.contextmanager
def authentication_configmap_restored(cluster: ControlPlane) -> Iterator[dict[str, str]]:
    """kube-system/extension-apiserver-authentication's data as it was, written back after
    (kube-apiserver only ever adds its own CAs to it: what a test added would stay)."""
    saved = dict(cluster.get(AUTH_CONFIGMAP_PATH)["data"])
    try:
        yield saved
    finally:
        for _ in range(10):
            current = cluster.get(AUTH_CONFIGMAP_PATH)
            current["data"] = saved
            try:
                cluster.request("PUT", AUTH_CONFIGMAP_PATH, current)
                break
            except KubeError as error:
                if error.status != 409:
                    raise


def set_request_header_cas(cluster: ControlPlane, pems: Sequence[bytes]) -> None:
    """Replace the ConfigMap's front-proxy CA bundle (kube-apiserver adds its own back; a
    write of its in between is a conflict: read again and retry)."""
    for _ in range(10):
        current = cluster.get(AUTH_CONFIGMAP_PATH)
        current["data"]["requestheader-client-ca-file"] = b"".join(pems).decode()
        try:
            cluster.request("PUT", AUTH_CONFIGMAP_PATH, current)
            return
        except KubeError as error:
            if error.status != 409:
                raise
    raise AssertionError("the authentication ConfigMap kept changing under the test")


# --------------------------------------------------------------------------------------------
# The fault proxy, recording reviews


@dataclass(frozen=True)
class RecordedReview:
    kind: str  # "tokenreviews" or "subjectaccessreviews"
    body: dict[str, Any]


class RecordingProxy(FaultProxy):
    """testbed.faultproxy.FaultProxy that also keeps the body of every TokenReview and
    SubjectAccessReview it forwards or faults (what the adapter asked kube-apiserver)."""

    def __init__(self, cluster: ControlPlane) -> None:
        super().__init__(cluster)
        self.reviews: list[RecordedReview] = []

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        kind = request.path.rsplit("/", 1)[-1]
        if request.method == "POST" and kind in ("tokenreviews", "subjectaccessreviews"):
            body = await request.read()  # kept by aiohttp: forwarding reads it again
            with self._lock:
                self.reviews.append(RecordedReview(kind, json.loads(body)))
        return await super()._handle(request)

    def subject_access_reviews(self, user: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            found = [r.body for r in self.reviews if r.kind == "subjectaccessreviews"]
        if user is None:
            return found
        return [b for b in found if (b.get("spec") or {}).get("user") == user]

    def token_reviews(self, token: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            found = [r.body for r in self.reviews if r.kind == "tokenreviews"]
        return [b for b in found if token is None or b["spec"]["token"] == token]

    def add_review_fault(self, kind: str, action: FaultAction, *,
                         times: int | None = 1) -> Any:
        return self.add_fault(f"/{kind}$", action, method="POST", times=times)


@contextlib.asynccontextmanager
async def proxy_for(cluster: ControlPlane) -> AsyncIterator[RecordingProxy]:
    """A RecordingProxy for the block (started and stopped off the event loop)."""
    proxy = RecordingProxy(cluster)
    await asyncio.to_thread(proxy.start)
    try:
        yield proxy
    finally:
        await asyncio.to_thread(proxy.stop)


@dataclass
class Cleanup:
    """Cluster-scoped objects and namespaces a module made, deleted at its end."""

    cluster: ControlPlane
    objects: list[dict[str, Any]] = field(default_factory=list)

    def add(self, *objects: Mapping[str, Any]) -> None:
        self.objects.extend(dict(o) for o in objects)

    def run(self) -> None:
        for obj in reversed(self.objects):
            self.cluster.delete(obj)
        self.objects.clear()


class ModuleCluster:
    """The session's control plane as one module uses it: namespaces of its own (deleted at
    its end), the adapter's account, and whatever else it registered for cleanup."""

    def __init__(self, control_plane: ControlPlane, names: Names) -> None:
        self.control_plane = control_plane
        self.names = names
        self.cleanup = Cleanup(control_plane)
        self._kubeconfigs: dict[str, Path] = {}

    def namespace(self, name: str, *, labels: Mapping[str, str] | None = None) -> str:
        """The module's namespace `name` (its real name: `names.namespace(name)`), created."""
        real = self.names.namespace(name)
        obj = {"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": real, "labels": dict(labels or {})}}
        self.control_plane.apply(obj)
        self.cleanup.add(obj)
        return real

    def adapter_kubeconfig(self, *, extra_rules: Sequence[Mapping[str, Any]] = (),
                           server: str | None = None) -> Path:
        """The adapter's account (manifests' RBAC) in the module's namespace `adapter`."""
        namespace = self.namespace("adapter")
        key = json.dumps([list(extra_rules), server], sort_keys=True, default=str)
        if key not in self._kubeconfigs:
            self._kubeconfigs[key] = adapter_account(self.control_plane, namespace,
                                                     extra_rules=extra_rules, server=server)
        return self._kubeconfigs[key]

    def close(self) -> None:
        remove_adapter_account(self.control_plane, self.names.namespace("adapter"))
        self.cleanup.run()
