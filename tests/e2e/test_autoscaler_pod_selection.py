"""KEP-5325's podSelectionStrategy against the fake API: with OwnerReferences a Job's pods that
share the Deployment's labels and a rollout's not-Ready surge pods no longer move the size;
with LabelSelector (upstream) they do."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_autoscaler_support import (
    GROUP,
    NS,
    PLURAL,
    VERSION,
    autoscaler,
    controller,
    holds,
    install_crd,
    metrics_backend,
    pods_metric,
    replicas_of,
    status_of,
    until,
)
from tests.fakes.kube_api import FakeKubeAPI

LABELS = {"app": "web"}


def _replica_set(fake: FakeKubeAPI, name: str, *, revision: int, replicas: int) -> None:
    deployment = fake.store.get("apps", "v1", "deployments", "web", namespace=NS)
    owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
             "uid": deployment["metadata"].get("uid", ""), "controller": True}
    fake.create("apps", "v1", "replicasets", {
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": NS, "labels": dict(LABELS),
                     "annotations": {"deployment.kubernetes.io/revision": str(revision)},
                     "ownerReferences": [owner]},
        "spec": {"replicas": replicas, "selector": {"matchLabels": dict(LABELS)},
                 "template": deployment["spec"]["template"]}})


def _pod(fake: FakeKubeAPI, name: str, *, kind: str, owner: str, ready: bool = True) -> None:
    fake.create_pod(name, namespace=NS, labels=LABELS, ready=ready,
                    owner={"apiVersion": "batch/v1" if kind == "Job" else "apps/v1",
                           "kind": kind, "name": owner})


def _web(fake: FakeKubeAPI) -> None:
    """Deployment web at 2 replicas: ReplicaSet web-1 and its two ready pods."""
    fake.create_deployment("web", namespace=NS, replicas=2, labels=LABELS)
    _replica_set(fake, "web-1", revision=1, replicas=2)
    for pod in ("web-1-a", "web-1-b"):
        _pod(fake, pod, kind="ReplicaSet", owner="web-1")


def _autoscaler(strategy: str) -> dict[str, Any]:
    obj = autoscaler("web", target="web", metrics=[pods_metric("rps", "10")])
    obj["spec"]["podSelectionStrategy"] = strategy
    return obj


@pytest.mark.parametrize(("strategy", "replicas", "ignored"),
                         [("OwnerReferences", 2, 1), ("LabelSelector", 9, None)])
async def test_a_jobs_pods_sharing_the_labels_count_only_with_the_label_selector(
        fake_kube: FakeKubeAPI, tmp_path: Path, strategy: str, replicas: int,
        ignored: int | None) -> None:
    install_crd(fake_kube)
    _web(fake_kube)
    _pod(fake_kube, "migrate-x", kind="Job", owner="migrate")
    async with metrics_backend(fake_kube, tmp_path / "metrics") as backend:
        # web's pods sit at the target; the Job's pod is busy: (10 + 10 + 70) / 3 = 30.
        backend.publisher("rps")({"web-1-a": Decimal(10), "web-1-b": Decimal(10),
                                  "migrate-x": Decimal(70)})
        fake_kube.create(GROUP, VERSION, PLURAL, _autoscaler(strategy))
        async with controller(fake_kube):
            await until(lambda: "currentMetrics" in status_of(fake_kube, "web"), within=15,
                        what="a first decision")
            if replicas == 2:
                await until(lambda: status_of(fake_kube, "web").get("ignoredPods") == ignored,
                            within=10, what=f"ignoredPods, have {status_of(fake_kube, 'web')}")
                await holds(lambda: replicas_of(fake_kube, "web") == 2, for_seconds=1.0,
                            what="the Job's pod moved the size")
            else:
                await until(lambda: replicas_of(fake_kube, "web") == replicas, within=15,
                            what="the Job's pod counts with the label selector")
                assert "ignoredPods" not in status_of(fake_kube, "web")


async def test_steady_load_during_a_rollout_holds_the_size(fake_kube: FakeKubeAPI,
                                                           tmp_path: Path) -> None:
    install_crd(fake_kube)
    _web(fake_kube)
    async with metrics_backend(fake_kube, tmp_path / "metrics") as backend:
        publish = backend.publisher("rps")
        publish({"web-1-a": Decimal(10), "web-1-b": Decimal(10)})
        fake_kube.create(GROUP, VERSION, PLURAL, _autoscaler("OwnerReferences"))
        async with controller(fake_kube):
            await until(lambda: status_of(fake_kube, "web").get("ignoredPods") == 0, within=15,
                        what=f"a first decision, have {status_of(fake_kube, 'web')}")
            # The rollout: ReplicaSet web-2 surges one pod, Running but not Ready yet, whose
            # warm-up spike would read as (10 + 10 + 70) / 3 = 30 against a target of 10.
            _replica_set(fake_kube, "web-2", revision=2, replicas=1)
            _pod(fake_kube, "web-2-a", kind="ReplicaSet", owner="web-2", ready=False)
            publish({"web-1-a": Decimal(10), "web-1-b": Decimal(10), "web-2-a": Decimal(70)})
            await until(lambda: status_of(fake_kube, "web").get("ignoredPods") == 1, within=10,
                        what=f"the surge pod left out, have {status_of(fake_kube, 'web')}")
            await holds(lambda: replicas_of(fake_kube, "web") == 2, for_seconds=1.0,
                        what="a not-Ready surge pod drove a scale-up")
