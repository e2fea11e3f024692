"""`metricscale replay` against a real Prometheus whose history promtool backfilled."""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import struct
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
import yaml

from cli.main import main
from cli.replay_sim import Observation, simulate, summarize
from testbed.controlplane import ControlPlane
from testbed.fakes.prometheus import MetricFamily, PrometheusServer, SeriesSamples
from testbed.fakes.prometheus_fixtures import PrometheusFactory
from testbed.fakes.tools import in_ci
from tests.autoscaler.real_cluster_support import install_crd

pytestmark = pytest.mark.prometheus

DAY = 86_400
PODS = ("api-a", "api-b")
END = (datetime.now(UTC) - timedelta(hours=3)).replace(minute=0, second=0, microsecond=0)
START = END - timedelta(days=7)
# A spike (60 requests/s for 20 minutes) and a gap (no samples for 2 hours: the scrape
# target was down) in the request rate's history.
SPIKE = (START + timedelta(days=3, hours=12), START + timedelta(days=3, hours=12, minutes=20))
GAP = (START + timedelta(days=5), START + timedelta(days=5, hours=2))

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
    """A daily curve: 2 pods serving 2..18 requests/s each, peaking at 06:00 UTC; 30 each
    during the spike."""
    if SPIKE[0].timestamp() <= stamp < SPIKE[1].timestamp():
        return 30.0
    return round(10 + 8 * math.sin(2 * math.pi * (stamp % DAY) / DAY), 3)


def in_gap(stamp: float) -> bool:
    return GAP[0].timestamp() <= stamp < GAP[1].timestamp()


def observed(moment: datetime) -> Observation:
    """What Prometheus answers at `moment`: the newest sample (every 60 s, none in the gap)
    within its 5-minute lookback, else nothing."""
    stamp = int(moment.timestamp())
    first = int(START.timestamp()) - 600
    sample = stamp - (stamp - first) % 60
    while sample >= stamp - 300:
        if not in_gap(sample):
            return Observation(per_pod_rate(sample), len(PODS))
        sample -= 60
    return Observation(None)


# cAdvisor-style CPU counters: each pod's `app` container uses 0.3 cores, `sidecar` 0.05.
CPU_CORES = {"app": 0.3, "sidecar": 0.05}
RESOURCE_RULES = """
resourceRules:
  cpu:
    containerQuery: |
      sum by (<<.GroupBy>>) (
        rate(container_cpu_usage_seconds_total{<<.LabelMatchers>>,container!=""}[3m])
      )
    nodeQuery: 'sum by (<<.GroupBy>>) (rate(node_cpu_seconds_total{<<.LabelMatchers>>}[3m]))'
    resources:
      overrides:
        namespace: {resource: namespace}
        pod: {resource: pod}
        node: {resource: node}
    containerLabel: container
  memory:
    containerQuery: 'sum by (<<.GroupBy>>) (container_memory_working_set_bytes{<<.LabelMatchers>>})'
    nodeQuery: 'sum by (<<.GroupBy>>) (node_memory_working_set_bytes{<<.LabelMatchers>>})'
    resources:
      overrides:
        namespace: {resource: namespace}
        pod: {resource: pod}
        node: {resource: node}
    containerLabel: container
  window: 3m
"""


def history() -> list[MetricFamily]:
    stamps = range(int(START.timestamp()) - 600, int(END.timestamp()) + 1, 60)
    first = int(START.timestamp()) - 600
    return [
        MetricFamily("http_requests_per_second", "gauge", [
            SeriesSamples({"namespace": "shop", "pod": pod},
                          [(float(ts), per_pod_rate(ts)) for ts in stamps if not in_gap(ts)])
            for pod in PODS]),
        MetricFamily("container_cpu_usage_seconds_total", "counter", [
            SeriesSamples({"namespace": "shop", "pod": pod, "container": container},
                          [(float(ts), round(cores * (ts - first), 3)) for ts in stamps])
            for pod in PODS for container, cores in CPU_CORES.items()]),
        # kube-state-metrics: the live Deployment went 2 -> 3 replicas after the first day.
        MetricFamily("kube_deployment_spec_replicas", "gauge", [
            SeriesSamples({"namespace": "shop", "deployment": "api"},
                          [(float(ts), 2 if ts < START.timestamp() + DAY else 3)
                           for ts in stamps])]),
    ]


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
    seen = [observed(t) for t in times]
    expected = simulate(
        autoscaler=AUTOSCALER, times=times, startup=timedelta(seconds=30), initial_replicas=2,
        observations=[(o,) for o in seen])
    # The same, with every step's whole snapshot rendered and parsed as `metricscale explain`
    # parses it: the replay decides as explain does.
    assert [s.decided_replicas for s in simulate(
        autoscaler=AUTOSCALER, times=times, startup=timedelta(seconds=30), initial_replicas=2,
        observations=[(o,) for o in seen], reparse=True)] == \
        [s.decided_replicas for s in expected]
    assert [row["decidedReplicas"] for row in document["steps"]] == \
        [s.decided_replicas for s in expected]
    assert [row["proposedReplicas"] for row in document["steps"]] == \
        [s.proposed_replicas for s in expected]
    # Closed loop: the total load (2 pods' worth) is spread over the simulated ready pods.
    gap_steps = 0
    for row, seen_then in zip(document["steps"], seen, strict=True):
        if seen_then.value is None:  # in the gap: a failed fetch, the size holds
            gap_steps += 1
            assert row["values"][0] is None and row["proposedReplicas"] is None
            continue
        total = seen_then.value * len(PODS)
        assert row["values"][0] == pytest.approx(total / row["readyPods"], abs=1e-6)
    assert gap_steps == 2 * 12 - 1  # 2 h at 5 min, less the first (still in the lookback)
    assert "2 replicas at the start (--initial-replicas)" in document["assumptions"]
    assert any(line.startswith("Pods/Resource metrics: the load is fixed")
               for line in document["assumptions"])
    summary = document["summary"]
    decided = [s.decided_replicas for s in expected]
    assert summary == pytest.approx({**summary, **vars(summarize(expected, step=step))})
    assert summary["min_replicas"] == min(decided) and summary["max_replicas"] == max(decided)
    assert summary["replica_hours"] == pytest.approx(sum(decided) * 5 / 60)
    # The daily curve peaks at 36 requests/s: 4 pods at 10 each; the trough 4/s: 1 pod; the
    # spike (60/s) 6 pods.
    assert summary["max_replicas"] == 6 and summary["min_replicas"] == 1
    spike = [s.decided_replicas for s, t in zip(expected, times, strict=True)
             if SPIKE[0] <= t <= SPIKE[1]]
    assert max(spike) == 6
    assert summary["scale_ups"] >= 2 and summary["scale_downs"] >= 2


def test_a_range_past_the_points_limit_is_read_in_several_queries_and_says_so(
        backfilled: PrometheusServer, files: tuple[Path, Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    """Two days at 15 s are 11,521 steps: more than Prometheus' 11,000 points per series."""
    autoscaler, rules = files
    end = START + timedelta(days=2)
    status = main(["replay", str(autoscaler), "--prometheus-url", backfilled.url,
                   "--config", str(rules), "--from", _time(START), "--to", _time(end),
                   "--step", "15s", "--initial-replicas", "2", "-o", "csv"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert ("11,521 steps: Prometheus answers at most 11,000 points per series in one range "
            "query, so each metric's history is read in 2 range queries") in captured.err
    rows = captured.out.splitlines()
    assert len(rows) > 11_521  # a header, every step, then the summary


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


def _cpu_autoscaler(tmp_path: Path, metric: dict[str, Any], name: str) -> Path:
    spec = json.loads(json.dumps(AUTOSCALER))
    spec["spec"]["metrics"] = [metric]
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize(("metric", "replicas"), [
    # 0.7 cores over 2 pods, request 250m, target 50% (125m a pod): 0.7 / 0.125 -> 6 pods.
    ({"type": "Resource", "resource": {"name": "cpu", "target": {
        "type": "Utilization", "averageUtilization": 50}}}, 6),
    # Only `app`: 0.6 cores / 0.125 -> 5 pods.
    ({"type": "ContainerResource", "containerResource": {"name": "cpu", "container": "app",
                                                         "target": {
        "type": "Utilization", "averageUtilization": 50}}}, 5),
])
def test_resource_metrics_replay_over_cadvisor_counters(
        backfilled: PrometheusServer, tmp_path: Path, metric: dict[str, Any], replicas: int,
        capsys: pytest.CaptureFixture[str]) -> None:
    autoscaler = _cpu_autoscaler(tmp_path, metric, "cpu.yaml")
    rules = tmp_path / "resource-rules.yaml"
    rules.write_text(RESOURCE_RULES)
    status = main(["replay", str(autoscaler), "--prometheus-url", backfilled.url,
                   "--config", str(rules), "--from", _time(START),
                   "--to", _time(START + timedelta(hours=1)), "--step", "1m",
                   "--initial-replicas", "2", "--request", "cpu=250m", "-o", "json"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    steps = json.loads(captured.out)["steps"]
    total = sum(CPU_CORES.values()) if metric["type"] == "Resource" else CPU_CORES["app"]
    assert steps[0]["values"][0] == pytest.approx(total, rel=1e-3)  # 2 pods' total / 2
    # The default scale-up policy allows at most 4 pods (or double) per 15 s.
    assert steps[0]["decidedReplicas"] == 4 and steps[0]["limitingRule"] is not None
    assert steps[-1]["decidedReplicas"] == replicas
    # After the new pods are ready the same total load is spread over them.
    assert steps[-1]["values"][0] == pytest.approx(total * 2 / replicas, rel=1e-3)


def test_compare_and_observed_replicas_side_by_side(
        backfilled: PrometheusServer, files: tuple[Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    autoscaler, rules = files
    eager = json.loads(json.dumps(AUTOSCALER))
    eager["spec"]["behavior"] = {"scaleDown": {"stabilizationWindowSeconds": 0}}
    other = tmp_path / "eager.yaml"
    other.write_text(yaml.safe_dump(eager))
    status = main(["replay", str(autoscaler), "--prometheus-url", backfilled.url,
                   "--config", str(rules), "--from", _time(START), "--to", _time(END),
                   "--step", "5m", "--initial-replicas", "2", "--compare", str(other),
                   "-o", "json"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    document = json.loads(captured.out)
    mine = [row["decidedReplicas"] for row in document["steps"]]
    theirs = [row["decidedReplicas"] for row in document["compare"]["steps"]]
    # Without the 5-minute window the eager spec scales down sooner, so it never runs more
    # pods; except in the spike, where it starts from fewer pods and the closed loop (the
    # same load over fewer ready pods) and the scale-up limit take it along another path.
    assert mine != theirs
    spike = (SPIKE[0] - timedelta(minutes=5), SPIKE[1] + timedelta(minutes=30))
    worse = [(row["time"], a, b) for row, a, b in zip(document["steps"], mine, theirs,
                                                      strict=True)
             if b > a and not spike[0] <= datetime.fromisoformat(row["time"]) <= spike[1]]
    assert not worse, worse[:10]
    assert document["compare"]["summary"]["replica_hours"] < \
        document["summary"]["replica_hours"]
    observed = [row["observedReplicas"] for row in document["steps"]]
    assert observed[0] == 2 and observed[-1] == 3
    assert main(["replay", str(autoscaler), "--prometheus-url", backfilled.url, "--config",
                 str(rules), "--from", _time(START), "--to", _time(START + timedelta(hours=1)),
                 "--initial-replicas", "2", "--compare", str(other)]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split() == ["TIME", "VALUES", "CUR", "PROP", "DEC", "CMP",
                                             "OBS", "LIMIT"]
    assert "AUTOSCALER" in table and "COMPARE" in table
    assert "Assumed:" in table and "one decision every 15 s (the sync period)" in table


@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_plot_is_a_valid_image_with_every_series(
        backfilled: PrometheusServer, files: tuple[Path, Path], tmp_path: Path,
        suffix: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        import matplotlib  # noqa: F401  (the `plot` extra, which make test installs)
    except ImportError:
        if in_ci():
            pytest.fail("matplotlib is not installed; CI=true forbids skipping", pytrace=False)
        pytest.skip("matplotlib is not installed (the `plot` extra)")
    autoscaler, rules = files
    eager = json.loads(json.dumps(AUTOSCALER))
    eager["spec"]["behavior"] = {"scaleDown": {"stabilizationWindowSeconds": 0}}
    other = tmp_path / "eager.yaml"
    other.write_text(yaml.safe_dump(eager))
    image = tmp_path / f"replay.{suffix}"
    assert main(["replay", str(autoscaler), "--prometheus-url", backfilled.url, "--config",
                 str(rules), "--from", _time(START), "--to", _time(END), "--step", "5m",
                 "--initial-replicas", "2", "--compare", str(other),
                 "--plot", str(image)]) == 0, capsys.readouterr().err
    data = image.read_bytes()
    if suffix == "png":
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", data[16:24])
        assert (width, height) == (1100, 650)
        return
    root = ElementTree.fromstring(data)
    ns = "{http://www.w3.org/2000/svg}"
    lines = sorted(g.get("id", "") for g in root.iter(f"{ns}g")
                   if g.get("id", "").startswith("replay-")
                   and len(g.findall(f"{ns}path")) == 1)
    # The metric and its target on top; simulated, compared and observed replicas below.
    assert lines == ["replay-metric-0", "replay-replicas-compared", "replay-replicas-observed",
                     "replay-replicas-simulated", "replay-target-0"]


def test_plot_to_an_unknown_format_exits_2(
        backfilled: PrometheusServer, files: tuple[Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    autoscaler, rules = files
    assert main(["replay", str(autoscaler), "--prometheus-url", backfilled.url, "--config",
                 str(rules), "--last", "1h", "--initial-replicas", "1",
                 "--plot", str(tmp_path / "x.gif")]) == 2
    assert ".png or .svg" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# `replay --live`: the Autoscaler (and the controller's Lease) on the session's real control
# plane. The Autoscaler lives in the test's `namespace`, and replay queries Prometheus with its
# namespace: each test gets a Prometheus of its own, backfilled with the request rate's history
# under that namespace (the part the replays read). The Lease is in the test's namespace too
# (--lease-namespace), not in `metricscale`, where an installed controller may hold its own.


def live_autoscaler(namespace: str) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(json.dumps(AUTOSCALER))
    obj["metadata"]["namespace"] = namespace
    return obj


def live_history(namespace: str, until: datetime) -> list[MetricFamily]:
    """The request rate's history of PODS in `namespace`, up to `until`."""
    stamps = range(int(START.timestamp()) - 600, int(until.timestamp()) + 1, 60)
    return [MetricFamily("http_requests_per_second", "gauge", [
        SeriesSamples({"namespace": namespace, "pod": pod},
                      [(float(ts), per_pod_rate(ts)) for ts in stamps if not in_gap(ts)])
        for pod in PODS])]


@pytest.fixture
def live(control_plane: ControlPlane, namespace: str,
         prometheus_factory: PrometheusFactory) -> PrometheusServer:
    """The Autoscaler CRD established (the shipped one, left installed as every module leaves
    it), Autoscaler `api` in the test's namespace, and a Prometheus with its history."""
    install_crd(control_plane)
    control_plane.apply(live_autoscaler(namespace))
    return prometheus_factory(backfill=live_history(namespace, START + timedelta(hours=12)))


async def test_replay_live_decides_with_the_settings_the_controller_published(
        live: PrometheusServer, control_plane: ControlPlane, namespace: str,
        files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """`replay --live` reads the Autoscaler and the settings the controller published on its
    Lease (a 20 s downscale window here), as `explain --live` does; flags override them."""
    from autoscaler.decision.settings import (
        SETTINGS_ANNOTATION,
        Settings,
        render_settings,
        render_settings_annotation,
    )
    _, rules = files
    common = ["replay", "--live", f"{namespace}/api", "--kubeconfig",
              str(control_plane.kubeconfig), "--lease-namespace", namespace,
              "--prometheus-url", live.url, "--config", str(rules), "--from", _time(START),
              "--to", _time(START + timedelta(hours=12)), "--step", "5m",
              "--initial-replicas", "2", "-o", "json"]

    def replay(*extra: str) -> tuple[list[int], str]:
        status = main([*common, *extra])
        captured = capsys.readouterr()
        assert status == 0, captured.err
        return [row["decidedReplicas"] for row in json.loads(captured.out)["steps"]], \
            captured.err

    defaults, note = await asyncio.to_thread(replay)
    assert "no settings published by the controller; upstream defaults are assumed" in note
    published = Settings(downscale_stabilization_window=timedelta(seconds=20))
    control_plane.apply({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "metricscale-autoscaler", "namespace": namespace,
                     "annotations": {SETTINGS_ANNOTATION:
                                     render_settings_annotation(published)}},
        "spec": {"holderIdentity": "replica-a", "leaseDurationSeconds": 15}})
    controller, note = await asyncio.to_thread(replay)
    assert "settings from the controller" in note
    step = timedelta(minutes=5)
    times = [START + step * i for i in range(int(timedelta(hours=12) / step) + 1)]
    observations = [(Observation(per_pod_rate(t.timestamp()), len(PODS)),) for t in times]
    expected = simulate(autoscaler=AUTOSCALER, times=times, startup=timedelta(seconds=30),
                        initial_replicas=2, observations=observations,
                        settings=render_settings(published))
    assert controller == [s.decided_replicas for s in expected]
    assert controller != defaults  # the 20 s window lets it shrink sooner
    flagged, note = await asyncio.to_thread(
        replay, "--horizontal-pod-autoscaler-downscale-stabilization", "5m")
    assert "settings from the controller and flags" in note
    assert flagged == defaults


@pytest.mark.parametrize("where", ["KUBECONFIG", "~/.kube/config"])
async def test_replay_live_finds_the_cluster_as_every_command_does(
        live: PrometheusServer, control_plane: ControlPlane, namespace: str,
        files: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], where: str) -> None:
    """Without --kubeconfig, `replay --live` reads $KUBECONFIG, else ~/.kube/config (its
    --help says so, and the adapter, the autoscaler, explain and autoscale do so)."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    if where == "KUBECONFIG":
        monkeypatch.setenv("KUBECONFIG", str(shutil.copy(control_plane.kubeconfig,
                                                         tmp_path / "env")))
    else:
        (tmp_path / ".kube").mkdir()
        shutil.copy(control_plane.kubeconfig, tmp_path / ".kube" / "config")
    _, rules = files
    arguments = ["replay", "--live", f"{namespace}/api", "--lease-namespace", namespace,
                 "--prometheus-url", live.url, "--config", str(rules), "--from", _time(START),
                 "--to", _time(START + timedelta(hours=2)), "--step", "5m",
                 "--initial-replicas", "2", "-o", "json"]
    status = await asyncio.to_thread(main, arguments)
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert len(json.loads(captured.out)["steps"]) == 25


def test_replay_reads_prometheus_with_the_adapters_backend_options(
        backfilled: PrometheusServer, files: tuple[Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Headers (a tenant), a bearer token file and the rest of the adapter's backend options
    reach Prometheus (through a recording proxy in front of the real one); bad combinations
    are refused as the adapter refuses them."""
    import http.server
    import threading
    import urllib.request

    seen: list[dict[str, str]] = []

    class Proxy(http.server.BaseHTTPRequestHandler):
        def _forward(self) -> None:
            seen.append({k.lower(): v for k, v in self.headers.items()})
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            upstream = urllib.request.Request(backfilled.url + self.path, data=body,
                                              method=self.command)
            if self.headers.get("Content-Type"):
                upstream.add_header("Content-Type", self.headers["Content-Type"])
            with urllib.request.urlopen(upstream, timeout=30) as answer:
                payload = answer.read()
                self.send_response(answer.status)
                self.send_header("Content-Type", answer.headers.get("Content-Type", ""))
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        do_GET = do_POST = _forward

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        token = tmp_path / "token"
        token.write_text("s3cret\n")
        autoscaler, rules = files
        url = f"http://127.0.0.1:{server.server_address[1]}"
        args = ["replay", str(autoscaler), "--prometheus-url", url, "--config", str(rules),
                "--from", _time(START), "--to", _time(START + timedelta(hours=2)),
                "--step", "5m", "--initial-replicas", "2", "-o", "json",
                "--prometheus-header", "X-Scope-OrgID=shop"]
        assert main([*args, "--prometheus-token-file", str(token)]) == 0, capsys.readouterr()
        assert seen and all(h.get("x-scope-orgid") == "shop" for h in seen)
        assert all(h.get("authorization") == "Bearer s3cret" for h in seen)
        capsys.readouterr()
        password = tmp_path / "password"
        password.write_text("pw")
        assert main([*args, "--prometheus-token-file", str(token), "--prometheus-username",
                     "u", "--prometheus-password-file", str(password)]) == 2
        assert "use either a bearer token file or basic auth, not both" in \
            capsys.readouterr().err
        seen.clear()
        assert main([*args, "--prometheus-username", "u", "--prometheus-password-file",
                     str(password)]) == 0
        assert seen and all(h.get("authorization", "").startswith("Basic ") for h in seen)
    finally:
        server.shutdown()
    capsys.readouterr()
    assert main([*args[:2], "--prometheus-url", "http://127.0.0.1:1", *args[4:]]) == 1
    assert "cannot reach Prometheus at http://127.0.0.1:1" in capsys.readouterr().err
