"""Builders of realistic objects to seed the fake with (pods, deployments, CRDs, APIServices).

Pods look as the kubelet reports them, deployments as their controller leaves them.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from testbed.fakes.kube_schema import format_time
from testbed.fakes.kube_strategy import qos_class

JSONDict = dict[str, Any]

__all__ = ["Container", "apiservice", "crd", "deployment", "namespace", "pod"]


@dataclass(frozen=True)
class Container:
    name: str = "app"
    image: str = "registry.k8s.io/pause:3.10"
    cpu_request: str | None = "100m"
    memory_request: str | None = None
    cpu_limit: str | None = None
    memory_limit: str | None = None
    ports: Sequence[int] = field(default=())

    def spec(self) -> JSONDict:
        resources: JSONDict = {}
        requests = {k: v for k, v in (("cpu", self.cpu_request),
                                      ("memory", self.memory_request)) if v is not None}
        limits = {k: v for k, v in (("cpu", self.cpu_limit), ("memory", self.memory_limit))
                  if v is not None}
        if requests:
            resources["requests"] = requests
        if limits:
            resources["limits"] = limits
        out: JSONDict = {"name": self.name, "image": self.image, "resources": resources}
        if self.ports:
            out["ports"] = [{"containerPort": p, "protocol": "TCP"} for p in self.ports]
        return out


def namespace(name: str, *, labels: Mapping[str, str] | None = None) -> JSONDict:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {**(labels or {}),
                                                  "kubernetes.io/metadata.name": name}},
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}


def pod(name: str, *, namespace: str, now: datetime, labels: Mapping[str, str] | None = None,
        containers: Sequence[Container] = (Container(),), phase: str = "Running",
        ready: bool = True, node_name: str = "node-1", pod_ip: str = "10.244.0.10",
        started: datetime | None = None, ready_since: datetime | None = None,
        owner: Mapping[str, str] | None = None) -> JSONDict:
    """A pod as kubelet reports it: phase, conditions with lastTransitionTime, startTime."""
    started = started or now - timedelta(minutes=5)
    ready_since = ready_since or started + timedelta(seconds=5)
    is_ready = ready and phase == "Running"
    scheduled = format_time(started - timedelta(seconds=1))

    def condition(kind: str, status: bool, since: datetime | str) -> JSONDict:
        when = since if isinstance(since, str) else format_time(since)
        return {"type": kind, "status": "True" if status else "False",
                "lastProbeTime": None, "lastTransitionTime": when}

    statuses = []
    for container in containers:
        state: JSONDict
        if phase == "Running":
            state = {"running": {"startedAt": format_time(started)}}
        elif phase in ("Succeeded", "Failed"):
            state = {"terminated": {"exitCode": 0 if phase == "Succeeded" else 1,
                                    "reason": "Completed" if phase == "Succeeded" else "Error",
                                    "startedAt": format_time(started),
                                    "finishedAt": format_time(now)}}
        else:
            state = {"waiting": {"reason": "ContainerCreating"}}
        statuses.append({"name": container.name, "image": container.image,
                         "imageID": "", "containerID": f"containerd://{name}-{container.name}",
                         "ready": is_ready, "restartCount": 0, "started": phase == "Running",
                         "state": state})
    metadata: JSONDict = {"name": name, "namespace": namespace, "labels": dict(labels or {})}
    if owner:
        metadata["ownerReferences"] = [{"apiVersion": owner.get("apiVersion", "apps/v1"),
                                        "kind": owner["kind"], "name": owner["name"],
                                        "uid": owner.get("uid", ""), "controller": True,
                                        "blockOwnerDeletion": True}]
    spec: JSONDict = {"containers": [c.spec() for c in containers], "nodeName": node_name}
    status: JSONDict = {"phase": phase, "hostIP": "172.18.0.2", "podIP": pod_ip,
                        "podIPs": [{"ip": pod_ip}], "qosClass": qos_class(spec),
                        "startTime": format_time(started), "containerStatuses": statuses}
    if phase != "Pending":
        status["conditions"] = [
            condition("PodReadyToStartContainers", phase == "Running", started),
            condition("Initialized", True, started),
            condition("Ready", is_ready, ready_since if is_ready else now),
            condition("ContainersReady", is_ready, ready_since if is_ready else now),
            condition("PodScheduled", True, scheduled),
        ]
    else:
        status["conditions"] = [condition("PodScheduled", True, scheduled)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec,
            "status": status}


def deployment(name: str, *, namespace: str, replicas: int, now: datetime,
               labels: Mapping[str, str] | None = None,
               containers: Sequence[Container] = (Container(),),
               ready_replicas: int | None = None, status_replicas: int | None = None
               ) -> JSONDict:
    """A deployment as its controller leaves it once settled (status, conditions and
    observedGeneration)."""
    labels = dict(labels or {"app": name})
    current = replicas if status_replicas is None else status_replicas
    ready = current if ready_replicas is None else ready_replicas
    when = format_time(now)
    available = ready >= replicas
    conditions = [
        {"type": "Available", "status": "True" if available else "False",
         "lastUpdateTime": when, "lastTransitionTime": when,
         "reason": "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
         "message": "Deployment has minimum availability." if available
         else "Deployment does not have minimum availability."},
        {"type": "Progressing", "status": "True", "lastUpdateTime": when,
         "lastTransitionTime": when, "reason": "NewReplicaSetAvailable",
         "message": f'ReplicaSet "{name}-5d4f8c7b9" has successfully progressed.'},
    ]
    status: JSONDict = {"observedGeneration": 1, "replicas": current, "updatedReplicas": current,
                        "readyReplicas": ready, "availableReplicas": ready,
                        "conditions": conditions}
    if current - ready > 0:
        status["unavailableReplicas"] = current - ready
    for key in ("replicas", "updatedReplicas", "readyReplicas", "availableReplicas"):
        if status[key] == 0:
            del status[key]  # omitempty, as the Go type serializes zeroes
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
            "spec": {"replicas": replicas, "selector": {"matchLabels": dict(labels)},
                     "template": {"metadata": {"labels": dict(labels)},
                                  "spec": {"containers": [c.spec() for c in containers]}}},
            "status": status}


def crd(*, group: str, kind: str, plural: str, versions: Sequence[str] = ("v1",),
        scope: str = "Namespaced", schema: Mapping[str, Any] | None = None,
        status_subresource: bool = True, scale: Mapping[str, str] | None = None,
        short_names: Sequence[str] = ()) -> JSONDict:
    """A CustomResourceDefinition; the first version is the storage version."""
    openapi = dict(schema) if schema is not None else {
        "type": "object", "x-kubernetes-preserve-unknown-fields": True}
    subresources: JSONDict = {}
    if status_subresource:
        subresources["status"] = {}
    if scale is not None:
        subresources["scale"] = dict(scale)
    names: JSONDict = {"kind": kind, "plural": plural, "singular": kind.lower(),
                       "listKind": f"{kind}List"}
    if short_names:
        names["shortNames"] = list(short_names)
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {"group": group, "scope": scope, "names": names,
                     "versions": [{"name": v, "served": True, "storage": i == 0,
                                   "schema": {"openAPIV3Schema": openapi},
                                   **({"subresources": subresources} if subresources else {})}
                                  for i, v in enumerate(versions)]}}


def apiservice(*, group: str, version: str, service_namespace: str, service_name: str,
               port: int = 443, ca_bundle: bytes | None = None, insecure: bool = False,
               group_priority: int = 100, version_priority: int = 100) -> JSONDict:
    spec: JSONDict = {"group": group, "version": version,
                      "service": {"namespace": service_namespace, "name": service_name,
                                  "port": port},
                      "groupPriorityMinimum": group_priority, "versionPriority": version_priority}
    if ca_bundle is not None:
        spec["caBundle"] = base64.b64encode(ca_bundle).decode()
    if insecure:
        spec["insecureSkipTLSVerify"] = True
    return {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": f"{version}.{group}"}, "spec": spec}
