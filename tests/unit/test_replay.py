"""The replay's pure parts: durations, range splitting, the closed loop and its summary."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cli.replay import MAX_POINTS, _range_values, parse_duration, render
from cli.replay_sim import Observation, ReplayInputError, simulate, summarize

T0 = datetime(2026, 11, 1, tzinfo=UTC)
EXTERNAL: dict[str, Any] = {
    "apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
    "metadata": {"name": "worker", "namespace": "jobs"},
    "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                "name": "worker"},
             "minReplicas": 1, "maxReplicas": 5,
             "metrics": [{"type": "External", "external": {
                 "metric": {"name": "queue_depth"},
                 "target": {"type": "AverageValue", "averageValue": "10"}}}]},
}


@pytest.mark.parametrize(("text", "seconds"), [("15s", 15), ("5m", 300), ("24h", 86400),
                                               ("1d12h", 129600)])
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "5", "1.5h", "h"])
def test_bad_durations_are_input_errors(text: str) -> None:
    with pytest.raises(ReplayInputError):
        parse_duration(text)


class _RecordingClient:
    def __init__(self) -> None:
        self.calls: list[tuple[datetime, datetime]] = []

    def custom_query_range(self, query: str, *, start_time: datetime, end_time: datetime,
                           step: str) -> list[dict[str, Any]]:
        self.calls.append((start_time, end_time))
        return [{"metric": {}, "values": [[start_time.timestamp(), "1"]]}]


def test_long_ranges_are_split_under_the_points_limit() -> None:
    client = _RecordingClient()
    step = timedelta(seconds=15)
    end = T0 + step * 25_000
    _range_values(client, "up", start=T0, end=end, step=step)
    assert len(client.calls) == 3
    for start, stop in client.calls:
        assert (stop - start) / step + 1 <= MAX_POINTS
    assert client.calls[0][0] == T0 and client.calls[-1][1] == end
    assert all(b[0] - a[1] == step for a, b in zip(client.calls, client.calls[1:], strict=False))


def test_external_metric_is_used_as_observed_and_summary_counts_changes() -> None:
    times = [T0 + timedelta(seconds=15 * i) for i in range(4)]
    depths = [10.0, 40.0, 40.0, 10.0]
    steps = simulate(autoscaler=EXTERNAL, times=times, initial_replicas=1,
                     startup=timedelta(seconds=30),
                     observations=[(Observation(d),) for d in depths])
    assert [s.decided_replicas for s in steps] == [1, 4, 4, 4]  # scale-down is stabilized
    assert steps[-1].limiting_rule == "ScaleDownStabilization"
    summary = summarize(steps, step=timedelta(seconds=15))
    assert (summary.scale_ups, summary.scale_downs) == (1, 0)
    assert summary.replica_hours == pytest.approx(13 * 15 / 3600)
    assert summary.seconds_above_target == 15
    assert "scale_ups: 1" in render(steps, summary, "table")


def test_resource_utilization_redistributes_total_usage_over_ready_pods() -> None:
    spec = {**EXTERNAL, "spec": {**EXTERNAL["spec"], "metrics": [
        {"type": "Resource", "resource": {"name": "cpu", "target": {
            "type": "Utilization", "averageUtilization": 50}}}]}}
    times = [T0 + timedelta(seconds=15 * i) for i in range(3)]
    # 2 observed pods at 0.5 cores each, request 500m, target 50%: 1 core total -> 4 pods.
    steps = simulate(autoscaler=spec, times=times, initial_replicas=2, startup=timedelta(),
                     requests={"cpu": "500m"},
                     observations=[(Observation(0.5, 2),) for _ in times])
    assert [s.decided_replicas for s in steps] == [4, 4, 4]
    assert steps[1].values[0] == pytest.approx(0.25)


def test_container_resource_counts_only_the_named_container() -> None:
    spec = {**EXTERNAL, "spec": {**EXTERNAL["spec"], "metrics": [
        {"type": "ContainerResource", "containerResource": {
            "name": "cpu", "container": "app",
            "target": {"type": "AverageValue", "averageValue": "250m"}}}]}}
    steps = simulate(autoscaler=spec, times=[T0], initial_replicas=1, startup=timedelta(),
                     observations=[(Observation(0.75, 1),)])
    assert steps[0].decided_replicas == 3


def test_compare_of_two_behaviors_differs_only_where_scale_down_is_stabilized() -> None:
    times = [T0 + timedelta(seconds=15 * i) for i in range(6)]
    depths = [10.0, 40.0, 40.0, 10.0, 10.0, 10.0]
    eager = {**EXTERNAL, "spec": {**EXTERNAL["spec"], "behavior": {
        "scaleDown": {"stabilizationWindowSeconds": 0}}}}
    runs = [simulate(autoscaler=a, times=times, initial_replicas=1,
                     startup=timedelta(seconds=30),
                     observations=[(Observation(d),) for d in depths])
            for a in (EXTERNAL, eager)]
    default, other = ([s.decided_replicas for s in run] for run in runs)
    assert default == [1, 4, 4, 4, 4, 4]
    assert other == [1, 4, 4, 1, 1, 1]
    table = render(runs[0], summarize(runs[0], step=timedelta(seconds=15)), "table",
                   (runs[1], summarize(runs[1], step=timedelta(seconds=15))))
    assert "CMP" in table and "COMPARE" in table
    assert any(line.startswith("scale_downs:") and line.split()[1:] == ["0", "1"]
               for line in table.splitlines())


def test_an_invalid_autoscaler_is_an_input_error() -> None:
    with pytest.raises(ReplayInputError, match=r"autoscaler\.apiVersion"):
        simulate(autoscaler={**EXTERNAL, "apiVersion": None}, times=[T0], initial_replicas=1,
                 startup=timedelta(), observations=[(Observation(1.0),)])


def test_carrying_models_decides_exactly_as_reparsing_every_snapshot() -> None:
    both = {**EXTERNAL, "spec": {**EXTERNAL["spec"], "maxReplicas": 12, "metrics": [
        {"type": "Pods", "pods": {"metric": {"name": "rps"}, "target": {
            "type": "AverageValue", "averageValue": "10"}}},
        {"type": "Resource", "resource": {"name": "cpu", "target": {
            "type": "Utilization", "averageUtilization": 60}}},
        *EXTERNAL["spec"]["metrics"]],
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 60, "policies": [
            {"type": "Pods", "value": 1, "periodSeconds": 30}]}}}}
    times = [T0 + timedelta(seconds=15 * i) for i in range(240)]
    observations = [(Observation(None if i % 37 == 5 else 5 + (i % 80), 3),
                     Observation(0.1 + (i % 50) / 100, 3), Observation(float(i % 90)))
                    for i in range(len(times))]
    runs = [simulate(autoscaler=both, times=times, observations=observations,
                     initial_replicas=3, startup=timedelta(seconds=45),
                     requests={"cpu": "250m"}, reparse=reparse) for reparse in (False, True)]
    assert runs[0] == runs[1]
    decided = [s.decided_replicas for s in runs[0]]
    assert len(set(decided)) > 3 and {s.limiting_rule for s in runs[0]} - {None}


@pytest.mark.parametrize("text", ["web", "/web", "shop/", "a/b/c"])
def test_live_names_are_namespace_slash_name(text: str) -> None:
    from cli.replay_live import parse_live_name

    with pytest.raises(ReplayInputError, match="NAMESPACE/NAME"):
        parse_live_name(text)


def test_a_file_and_live_together_are_refused(tmp_path: Any,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from cli.main import main

    assert main(["replay", "x.yaml", "--live", "shop/web", "--prometheus-url",
                 "http://127.0.0.1:9", "--last", "1h"]) == 2
    assert "either AUTOSCALER.yaml or --live" in capsys.readouterr().err


def test_the_targets_replicas_come_from_kube_state_metrics_series_of_its_kind() -> None:
    from cli.replay import _replicas_query

    def of(kind: str) -> str:
        return _replicas_query({"metadata": {"namespace": "shop"}, "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": kind, "name": "db"}}})

    assert of("StatefulSet") == 'kube_statefulset_replicas{namespace="shop",statefulset="db"}'
    assert of("Deployment") == 'kube_deployment_spec_replicas{namespace="shop",deployment="db"}'


# --- without the replay extra ---------------------------------------------------------------

_BLOCKED_IMPORT = """
import sys
from importlib.abc import MetaPathFinder

class Missing(MetaPathFinder):
    # As if the module were not installed (the shared venv keeps it).
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == {module!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Missing())
from cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("module", ["requests", "prometheus_api_client"])
def test_without_the_replay_extra_it_exits_2_naming_the_extra(tmp_path: Any,
                                                              module: str) -> None:
    import subprocess
    import sys

    autoscaler = tmp_path / "autoscaler.yaml"
    autoscaler.write_text("{}", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-c", _BLOCKED_IMPORT.format(module=module), "replay", str(autoscaler),
         "--prometheus-url", "http://127.0.0.1:1", "--last", "1h"],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"metricscale replay: needs the replay extra ({module} is not "
                             "installed): pip install 'metricscale[replay]'\n")
