"""Shadow mode on the real control plane: native HPAs run by kube-controller-manager's own HPA
controller, `metricscale autoscaler --shadow` beside them (as its own ServiceAccount, with the
RBAC docs/shadow.md ships, every request through a recording proxy).

The twin-Deployment oracle again (tests/cluster/test_upstream_hpa_twins.py), with one workload
each: with the same flags and the same inputs, the shadow's size follows the HPA's step for
step (each step within a sync period) and every judged decision agrees; the shadow writes
nothing to the Deployments or the HPAs; explain shows what it decided. Given a different
tolerance, it differs, and says so in one Event.

No time bound here: each wait is on a condition, and pytest-timeout (900 s a test) is the guard;
what a wait is waiting for is printed whenever it changes, so a timeout shows where it stood.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from monitoring.dashboards import shadow_agreement
from testbed.binaries import CHECKOUT
from testbed.controlplane import ControlPlane, Kubelet
from testbed.fakes.exporter import Exporter
from testbed.fakes.prometheus import PrometheusServer
from testbed.faultproxy import FaultProxy
from testbed.install import DAY, NAMESPACE, Installation
from testbed.load import Load
from testbed.processes import Child, free_port
from testbed.watching import hpa_decisions
from tests.cluster.test_upstream_hpa_twins import (
    BEHAVIOR,
    ONE_AT_A_TIME,
    deployment,
    past_initial_window,
    served,
)
from tests.docs.blocks import blocks_of

SYNC_SECONDS = 5.0
# Besides the sync phases: a scrape (1 s) of the shadow, and a busy machine.
PIPELINE_SLACK = 4.0
SHADOW = "metricscale-shadow"  # its ServiceAccount, Lease and ConfigMap (docs/shadow.md)
EVENT_REASON = "ShadowDisagreement"


async def until(check: Callable[[], bool], *, what: str,
                state: Callable[[], str] = lambda: "",
                children: tuple[Child, ...] = ()) -> None:
    """Waits for `check` (pytest-timeout bounds it); prints `state` whenever it changes."""
    shown = None
    while True:
        for child in children:
            child.check_running()
        if check():
            return
        now = state()
        if now != shown:
            print(f"waiting for {what}: {now}", flush=True)
            shown = now
        await asyncio.sleep(0.25)


# ------------------------------------------------------------------------------ recorders


class Shadow:
    """`metricscale autoscaler --shadow` as the docs install it: its own ServiceAccount, every
    request through the fault proxy (which records them)."""

    def __init__(self, installation: Installation, proxy: FaultProxy, workdir: Path,
                 *args: str) -> None:
        cluster = installation.cluster
        token = cluster.service_account_token(NAMESPACE, SHADOW, seconds=DAY)
        kubeconfig = proxy.write_kubeconfig(SHADOW, token, path=workdir / "shadow.kubeconfig")
        self.port = free_port()
        self.child = Child("metricscale-shadow", [
            sys.executable, "-m", "metricscale", "autoscaler", "--shadow",
            f"--kubeconfig={kubeconfig}", f"--horizontal-pod-autoscaler-sync-period="
            f"{installation.sync_period}", f"--metrics-bind-address=127.0.0.1:{self.port}",
            f"--leader-elect-resource-namespace={NAMESPACE}", *args],
            log=workdir / "shadow.log", cwd=CHECKOUT,
            env={"POD_NAMESPACE": NAMESPACE, "POD_NAME": "metricscale-shadow-test"})

    def _get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}",
                                        timeout=10) as answer:
                return answer.status, answer.read().decode()
        except OSError:
            return 0, ""

    def ready(self) -> bool:
        return self._get("/readyz")[0] == 200 and self.value("metricscale_autoscaler_leader") == 1

    def samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        status, text = self._get("/metrics")
        if status != 200:
            return {}
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples().get((name, tuple(sorted(labels.items()))))

    def differences(self, namespace: str, hpa: str) -> list[str]:
        """The log's lines of the differences with HPA namespace/hpa."""
        try:
            text = self.child.log.read_text(errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines()
                if f" {namespace}/{hpa} " in line and "differs from the HPA" in line]

    def decisions(self, namespace: str, hpa: str) -> dict[str, float]:
        return {result: self.value("metricscale_shadow_decisions_total", namespace=namespace,
                                   horizontalpodautoscaler=hpa, result=result) or 0
                for result in ("agree", "differ", "warmup", "unjudged")}

    def stop(self) -> None:
        self.child.stop()


@pytest.fixture(scope="module")
def shadow_rbac(installation: Installation) -> None:
    """The ServiceAccount and RBAC of docs/shadow.md, applied as printed there."""
    block = next(b for b in blocks_of(CHECKOUT / "docs" / "shadow.md")
                 if b.options.get("file") == "shadow-rbac.yaml")
    for document in yaml.safe_load_all(block.text):
        if document is not None:
            installation.cluster.apply(document)


@pytest.fixture
def shadow_factory(installation: Installation, shadow_rbac: None, fault_proxy: FaultProxy,
                   prometheus: PrometheusServer, namespace: str,
                   tmp_path: Path) -> Iterator[Callable[..., Shadow]]:
    started: list[Shadow] = []

    def start(*args: str) -> Shadow:
        shadow = Shadow(installation, fault_proxy, tmp_path, f"--namespace={namespace}", *args)
        started.append(shadow)
        prometheus.add_target(f"127.0.0.1:{shadow.port}", job=f"shadow-{namespace}")
        return shadow

    try:
        yield start
    finally:
        for shadow in started:
            prometheus.remove_target(f"127.0.0.1:{shadow.port}")
            shadow.stop()  # SIGTERM releases the Lease: the next test's shadow takes it at once
            differences = [line for line in shadow.child.log.read_text().splitlines()
                           if "shadow: differs" in line or "shadow mode:" in line]
            print(f"--- {shadow.child.log}, its differences:", *differences,
                  f"--- and its end:\n{shadow.child.tail(30)}", sep="\n")


async def started(shadow: Shadow, prometheus: PrometheusServer, namespace: str) -> None:
    await until(shadow.ready, what="the shadow's caches filled and its Lease held",
                children=(shadow.child,))
    await until(lambda: any(s.value == 1 for s in prometheus.query(
        f'up{{job="shadow-{namespace}"}}')), what="Prometheus scraping the shadow",
        children=(shadow.child,))


# ------------------------------------------------------------------------------ the checks


def hpa(name: str, namespace: str, metrics: list[dict[str, Any]], *,
        behavior: dict[str, Any] | None, labels: Mapping[str, str],
        max_replicas: int = 10) -> dict[str, Any]:
    spec: dict[str, Any] = {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                               "name": name},
                            "minReplicas": 1, "maxReplicas": max_replicas, "metrics": metrics}
    if behavior is not None:
        spec["behavior"] = behavior
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
            "spec": spec}


JOBS = [{"type": "Pods", "pods": {"metric": {"name": "jobs_in_flight"},
                                  "target": {"type": "AverageValue", "averageValue": "10"}}}]
CPU = [{"type": "Resource", "resource": {"name": "cpu", "target": {
    "type": "Utilization", "averageUtilization": 50}}}]


def shadow_sequence(prometheus: PrometheusServer, namespace: str, hpa_name: str, *,
                    start: float, end: float) -> list[tuple[float, int]]:
    """metricscale_shadow_replicas of one HPA as Prometheus scraped it, each change once."""
    data = prometheus.api("query_range", [
        ("query", f'metricscale_shadow_replicas{{namespace="{namespace}", '
                  f'horizontalpodautoscaler="{hpa_name}"}}'),
        ("start", f"{start:.3f}"), ("end", f"{end:.3f}"), ("step", "1")])
    sequence: list[tuple[float, int]] = []
    for series in data["result"]:
        for stamp, value in series["values"]:
            if not sequence or sequence[-1][1] != int(float(value)):
                sequence.append((float(stamp), int(float(value))))
    return sequence


def compare(hpa_steps: list[tuple[float, int]], shadow_steps: list[tuple[float, int]],
            what: str, *, lone_difference: bool = False) -> None:
    theirs, ours = [n for _, n in hpa_steps], [n for _, n in shadow_steps]
    if lone_difference:
        # The shadow's one size the HPA did not take: the HPA's steps all in the shadow's,
        # in order, at most a step away and back more, and the same final size.
        remaining = iter(ours)
        assert all(n in remaining for n in theirs) and len(ours) <= len(theirs) + 2 \
            and ours[-1:] == theirs[-1:], f"{what}: the HPA went {theirs}, the shadow {ours}"
        return
    assert ours == theirs, f"{what}: the HPA went {theirs}, the shadow {ours}"
    offsets = [round(b - a, 1) for (a, _), (b, _) in zip(hpa_steps[1:], shadow_steps[1:],
                                                          strict=True)]
    late = [o for o in offsets if abs(o) > SYNC_SECONDS + PIPELINE_SLACK]
    assert not late, (f"{what}: steps {theirs}: the shadow trailed or led the HPA by "
                      f"{offsets} s, more than a sync period\n{hpa_steps}\n{shadow_steps}")


ALLOWED_WRITES = [
    ("POST", r"/apis/events\.k8s\.io/v1/namespaces/{ns}/events"),
    ("POST", rf"/apis/coordination\.k8s\.io/v1/namespaces/{NAMESPACE}/leases"),
    ("PUT", rf"/apis/coordination\.k8s\.io/v1/namespaces/{NAMESPACE}/leases/{SHADOW}"),
    ("POST", rf"/api/v1/namespaces/{NAMESPACE}/configmaps"),
    ("PUT", rf"/api/v1/namespaces/{NAMESPACE}/configmaps/{SHADOW}"),
]


def check_writes_nothing(cluster: ControlPlane, proxy: FaultProxy, namespace: str) -> None:
    """The shadow's every request that is not a read: its Events, its Lease, its ConfigMap;
    and no field manager of ours on the Deployments and HPAs."""
    allowed = [(method, re.compile(f"^{pattern.format(ns=re.escape(namespace))}$"))
               for method, pattern in ALLOWED_WRITES]
    writes = [r for r in proxy.recorded if r.method not in {"GET", "HEAD"}]
    unexpected = [f"{r.method} {r.path}" for r in writes
                  if not any(r.method == m and p.match(r.path) for m, p in allowed)]
    assert not unexpected, f"the shadow wrote {unexpected}"
    assert any(r.path.endswith(f"/configmaps/{SHADOW}") or r.path.endswith("/configmaps")
               for r in writes), "the shadow never published its ConfigMap"
    assert any(r.method == "GET" and "/horizontalpodautoscalers" in r.path
               for r in proxy.recorded), "the recording missed the shadow's requests"
    for plural, group in (("deployments", "apis/apps/v1"),
                          ("horizontalpodautoscalers", "apis/autoscaling/v2")):
        for item in cluster.get(f"/{group}/namespaces/{namespace}/{plural}")["items"]:
            managers = {m.get("manager", "") for m in item["metadata"].get("managedFields", [])}
            assert not any("metricscale" in m for m in managers), (
                f"{plural}/{item['metadata']['name']} has field managers {managers}")


def explain(cluster: ControlPlane, target: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "metricscale", "explain", "--live", target, "--shadow",
         f"--kubeconfig={cluster.kubeconfig}", f"--lease-namespace={NAMESPACE}", *args],
        cwd=CHECKOUT, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ})


def published(cluster: ControlPlane) -> dict[str, Any]:
    configmap = cluster.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/{SHADOW}")
    return {key: json.loads(text) for key, text in (configmap.get("data") or {}).items()}


def shadow_events(cluster: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    events = cluster.get(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")["items"]
    return [e for e in events if e.get("reason") == EVENT_REASON]


# ------------------------------------------------------------------------------ the tests


async def test_beside_upstreams_hpas_the_shadow_agrees_at_every_decision_and_writes_nothing(
        installation: Installation, kubelet: Kubelet, exporter: Exporter, namespace: str,
        prometheus: PrometheusServer, fault_proxy: FaultProxy,
        shadow_factory: Callable[..., Shadow]) -> None:
    cluster = installation.cluster
    for name in ("jobs", "cpu"):
        cluster.apply(deployment(name, namespace, replicas=2))
    # Started before the HPAs exist: both histories start at their creation (no warm-up).
    shadow = shadow_factory("--shadow-selector=shadow=exact", "--log-level=debug")
    await started(shadow, prometheus, namespace)
    start = time.time()
    with hpa_decisions(cluster, namespace, clock=time.time) as decisions, \
            Load(cluster, kubelet, namespace=namespace, selector={"app": "jobs"},
                 exporter=exporter, metric="jobs_in_flight", metric_total=20) as jobs, \
            Load(cluster, kubelet, namespace=namespace, selector={"app": "cpu"},
                 cpu="0.5") as cpu:
        base = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/pods/*/"
        await until(lambda: served(cluster, base + "jobs_in_flight", 2),
                    what="jobs_in_flight served for the two pods")
        await until(lambda: served(cluster, f"/apis/metrics.k8s.io/v1beta1/namespaces/"
                                            f"{namespace}/pods", 4),
                    what="the four pods in metrics.k8s.io")
        await until(lambda: past_initial_window(cluster, namespace, window=30),
                    what="samples taken a window after the pods became Ready")
        labels = {"shadow": "exact"}
        cluster.apply(hpa("jobs", namespace, JOBS, behavior=BEHAVIOR, labels=labels))
        cluster.apply(hpa("cpu", namespace, CPU, behavior=ONE_AT_A_TIME, labels=labels,
                          max_replicas=6))

        async def profile(name: str, load: Load,
                          steps: list[tuple[dict[str, Any], int]]) -> None:
            for settings, expected in steps:
                load.set(**settings)
                await until(lambda expected=expected: (  # type: ignore[misc]
                    decisions.now(name) == expected),
                    what=f"HPA {name} at {expected} under {settings}",
                    state=lambda: (f"HPA {decisions.sequence(name)}, shadow "
                                   f"{shadow.value('metricscale_shadow_replicas', namespace=namespace, horizontalpodautoscaler=name)}"),  # noqa: E501
                    children=(shadow.child,))

        # As the twins: 20 in flight on 2 pods, on target; 70: 7 pods, two at a time; 15: back
        # to 2. CPU: 0.5 cores on 2 pods of 500m is 50%; 2: one at a time to the maximum, 6,
        # above the tolerance on the way (test_upstream_hpa_twins.py says why); 0.4: 2.
        await asyncio.gather(
            profile("jobs", jobs, [({"metric_total": 20}, 2), ({"metric_total": 70}, 7),
                                   ({"metric_total": 15}, 2)]),
            profile("cpu", cpu, [({"cpu": Decimal("0.5")}, 2), ({"cpu": Decimal("2")}, 6),
                                 ({"cpu": Decimal("0.4")}, 2)]))
        # Every decision of the run judged: a decision waits at most a sync period and a half
        # for the HPA's, so three more agreements each settle all that came before.
        judged = {name: shadow.decisions(namespace, name)["agree"] for name in ("jobs", "cpu")}
        await until(lambda: all(shadow.decisions(namespace, name)["agree"] >= judged[name] + 3
                                for name in judged),
                    what="three more judged decisions of each HPA",
                    state=lambda: str({n: shadow.decisions(namespace, n) for n in judged}),
                    children=(shadow.child,))
        end = time.time()

    for name in ("jobs", "cpu"):
        counts = shadow.decisions(namespace, name)
        differences = shadow.differences(namespace, name)
        assert counts["warmup"] == 0 and counts["unjudged"] == 0, f"HPA {name}: {counts}"
        # CPU is a rate over a window that moves between the two reads, a second apart: on a
        # ramp that hovers near a threshold (a new pod's series reads low), one sync can fall
        # on either side (docs/shadow.md, "Reading the rate": a lone difference, the same final
        # size on both sides). It is judged "on values read apart", or "on the same values"
        # when only the stabilization window, filled from each side's own earlier reads, held
        # the scale-down (seen under a CI run's load: the HPA 6 -> 5, the shadow kept 6).
        same = [d for d in differences if "on the same values" in d]
        assert all(name == "cpu" and "Stabilization" in d for d in same), \
            f"HPA {name}: {counts}\n" + "\n".join(differences)
        assert counts["differ"] <= (1 if name == "cpu" else 0), \
            f"HPA {name}: {counts}\n" + "\n".join(differences)
        assert counts["agree"] >= 10, f"HPA {name}: {counts}"
        await until(lambda name=name: (  # type: ignore[misc]
            [n for _, n in shadow_sequence(prometheus, namespace, name, start=start,
                                           end=time.time())[-1:]]
            == [n for _, n in decisions.sequence(name)[-1:]]),
            what=f"Prometheus has the shadow's last {name}")
        compare(decisions.sequence(name),
                shadow_sequence(prometheus, namespace, name, start=start, end=end),
                f"HPA {name}", lone_difference=counts["differ"] > 0)
    # The dashboard's go/no-go number over the run, as Prometheus computes it.
    agreement = prometheus.query(shadow_agreement(f"{int(end - start) + 60}s"))
    assert [float(s.value) for s in agreement] == [1.0], agreement
    assert shadow_events(cluster, namespace) == []
    check_writes_nothing(cluster, fault_proxy, namespace)

    # What explain --live --shadow shows is what the shadow decided.
    await until(lambda: {f"{namespace}.jobs", f"{namespace}.cpu"} <= published(cluster).keys(),
                what="both HPAs published", children=(shadow.child,))
    entry = published(cluster)[f"{namespace}.jobs"]
    assert entry["decision"]["result"] == "agree"
    assert entry["decision"]["replicas"] == entry["decision"]["hpaDesiredReplicas"]
    as_json = explain(cluster, f"{namespace}/jobs", "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    explained = json.loads(as_json.stdout)
    assert explained["settingsSource"] == "controller"  # the shadow's, from its Lease
    assert explained["shadow"]["configMap"] == f"{NAMESPACE}/{SHADOW}"
    assert explained["shadow"]["decision"]["result"] == "agree"
    as_text = explain(cluster, f"{namespace}/jobs", "-o", "text")
    assert as_text.returncode == 0, as_text.stderr
    assert "shadow mode, since" in as_text.stdout and as_text.stdout.rstrip().endswith("agree")


async def test_given_another_tolerance_the_shadow_differs_and_says_so_once(
        installation: Installation, kubelet: Kubelet, exporter: Exporter, namespace: str,
        prometheus: PrometheusServer, fault_proxy: FaultProxy,
        shadow_factory: Callable[..., Shadow]) -> None:
    cluster = installation.cluster
    for name in ("steady", "unselected"):
        cluster.apply(deployment(name, namespace, replicas=2))
    shadow = shadow_factory("--shadow-selector=shadow=loose",
                            "--horizontal-pod-autoscaler-tolerance=0.01")
    await started(shadow, prometheus, namespace)
    with hpa_decisions(cluster, namespace, clock=time.time) as decisions, \
            Load(cluster, kubelet, namespace=namespace, selector={"app": "steady"},
                 exporter=exporter, metric="jobs_in_flight", metric_total=21), \
            Load(cluster, kubelet, namespace=namespace, selector={"app": "unselected"},
                 exporter=exporter, metric="jobs_in_flight", metric_total=21):
        base = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/pods/*/"
        await until(lambda: served(cluster, base + "jobs_in_flight", 4),
                    what="jobs_in_flight served for the four pods")
        # 21 in flight on 2 pods at 10 a pod: a ratio of 1.05, inside upstream's tolerance
        # (0.1): the HPA keeps 2. The shadow, told 0.01, would scale to 3 at every sync.
        cluster.apply(hpa("steady", namespace, JOBS, behavior=None, labels={"shadow": "loose"}))
        cluster.apply(hpa("unselected", namespace, JOBS, behavior=None, labels={}))
        await until(lambda: shadow.decisions(namespace, "steady")["differ"] >= 4,
                    what="four differing decisions",
                    state=lambda: (f"{shadow.decisions(namespace, 'steady')}, HPA "
                                   f"{decisions.sequence('steady')}"),
                    children=(shadow.child,))
        assert decisions.sequence("steady")[-1][1] == 2 and \
            [n for _, n in decisions.sequence("steady")] == [2]

    assert shadow.value("metricscale_shadow_replicas", namespace=namespace,
                        horizontalpodautoscaler="steady") == 3
    assert shadow.decisions(namespace, "steady")["agree"] == 0
    assert not any(labels and dict(labels).get("horizontalpodautoscaler") == "unselected"
                   for _, labels in shadow.samples()), "an HPA outside --shadow-selector"
    events = shadow_events(cluster, namespace)
    assert len(events) == 1, events  # a persistent difference: one Event, not one per sync
    event = events[0]
    assert event["reportingController"] == "metricscale.dev/autoscaler"
    assert (event["regarding"]["kind"], event["regarding"]["name"]) == \
        ("HorizontalPodAutoscaler", "steady")
    assert f"would scale Deployment/{namespace}/steady from 2 to 3" in event["note"]
    assert "the HPA kept 2" in event["note"]
    assert cluster.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/steady")[
        "spec"]["replicas"] == 2
    check_writes_nothing(cluster, fault_proxy, namespace)

    await until(lambda: published(cluster).get(f"{namespace}.steady", {}).get(
        "decision", {}).get("result") == "differ", what="the difference published",
        children=(shadow.child,))
    as_json = explain(cluster, f"{namespace}/steady", "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    explained = json.loads(as_json.stdout)
    assert explained["shadow"]["decision"]["result"] == "differ"
    # Explained with the shadow's settings (its tolerance), the decision is its own: 3.
    assert explained["desiredReplicas"] == 3, explained
