"""`metricscale explain` as users run it: a subprocess on snapshot files of wire-format objects."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

SNAPSHOTS = Path(__file__).parent / "snapshots"


def explain(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metricscale", "explain", *args],
                          input=stdin, capture_output=True, text=True, timeout=60, check=False)


def decision_for(name: str) -> dict[str, Any]:
    result = explain(str(SNAPSHOTS / name))
    assert result.returncode == 0, result.stderr
    parsed: dict[str, Any] = json.loads(result.stdout)
    return parsed


def test_cpu_load_scales_a_deployment_up() -> None:
    out = decision_for("cpu-scale-up.yaml")
    assert (out["desiredReplicas"], out["scaleUpdated"]) == (5, True)
    assert out["events"] == [{"type": "Normal", "reason": "SuccessfulRescale",
                              "message": "New size: 5; reason: cpu resource utilization "
                                         "(percentage of request) above target"}]
    assert out["status"]["currentMetrics"] == [{"type": "Resource", "resource": {
        "name": "cpu", "current": {"averageValue": "150m", "averageUtilization": 75}}}]
    conditions = {c["type"]: c for c in out["status"]["conditions"]}
    # the conditions stayed True, so their transition times are the old ones
    assert conditions["AbleToScale"]["lastTransitionTime"] == "2026-11-20T08:13:11Z"
    assert conditions["AbleToScale"]["message"] == \
        "the HPA controller was able to update the target scale to 5"
    assert out["status"]["lastScaleTime"] == "2026-11-21T10:00:00Z"
    assert out["metrics"][0]["ratio"] == 1.5 and out["limits"] == []
    assert [r["replicas"] for r in out["history"]["recommendations"]] == [3, 5]


def test_a_recent_higher_recommendation_holds_a_scale_down() -> None:
    out = decision_for("pods-metric-stabilized.yaml")
    assert (out["desiredReplicas"], out["scaleUpdated"], out["events"]) == (4, False, [])
    assert out["limits"] == [{"rule": "ScaleDownStabilization", "from": 2, "to": 4,
                              "detail": "recent recommendations were higher than current one, "
                                        "applying the highest recent recommendation (the 300 s "
                                        "downscale stabilization window)"}]
    assert out["metrics"][0]["current"] == "4575m" and out["metrics"][0]["proposedReplicas"] == 2


def test_a_scale_up_policy_limits_the_rate() -> None:
    out = decision_for("behavior-policy.yaml")
    assert out["desiredReplicas"] == 6
    assert [(lim["rule"], lim["from"], lim["to"]) for lim in out["limits"]] == \
        [("ScaleUpPolicy", 14, 6)]
    assert {c["type"]: c["reason"] for c in out["status"]["conditions"]}["ScalingLimited"] == \
        "ScaleUpLimit"


def test_a_failing_metric_blocks_the_scale_down() -> None:
    out = decision_for("failing-metric-blocks-scale-down.yaml")
    assert out["desiredReplicas"] == 4
    assert [e["reason"] for e in out["events"]] == ["FailedGetExternalMetric",
                                                   "FailedComputeMetricsReplicas"]
    assert out["limits"][0]["rule"] == "FailingMetricBlocksScaleDown"
    assert out["status"]["currentMetrics"][1] == {"type": ""}
    assert out["metrics"][1]["error"].endswith(
        "the server could not find the requested resource "
        "(get lb_requests_per_second.external.metrics.k8s.io)")


def test_an_unreadable_scale_is_a_decision_not_an_input_error() -> None:
    out = decision_for("scale-error.yaml")
    assert out["events"] == [{"type": "Warning", "reason": "FailedGetScale",
                              "message": "deployments.apps \"web\" not found"}]


def test_text_output_is_a_readable_report() -> None:
    result = explain("--output", "text", str(SNAPSHOTS / "behavior-policy.yaml"))
    assert result.returncode == 0, result.stderr
    assert "Decision: keep 6 replicas" in result.stdout
    assert "ScaleUpPolicy: 14 -> 6" in result.stdout


def test_json_on_standard_input_gives_the_same_decision() -> None:
    document = yaml.safe_load((SNAPSHOTS / "cpu-scale-up.yaml").read_text())
    result = explain("-", stdin=json.dumps(document))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == decision_for("cpu-scale-up.yaml")


@pytest.mark.parametrize(("name", "field"), [
    ("bad-quantity.yaml", "autoscaler.spec.metrics[0].pods.target.averageValue: "),
    ("wrong-metric-list.yaml", "metrics[0].kind: "),
])
def test_invalid_input_exits_2_naming_the_field(name: str, field: str) -> None:
    result = explain(str(SNAPSHOTS / "invalid" / name))
    assert result.returncode == 2
    assert result.stdout == ""
    assert f"metricscale explain: invalid snapshot: {field}" in result.stderr


@pytest.mark.parametrize(("args", "stdin", "message"), [
    (("/nonexistent/snapshot.yaml",), None, "cannot read /nonexistent/snapshot.yaml"),
    (("-",), "{not: [valid", "is neither JSON nor YAML"),
    (("-",), "- just\n- a list\n", "a snapshot must be an object"),
    ((), None, "a snapshot FILE (or - for standard input) is required"),
])
def test_unreadable_input_exits_2(args: tuple[str, ...], stdin: str | None, message: str) -> None:
    result = explain(*args, stdin=stdin)
    assert result.returncode == 2
    assert message in result.stderr


def test_a_metric_past_its_failure_threshold_proposes_its_fallback() -> None:
    out = decision_for("fallback-metrics-api-down.yaml")
    assert (out["desiredReplicas"], out["scaleUpdated"]) == (6, True)
    conditions = {c["type"]: (c["status"], c["reason"]) for c in out["status"]["conditions"]}
    assert conditions["Fallback"] == ("True", "FallbackActive")
    assert out["history"]["metricFailures"][0]["failures"] == 3


def test_an_active_metric_wakes_a_target_resting_at_its_idle_size() -> None:
    out = decision_for("activation-from-idle.yaml")
    assert (out["desiredReplicas"], out["scaleUpdated"]) == (1, True)
    conditions = {c["type"]: (c["status"], c["reason"]) for c in out["status"]["conditions"]}
    assert conditions["Active"] == ("True", "ScalerActive")
    assert "inactiveSince" not in out["history"]  # active again: the clock is cleared


def test_live_with_an_unreadable_kubeconfig_is_one_line_naming_the_file(tmp_path: Path) -> None:
    # the autoscaler's wording and exit status for the same mistake: never "invalid snapshot"
    missing = tmp_path / "nonexistent"
    result = explain("--live", "demo/web", "--kubeconfig", str(missing))
    assert result.returncode == 2
    assert result.stderr == (f"metricscale explain: cannot read kubeconfig {missing}: "
                             "no such file or directory\n")


def test_live_with_a_broken_kubeconfig_says_what_is_wrong_in_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "config"
    broken.write_text("apiVersion: v1\nkind: Config\nclusters: []\n", encoding="utf-8")
    result = explain("--live", "demo/web", "--kubeconfig", str(broken))
    assert result.returncode == 2
    assert result.stderr.startswith("metricscale explain: ") and str(broken) in result.stderr
    assert "invalid snapshot" not in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1


def test_text_names_a_metric_without_a_selector_without_gos_nil() -> None:
    # upstream's description is "external metric queue_messages_ready(nil)" (Go's %+v of a nil
    # *LabelSelector); the readable report names the metric as kubectl would
    result = explain("--output", "text", str(SNAPSHOTS / "activation-from-idle.yaml"))
    assert result.returncode == 0, result.stderr
    assert "(nil)" not in result.stdout
    assert "  [0] external metric queue_messages_ready: current 0, target 30" in result.stdout
    assert "The metrics ask for 1 replica (the most, from external metric " \
           "queue_messages_ready)." in result.stdout
    assert "1 replicas" not in result.stdout
    # the JSON keeps the words the controller writes, byte for byte
    conditions = {c["type"]: c["message"]
                  for c in decision_for("activation-from-idle.yaml")["status"]["conditions"]}
    assert conditions["ScalingActive"].endswith("from external metric queue_messages_ready(nil)")


def test_text_names_a_metric_with_a_selector_as_kubectl_prints_selectors() -> None:
    document = yaml.safe_load((SNAPSHOTS / "activation-from-idle.yaml").read_text())
    external = document["autoscaler"]["spec"]["metrics"][0]["external"]
    external["metric"]["selector"] = {"matchLabels": {"queue": "orders"}}
    document["metrics"][0]["items"][0]["value"] = "120"  # 4 pods' worth at 30 a pod
    document["scale"]["spec"]["replicas"] = document["scale"]["status"]["replicas"] = 1
    result = explain("--output", "text", "-", stdin=json.dumps(document))
    assert result.returncode == 0, result.stderr
    assert "LabelSelector" not in result.stdout and "(nil)" not in result.stdout
    readable = "external metric queue_messages_ready (queue=orders)"
    assert f"Decision: scale to 4 ({readable} above target)" in result.stdout
    assert f"  [0] {readable}: current 120, target 30, ratio 4 -> 4" in result.stdout
    assert f"The metrics ask for 4 replicas (the most, from {readable})." in result.stdout
    assert "has 1 replica (spec), 1 (status)" in result.stdout
    # the JSON keeps upstream's words (what the controller writes)
    out = json.loads(explain("-", stdin=json.dumps(document)).stdout)
    go_name = ("external metric queue_messages_ready(&LabelSelector{MatchLabels:"
               "map[string]string{queue: orders,},MatchExpressions:[]LabelSelectorRequirement{},})")
    assert out["metrics"][0]["description"] == go_name
    assert out["events"][-1]["message"] == f"New size: 4; reason: {go_name} above target"


@pytest.mark.parametrize(("args", "message"), [
    (("--live", "Bad_NS/web"), "live: 'Bad_NS': a namespace must be a DNS-1123 label: "),
    (("--live", "shop/Web_1"), "live: 'Web_1': an autoscaler's name must be a DNS-1123 "
                               "subdomain: "),
    (("--live", "shop/web", "--lease-namespace", "Ops"),
     "lease-namespace: 'Ops': a namespace must be a DNS-1123 label: "),
    (("--live", "shop/web", "--lease-name", "Lock_1"),
     "lease-name: 'Lock_1': a Lease's name must be a DNS-1123 subdomain: "),
])
def test_live_names_the_api_would_refuse_are_refused_before_any_request(
        args: tuple[str, ...], message: str, tmp_path: Path) -> None:
    # (the kubeconfig does not exist: the names are checked before it is read)
    result = explain(*args, "--kubeconfig", str(tmp_path / "nonexistent"))
    assert result.returncode == 2
    assert result.stderr.startswith(f"metricscale explain: invalid snapshot: {message}")
    assert result.stderr.count("\n") == 1


def _with_spec(**changes: Any) -> str:
    document = yaml.safe_load((SNAPSHOTS / "cpu-scale-up.yaml").read_text())
    spec = document["autoscaler"]["spec"]
    for key, value in changes.items():
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    return json.dumps(document)


CPU_ONLY = [{"type": "Resource", "resource": {"name": "cpu", "target": {
    "type": "Utilization", "averageUtilization": 60}}}]
QUANTITY_PATTERN = (r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?"
                    r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")


@pytest.mark.parametrize(("changes", "message"), [
    ({"behavior": {"scaleDown": {"tolerance": "-0.1"}}},
     f"autoscaler.spec.behavior.scaleDown.tolerance: should match '{QUANTITY_PATTERN}'"),
    ({"minReplicas": 0, "metrics": CPU_ONLY},
     "autoscaler.spec.minReplicas: minReplicas 0 needs at least one Object or External metric"),
    ({"minReplicas": 2, "idle": {"replicas": 2}},
     "autoscaler.spec.idle.replicas: idle.replicas must be less than minReplicas"),
    ({"metrics": [{**CPU_ONLY[0], "resource": {**CPU_ONLY[0]["resource"], "fallback": {
        "replicas": 3, "failureThreshold": -1}}}]},
     "autoscaler.spec.metrics[0].resource.fallback.failureThreshold: should be greater than "
     "or equal to 1"),
])
def test_a_spec_the_api_server_refuses_is_refused_with_its_words(
        changes: dict[str, Any], message: str) -> None:
    # cpu-scale-up.yaml holds a native HPA: its spec is checked as the CRD checks an
    # Autoscaler's (the CRD mirrors upstream's HPA validation)
    result = explain("-", stdin=_with_spec(**changes))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"metricscale explain: invalid snapshot: {message}\n"
