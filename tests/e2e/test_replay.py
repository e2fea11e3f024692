"""`metricscale replay` against a real Prometheus whose history promtool backfilled."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli.main import main
from cli.replay_sim import Observation, simulate, summarize
from tests.fakes.prometheus import MetricFamily, PrometheusServer, SeriesSamples
from tests.fakes.prometheus_fixtures import PrometheusFactory

pytestmark = pytest.mark.prometheus

DAY = 86_400
PODS = ("api-a", "api-b")
END = (datetime.now(UTC) - timedelta(hours=3)).replace(minute=0, second=0, microsecond=0)
START = END - timedelta(days=2)

AUTOSCALER: dict[str, Any] = {
    "apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
    "metadata": {"name": "api", "namespace": "shop"},
    "spec": {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "api"},
        "minReplicas": 1, "maxReplicas": 10,
        "metrics": [{"type": "Pods", "pods": {
            "metric": {"name": "http_requests_per_second"},
            "target": {"type": "AverageValue", "averageValue": "10"}}}],
    },
}

RULES = """
rules:
- seriesQuery: 'http_requests_per_second{namespace!="",pod!=""}'
  resources:
    overrides:
      namespace: {resource: namespace}
      pod: {resource: pod}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
"""


def per_pod_rate(stamp: float) -> float:
    """A daily curve: 2 pods serving 2..18 requests/s each, peaking at 06:00 UTC."""
    return round(10 + 8 * math.sin(2 * math.pi * (stamp % DAY) / DAY), 3)


def history() -> list[MetricFamily]:
    stamps = range(int(START.timestamp()) - 600, int(END.timestamp()) + 1, 60)
    return [MetricFamily("http_requests_per_second", "gauge", [
        SeriesSamples({"namespace": "shop", "pod": pod},
                      [(float(ts), per_pod_rate(ts)) for ts in stamps]) for pod in PODS])]


@pytest.fixture(scope="module")
def backfilled(request: pytest.FixtureRequest) -> PrometheusServer:
    factory = PrometheusFactory(request, request.getfixturevalue("prometheus_binary"))
    request.addfinalizer(factory.close)
    return factory(backfill=history())


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    autoscaler = tmp_path / "autoscaler.yaml"
    autoscaler.write_text(yaml.safe_dump(AUTOSCALER))
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    return autoscaler, rules


def _time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_replay_decisions_equal_the_pure_decision_step_by_step(
        backfilled: PrometheusServer, files: tuple[Path, Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    autoscaler, rules = files
    status = main(["replay", str(autoscaler), "--prometheus-url", backfilled.url,
                   "--config", str(rules), "--from", _time(START), "--to", _time(END),
                   "--step", "5m", "--initial-replicas", "2", "-o", "json"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    document = json.loads(captured.out)
    step = timedelta(minutes=5)
    times = [START + step * i for i in range(int((END - START) / step) + 1)]
    expected = simulate(
        autoscaler=AUTOSCALER, times=times, startup=timedelta(seconds=30), initial_replicas=2,
        observations=[(Observation(per_pod_rate(t.timestamp()), len(PODS)),) for t in times])
    assert [row["decidedReplicas"] for row in document["steps"]] == \
        [s.decided_replicas for s in expected]
    assert [row["proposedReplicas"] for row in document["steps"]] == \
        [s.proposed_replicas for s in expected]
    # Closed loop: the total load (2 pods' worth) is spread over the simulated ready pods.
    for row, moment in zip(document["steps"], times, strict=True):
        total = per_pod_rate(moment.timestamp()) * len(PODS)
        assert row["values"][0] == pytest.approx(total / row["readyPods"], abs=1e-6)
    summary = document["summary"]
    decided = [s.decided_replicas for s in expected]
    assert summary == pytest.approx({**summary, **vars(summarize(expected, step=step))})
    assert summary["min_replicas"] == min(decided) and summary["max_replicas"] == max(decided)
    assert summary["replica_hours"] == pytest.approx(sum(decided) * 5 / 60)
    # The daily curve peaks at 36 requests/s: 4 pods at 10 each; the trough 4/s: 1 pod.
    assert summary["max_replicas"] == 4 and summary["min_replicas"] == 1
    assert summary["scale_ups"] >= 2 and summary["scale_downs"] >= 2


def test_replay_with_query_instead_of_rules_gives_the_same_decisions(
        backfilled: PrometheusServer, files: tuple[Path, Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    autoscaler, rules = files
    common = [str(autoscaler), "--prometheus-url", backfilled.url, "--from", _time(START),
              "--to", _time(START + timedelta(hours=6)), "--initial-replicas", "2", "-o", "csv"]
    assert main(["replay", *common, "--config", str(rules)]) == 0
    by_rules = capsys.readouterr().out
    assert main(["replay", *common, "--query",
                 '0=sum(http_requests_per_second{namespace="shop"}) by (pod)']) == 0
    assert capsys.readouterr().out == by_rules
    assert by_rules.count("\n") == 6 * 240 + 2  # header + every 15s step, both ends included


def test_unknown_metric_without_query_exits_2(
        backfilled: PrometheusServer, files: tuple[Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    _, rules = files
    spec = json.loads(json.dumps(AUTOSCALER))
    spec["spec"]["metrics"][0]["pods"]["metric"]["name"] = "no_such_metric"
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(yaml.safe_dump(spec))
    assert main(["replay", str(unknown), "--prometheus-url", backfilled.url, "--config",
                 str(rules), "--last", "1h", "--initial-replicas", "1"]) == 2
    assert "give --query 0=PROMQL" in capsys.readouterr().err


def test_range_without_data_exits_2(backfilled: PrometheusServer, files: tuple[Path, Path],
                                    capsys: pytest.CaptureFixture[str]) -> None:
    autoscaler, rules = files
    early = START - timedelta(days=30)
    assert main(["replay", str(autoscaler), "--prometheus-url", backfilled.url, "--config",
                 str(rules), "--from", _time(early), "--to", _time(early + timedelta(hours=1)),
                 "--initial-replicas", "1"]) == 2
    assert "metricscale replay:" in capsys.readouterr().err
