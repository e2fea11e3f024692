"""The installed autoscaler's extensions on the real control plane, where the real API has a say:
`kubectl annotate` pauses and resumes it (the annotation change reaches the controller through a
real watch); the owner-based pod selection reads ownerReferences as the real API keeps them (a
Deployment's pods through kube-controller-manager's ReplicaSet, a Job's pod beside them); and a
metric whose API's APIService is deleted falls back, then recovers once it is registered again.

The controller logic behind each (when, and how often) is tested on the injected clock in
tests/autoscaler/test_controller_*.py; here, that the real objects and answers get there."""

from __future__ import annotations

import copy
from typing import Any

from testbed.controlplane import ControlPlane, Kubelet
from testbed.fakes.exporter import Exporter
from testbed.install import Installation
from testbed.load import Load
from tests.cluster.support import deployment, until

GROUP_VERSION = "metricscale.dev/v1alpha1"
EXTERNAL_APISERVICE = "v1beta1.external.metrics.k8s.io"
# Whole steps at once, no scale-down window: what the metrics want is what is written.
BEHAVIOR: dict[str, Any] = {
    "scaleUp": {"stabilizationWindowSeconds": 0,
                "policies": [{"type": "Pods", "value": 10, "periodSeconds": 1}]},
    "scaleDown": {"stabilizationWindowSeconds": 0,
                  "policies": [{"type": "Percent", "value": 100, "periodSeconds": 1}]},
}


def web_autoscaler(namespace: str, metric: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": GROUP_VERSION, "kind": "Autoscaler",
            "metadata": {"name": "web", "namespace": namespace},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": "web"},
                     "minReplicas": 1, "maxReplicas": 8, "behavior": BEHAVIOR,
                     "metrics": [metric], **spec}}


def pods_metric(name: str) -> dict[str, Any]:
    return {"type": "Pods", "pods": {"metric": {"name": name}, "target": {
        "type": "AverageValue", "averageValue": "10"}}}


class Web:
    """What the tests read of Deployment web and its Autoscaler."""

    def __init__(self, cluster: ControlPlane, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace

    def replicas(self) -> int:
        obj = self.cluster.get(f"/apis/apps/v1/namespaces/{self.namespace}/deployments/web")
        return int(obj["spec"]["replicas"])

    def status(self) -> dict[str, Any]:
        obj = self.cluster.get(f"/apis/{GROUP_VERSION}/namespaces/{self.namespace}/"
                               "autoscalers/web")
        return dict(obj.get("status") or {})

    def condition(self, kind: str) -> tuple[str, str]:
        for item in self.status().get("conditions") or []:
            if item.get("type") == kind:
                return item["status"], item["reason"]
        return "", ""

    def reasons(self) -> list[str]:
        events = self.cluster.get(f"/apis/events.k8s.io/v1/namespaces/{self.namespace}/events")
        return [e.get("reason", "") for e in events["items"]
                if (e.get("regarding") or {}).get("kind") == "Autoscaler"]


async def test_kubectl_annotate_pauses_and_resumes_the_autoscaler(
        installation: Installation, kubelet: Kubelet, exporter: Exporter,
        namespace: str) -> None:
    cluster = installation.cluster
    web = Web(cluster, namespace)
    cluster.apply(deployment(namespace, replicas=2))
    with Load(cluster, kubelet, namespace=namespace, selector={"app": "web"},
              exporter=exporter, metric="pause_requests", metric_total=20) as load:
        cluster.apply(web_autoscaler(namespace, pods_metric("pause_requests"), minReplicas=2))
        await until(lambda: web.condition("ScalingActive")[0] == "True"
                    and web.status().get("desiredReplicas") == 2, what="a first decision")
        cluster.kubectl("annotate", "msa", "web", "metricscale.dev/paused=true",
                        "-n", namespace)
        await until(lambda: web.condition("Paused") == ("True", "Paused"),
                    what="the Paused condition")
        load.set(metric_total=60)
        # A reconcile writes the scale before the status: a status that wants 6 while the
        # Deployment has 2 is a decision that was not written.
        await until(lambda: web.status().get("desiredReplicas") == 6, what="the paused decision")
        assert web.replicas() == 2
        cluster.kubectl("annotate", "msa", "web", "metricscale.dev/paused-", "-n", namespace)
        await until(lambda: web.replicas() == 6, what="the scale-up once resumed")
        await until(lambda: web.condition("Paused") == ("", "")
                    and "Resumed" in web.reasons(), what="the Resumed event")
    assert "Paused" in web.reasons()


async def test_a_jobs_pod_sharing_the_labels_is_left_out_by_owner_references(
        installation: Installation, kubelet: Kubelet, exporter: Exporter,
        namespace: str) -> None:
    cluster = installation.cluster
    web = Web(cluster, namespace)
    metric = "owners_requests"
    cluster.apply(deployment(namespace, replicas=2, labels={"role": "server"}))
    # A Job's pod with the same app label (the test bed runs no Job controller: the pod is
    # made here, owned by the Job as that controller would own it).
    job = cluster.apply({"apiVersion": "batch/v1", "kind": "Job",
                         "metadata": {"name": "migrate", "namespace": namespace},
                         "spec": {"suspend": True, "template": {
                             "metadata": {"labels": {"app": "web", "role": "batch"}},
                             "spec": {"restartPolicy": "Never", "containers": [{
                                 "name": "migrate", "image": "registry.invalid/migrate:1"}]}}}})
    cluster.apply({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "migrate-x", "namespace": namespace,
                                "labels": {"app": "web", "role": "batch"},
                                "ownerReferences": [{
                                    "apiVersion": "batch/v1", "kind": "Job", "name": "migrate",
                                    "uid": job["metadata"]["uid"], "controller": True,
                                    "blockOwnerDeletion": True}]},
                   "spec": {"restartPolicy": "Never", "containers": [{
                       "name": "migrate", "image": "registry.invalid/migrate:1"}]}})
    with Load(cluster, kubelet, namespace=namespace, selector={"role": "server"},
              exporter=exporter, metric=metric, metric_total=20):
        def job_pod_running() -> bool:
            pod = cluster.get(f"/api/v1/namespaces/{namespace}/pods/migrate-x")
            return bool((pod.get("status") or {}).get("phase") == "Running")

        await until(job_pod_running, what="the Job's pod running")
        # Busy: counted, (10 + 10 + 70) / 3 = 30 a pod, which would be 6 pods.
        exporter.set(metric, {"namespace": namespace, "pod": "migrate-x"}, 70, type="gauge")
        served = (f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/pods/*/{metric}"
                  "?labelSelector=app%3Dweb")

        def served_pods() -> int:
            answer = cluster.kubectl("get", "--raw", served, check=False)
            return answer.stdout.count('"describedObject"') if answer.returncode == 0 else 0

        await until(lambda: served_pods() == 3, what="the metric of all 3 pods served")
        cluster.apply(web_autoscaler(namespace, pods_metric(metric),
                                     podSelectionStrategy="OwnerReferences"))
        await until(lambda: web.status().get("ignoredPods") == 1, what="the Job's pod left out")
        status = web.status()
        assert status["desiredReplicas"] == 2, status
        assert web.replicas() == 2


async def test_a_deleted_external_metrics_apiservice_falls_back_until_registered_again(
        installation: Installation, exporter: Exporter, namespace: str) -> None:
    cluster = installation.cluster
    web = Web(cluster, namespace)
    path = f"/apis/apiregistration.k8s.io/v1/apiservices/{EXTERNAL_APISERVICE}"
    saved = copy.deepcopy(cluster.get(path))
    for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields", "generation"):
        saved["metadata"].pop(key, None)
    saved.pop("status", None)
    # 30 messages at 10 a pod: 3 pods.
    exporter.set("queue_depth", {"namespace": namespace, "queue": "orders"}, 30, type="gauge")
    cluster.apply(deployment(namespace, replicas=3))
    cluster.apply(web_autoscaler(namespace, {"type": "External", "external": {
        "metric": {"name": "queue_depth", "selector": {"matchLabels": {"queue": "orders"}}},
        "target": {"type": "AverageValue", "averageValue": "10"},
        "fallback": {"replicas": 5, "failureThreshold": 2}}}))
    await until(lambda: web.condition("ScalingActive")[0] == "True"
                and web.status().get("desiredReplicas") == 3, what="a first decision")
    try:
        cluster.kubectl("delete", "apiservice", EXTERNAL_APISERVICE)
        await until(lambda: web.replicas() == 5, what="the fallback size")
        await until(lambda: web.condition("Fallback") == ("True", "FallbackActive"),
                    what="the Fallback condition")
        assert "FallbackActive" in web.reasons()
    finally:  # registered again as the installation registered it, whatever happened
        listed = cluster.get("/apis/apiregistration.k8s.io/v1/apiservices")["items"]
        if EXTERNAL_APISERVICE not in {item["metadata"]["name"] for item in listed}:
            cluster.request("POST", "/apis/apiregistration.k8s.io/v1/apiservices", saved)
        cluster.wait_apiservice_available("external.metrics.k8s.io", "v1beta1")
    await until(lambda: web.replicas() == 3, what="the metric's own size again")
    await until(lambda: web.condition("Fallback") == ("", "")
                and "FallbackEnded" in web.reasons(), what="the fallback ended")
