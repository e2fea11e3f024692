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


def test_resource_metrics_are_refused_until_supported() -> None:
    spec = {**EXTERNAL, "spec": {**EXTERNAL["spec"], "metrics": [
        {"type": "Resource", "resource": {"name": "cpu", "target": {
            "type": "Utilization", "averageUtilization": 50}}}]}}
    with pytest.raises(ReplayInputError, match="not supported"):
        simulate(autoscaler=spec, times=[T0], initial_replicas=1,
                 startup=timedelta(), observations=[(Observation(1.0),)])


def test_an_invalid_autoscaler_is_an_input_error() -> None:
    with pytest.raises(ReplayInputError, match=r"autoscaler\.apiVersion"):
        simulate(autoscaler={**EXTERNAL, "apiVersion": None}, times=[T0], initial_replicas=1,
                 startup=timedelta(), observations=[(Observation(1.0),)])
