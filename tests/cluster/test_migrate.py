"""`metricscale migrate` against the real control plane, as a user types it.

The hand-over: kube-controller-manager's own HPA has scaled a Deployment to 5 and holds it
there (the load fell; a high recommendation is in its scale-down window). `migrate hpa --apply`
replaces it by an Autoscaler: the replicas stay 5 through the switch and the Autoscaler holds
them a whole window from the hand-over (it never scales down sooner than the HPA would have),
then scales down itself. The printed manifests (an Autoscaler from an HPA, an HPA back from an
Autoscaler, our ConfigMap from prometheus-adapter's chart values) are what the API server
accepts, and the HPA made back is run by kube-controller-manager.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.binaries import CHECKOUT
from testbed.controlplane import ControlPlane, Kubelet
from testbed.fakes.exporter import Exporter
from testbed.fakes.prometheus import PrometheusServer
from testbed.install import Installation
from testbed.load import Load
from testbed.processes import wait_until
from testbed.watching import deployment_replicas
from tests.cluster.support import native_hpa_installation
from tests.cluster.test_upstream_hpa_twins import deployment, until

WINDOW = 40  # the HPA's scale-down window, seconds
SYNC = 5.0  # both controllers' sync period here


def migrate(cluster: ControlPlane, *arguments: str, stdin: str | None = None,
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metricscale", "migrate", *arguments,
                           f"--kubeconfig={cluster.kubeconfig}"], input=stdin,
                          capture_output=True, text=True, cwd=CHECKOUT, timeout=300,
                          check=False)


def hpa(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    body = {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": 1, "maxReplicas": 10,
            "metrics": [{"type": "Pods", "pods": {
                "metric": {"name": "jobs_in_flight"},
                "target": {"type": "AverageValue", "averageValue": "10"}}}]}
    body.update(spec)
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": name, "namespace": namespace}, "spec": body}


def served_items(cluster: ControlPlane, path: str) -> int:
    answer = cluster.kubectl("get", "--raw", path, check=False)
    return len(json.loads(answer.stdout)["items"]) if answer.returncode == 0 else -1


def conditions(obj: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"])
            for c in (obj.get("status") or {}).get("conditions") or []}


async def test_hpa_handed_over_to_an_autoscaler_keeps_its_replicas_and_window(
        installation: Installation, namespace: str, kubelet: Kubelet,
        exporter: Exporter) -> None:
    cluster = installation.cluster
    hpa_path = f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/web"
    ours_path = f"/apis/metricscale.dev/v1alpha1/namespaces/{namespace}/autoscalers/web"
    cluster.apply(deployment("web", namespace, replicas=2))
    with deployment_replicas(cluster, namespace) as replicas, \
            Load(cluster, kubelet, namespace=namespace, selector={"app": "web"},
                 exporter=exporter, metric="jobs_in_flight", metric_total=20) as load:
        served = (f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/pods/*/"
                  "jobs_in_flight?labelSelector=app%3Dweb")
        await until(lambda: served_items(cluster, served) == 2, what="jobs_in_flight served")
        cluster.apply(hpa("web", namespace, behavior={
            "scaleDown": {"stabilizationWindowSeconds": WINDOW}}))
        load.set(metric_total=50)  # 25 a pod at a target of 10: 5 pods
        await until(lambda: replicas.now("web") == 5, what="the HPA at 5 replicas")
        load.set(metric_total=10)  # 1 pod would do; the window holds 5
        await until(lambda: conditions(cluster.get(hpa_path)).get("AbleToScale") ==
                    ("True", "ScaleDownStabilized"),
                    what="the HPA holding 5 against a lower recommendation")

        handed = migrate(cluster, "hpa", f"{namespace}/web", "--apply")
        handed_at = time.monotonic()
        assert handed.returncode == 0, handed.stderr
        assert "autoscaler.metricscale.dev/web handed over" in handed.stdout
        assert "HPA deleted" in handed.stderr and "resumed" in handed.stderr, handed.stderr
        assert "as kube-controller-manager does when it restarts" in handed.stderr
        assert cluster.kubectl("get", "hpa", "web", "-n", namespace,
                               check=False).returncode != 0
        ours = cluster.get(ours_path)
        assert not set(ours["metadata"].get("annotations") or {}) & {
            "metricscale.dev/paused", "metricscale.dev/history"}
        assert ours["status"]["history"]["recommendations"]

        # The Autoscaler holds 5 through its own syncs, then scales down at its window's end.
        await until(lambda: (replicas.now("web") or 5) < 5, what="the Autoscaler scaling down",
                    within=WINDOW + 120)
        assert conditions(cluster.get(ours_path))["ScalingActive"][0] == "True"
    sequence = replicas.sequence("web")
    at_five = next(i for i, (_, count) in enumerate(sequence) if count == 5)
    (down_at, down_to), *_ = sequence[at_five + 1:]
    assert [count for _, count in sequence[:at_five + 1]] == [2, 5], sequence
    assert down_to < 5
    # Held a whole window from the hand-over (the current size counted as recommended then),
    # so never sooner than the HPA, whose last high recommendation came before it.
    assert down_at >= handed_at + WINDOW - SYNC, (down_at - handed_at, sequence)
    events = cluster.get(f"/api/v1/namespaces/{namespace}/events")["items"]
    assert [e["message"] for e in events if e["reason"] == "SuccessfulRescale"
            and e["involvedObject"]["kind"] == "Autoscaler"], "the Autoscaler scaled"


def test_printed_autoscalers_are_what_the_api_server_accepts(
        installation: Installation, namespace: str) -> None:
    cluster = installation.cluster
    behavior = {"scaleUp": {"stabilizationWindowSeconds": 30,
                            "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}]},
                "scaleDown": {"selectPolicy": "Min"}}
    cluster.apply(hpa("api", namespace, behavior=behavior, minReplicas=2, maxReplicas=7))
    cluster.apply(hpa("worker", namespace))
    printed = migrate(cluster, "hpa", "-A")
    assert printed.returncode == 0, printed.stderr
    documents = [d for d in yaml.safe_load_all(printed.stdout) if d]
    mine = [d for d in documents if d["metadata"]["namespace"] == namespace]
    assert sorted(d["metadata"]["name"] for d in mine) == ["api", "worker"]
    stored = cluster.get(f"/apis/autoscaling/v2/namespaces/{namespace}/"
                         "horizontalpodautoscalers/api")
    (api,) = [d for d in mine if d["metadata"]["name"] == "api"]
    assert api["kind"] == "Autoscaler" and api["spec"] == stored["spec"]
    accepted = cluster.kubectl("apply", "--dry-run=server", "-o", "json", "-f", "-",
                               input=yaml.safe_dump_all(mine))
    items = json.loads(accepted.stdout)
    items = items.get("items", [items])
    # Nothing pruned; the CRD's one default is our extra at upstream's behaviour.
    assert all(i["spec"].pop("podSelectionStrategy") == "LabelSelector" for i in items)
    assert [i["spec"] for i in items] == [d["spec"] for d in mine]
    one = migrate(cluster, "hpa", "worker", "-n", namespace, "-o", "json")
    assert json.loads(one.stdout)["spec"]["metrics"][0]["pods"]["metric"]["name"] == \
        "jobs_in_flight"
    assert "note:" in migrate(cluster, "hpa", f"{namespace}/worker").stdout  # no window set


def test_an_autoscaler_goes_back_to_an_hpa_reporting_each_extra_and_upstream_runs_it(
        installation: Installation, namespace: str) -> None:
    cluster = installation.cluster
    cluster.apply(deployment("queue", namespace, replicas=1))
    cluster.apply({"apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
                   "metadata": {"name": "queue", "namespace": namespace,
                                "annotations": {"metricscale.dev/paused": "true"}},
                   "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                               "name": "queue"},
                            "minReplicas": 1, "maxReplicas": 4,
                            "podSelectionStrategy": "OwnerReferences",
                            "behavior": {"syncPeriodSeconds": 30},
                            "metrics": [{"type": "External", "external": {
                                "metric": {"name": "queue_depth",
                                           "selector": {"matchLabels": {"queue": "q"}}},
                                "target": {"type": "AverageValue", "averageValue": "30"},
                                "fallback": {"replicas": 3},
                                "activationThreshold": "5"}}]}})
    printed = migrate(cluster, "autoscaler", f"{namespace}/queue")
    assert printed.returncode == 0, printed.stderr
    assert "5 thing(s) an HPA cannot say were left out" in printed.stderr
    for dropped in ("spec.metrics[0].external.fallback", "spec.metrics[0].external."
                    "activationThreshold", "spec.podSelectionStrategy",
                    "spec.behavior.syncPeriodSeconds",
                    "metadata.annotations[metricscale.dev/paused]"):
        assert f"# not carried: {dropped}: " in printed.stdout, printed.stdout
    cluster.delete({"apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
                    "metadata": {"name": "queue", "namespace": namespace}})
    cluster.kubectl("apply", "-f", "-", input=printed.stdout)
    path = f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/queue"
    wait_until(lambda: "AbleToScale" in conditions(cluster.get(path)),
               what="kube-controller-manager running the HPA made back", timeout=120)
    assert cluster.get(path)["spec"]["metrics"][0]["external"] == {
        "metric": {"name": "queue_depth", "selector": {"matchLabels": {"queue": "q"}}},
        "target": {"type": "AverageValue", "averageValue": "30"}}


def test_prometheus_adapter_chart_values_become_a_configmap_the_adapter_reads(
        installation: Installation, namespace: str, tmp_path: Path) -> None:
    cluster = installation.cluster
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "prometheus": {"url": "http://prometheus.monitoring.svc", "port": 9090},
        "rules": {"default": True,
                  "custom": [{"seriesQuery": 'jobs_in_flight{namespace!="",pod!=""}',
                              "resources": {"template": "<<.Resource>>"},
                              "name": {"as": "$1_per_pod", "matches": "^(.*)$"},
                              "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by "
                                              "(<<.GroupBy>>)"},
                             {"seriesQuery": "broken"}],
                  "external": []}}))
    converted = migrate(cluster, "prometheus-adapter", str(values), "-n", namespace)
    assert converted.returncode == 1  # a rule was left out, and said so
    assert "rules[7] left out" in converted.stderr  # the chart's six, the custom one, this
    assert "(unnamed-metrics)" in converted.stdout and "${1}_per_pod" in converted.stdout
    assert "--prometheus-url=http://prometheus.monitoring.svc:9090" in converted.stdout
    accepted = json.loads(cluster.kubectl("apply", "--dry-run=server", "-o", "json", "-f", "-",
                                          input=converted.stdout).stdout)
    assert accepted["metadata"]["name"] == "metricscale-adapter-config"
    output = tmp_path / "configmap.yaml"
    output.write_text(converted.stdout)
    checked = subprocess.run([sys.executable, "-m", "metricscale", "adapter",
                              "--check-config", str(output)], capture_output=True, text=True,
                             cwd=CHECKOUT, timeout=120, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "valid: 7 rules" in checked.stdout


# --- An HPA that metricscale itself ran (native-HPA mode): its history carried exactly -------

STEP = 30  # the scale-down policy's period: one pod per STEP seconds


@pytest.fixture(scope="module")
def native(prometheus: PrometheusServer) -> Iterator[Installation]:
    """A control plane whose kube-controller-manager runs no HPA controller, and metricscale's
    autoscaler with --enable-native-hpa (the one way it may act on HPAs)."""
    with native_hpa_installation(prometheus, name="migrate") as installed:
        yield installed


async def test_a_native_hpas_own_history_is_carried_exactly_and_its_rate_limit_holds(
        native: Installation, exporter: Exporter) -> None:
    """Our controller ran the HPA, one pod down per 30 s, and stepped down once (4 to 3): the
    Autoscaler starts from the HPA's own history annotation, so its next step down waits for
    the rest of that period, as the HPA's would have."""
    cluster = native.cluster
    assert native.kubelet is not None
    namespace = "handover"
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    cluster.apply(deployment("web", namespace, replicas=4))
    hpa_path = f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/web"
    ours_path = f"/apis/metricscale.dev/v1alpha1/namespaces/{namespace}/autoscalers/web"
    with deployment_replicas(cluster, namespace) as replicas, \
            Load(cluster, native.kubelet, namespace=namespace, selector={"app": "web"},
                 exporter=exporter, metric="jobs_in_flight", metric_total=35) as load:
        await until(lambda: served_items(cluster, (
            f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/pods/*/"
            "jobs_in_flight?labelSelector=app%3Dweb")) == 4, what="jobs_in_flight served")
        cluster.apply(hpa("web", namespace, behavior={"scaleDown": {
            "stabilizationWindowSeconds": 0,
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": STEP}]}}))
        await until(lambda: conditions(cluster.get(hpa_path)).get("ScalingActive") == (
            "True", "ValidMetricFound"), what="the HPA keeping 4 (35 at 10 a pod)")
        load.set(metric_total=5)  # 1 pod would do: one step down per period
        await until(lambda: replicas.now("web") == 3, what="the HPA's first step down",
                    diagnose=lambda: cluster.kubectl("describe", "hpa", "web", "-n",
                                                     namespace).stdout + "\n" + (
                        native.workdir / "autoscaler.log").read_text()[-3000:])

        def annotated_history() -> dict[str, Any]:
            text = (cluster.get(hpa_path)["metadata"].get("annotations") or {}).get(
                "metricscale.dev/history")
            return json.loads(text) if text else {}

        await until(lambda: bool(annotated_history().get("scaleDownEvents")),
                    what="the step down in the HPA's history annotation")
        own = annotated_history()["scaleDownEvents"]
        handed = migrate(cluster, "hpa", f"{namespace}/web", "--apply")
        assert handed.returncode == 0, handed.stderr
        assert "carrying the HPA's own history (metricscale ran it)" in handed.stderr
        carried = cluster.get(ours_path)["status"]["history"]["scaleDownEvents"]
        assert [(e["timestamp"], e["replicaChange"]) for e in carried[:len(own)]] == [
            (e["timestamp"], e["replicaChange"]) for e in own]
        await until(lambda: (replicas.now("web") or 3) < 3,
                    what="the Autoscaler's next step down", within=STEP + 120)
    sequence = replicas.sequence("web")
    (_, three), (down_at, two) = [(t, n) for t, n in sequence if n <= 3][:2]
    assert (three, two) == (3, 2), sequence
    first_step = datetime.fromisoformat(own[-1]["timestamp"].replace("Z", "+00:00"))
    # The step waited for the HPA's period (30 s from its own step) to end.
    waited = time.time() - (time.monotonic() - down_at) - first_step.timestamp()
    assert waited >= STEP - 1, (waited, sequence, own)
