"""Benchmark: `metricscale replay` over 7 days at 15 s steps (40,320 decisions), two metrics.

Run: `.venv/bin/python bench/replay.py [--days N]`. A Prometheus of its own is backfilled with
promtool (a Pods metric over 3 pods and an External queue depth, one sample a minute), then
the replay runs in-process exactly as the command does. Printed: the total time, the time
spent reading Prometheus, and the time spent in the simulation with its share in the
decision itself (`decide_snapshot` with `parse_snapshot`; the rest is building snapshots).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cli.replay_sim as replay_sim
from cli.replay import add_arguments, replay_steps
from testbed.fakes.prometheus import (
    MetricFamily,
    PrometheusServer,
    SeriesSamples,
    find_prometheus,
    find_promtool,
)

DAY = 86_400
AUTOSCALER: dict[str, Any] = {
    "apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
    "metadata": {"name": "api", "namespace": "shop"},
    "spec": {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "api"},
        "minReplicas": 1, "maxReplicas": 20,
        "metrics": [
            {"type": "Pods", "pods": {"metric": {"name": "http_requests_per_second"},
                                      "target": {"type": "AverageValue",
                                                 "averageValue": "10"}}},
            {"type": "External", "external": {"metric": {"name": "queue_depth"},
                                              "target": {"type": "AverageValue",
                                                         "averageValue": "30"}}},
        ],
    },
}


def history(start: datetime, end: datetime) -> list[MetricFamily]:
    stamps = range(int(start.timestamp()) - 600, int(end.timestamp()) + 1, 60)

    def rate(ts: int, pod: int) -> float:
        return round(12 + 9 * math.sin(2 * math.pi * (ts % DAY) / DAY + pod), 3)

    return [
        MetricFamily("http_requests_per_second", "gauge", [
            SeriesSamples({"namespace": "shop", "pod": f"api-{pod}"},
                          [(float(ts), rate(ts, pod)) for ts in stamps]) for pod in range(3)]),
        MetricFamily("queue_depth", "gauge", [
            SeriesSamples({"queue": "orders"},
                          [(float(ts), round(60 + 50 * math.cos(2 * math.pi * ts / 21_600), 1))
                           for ts in stamps])]),
    ]


def timed(function: Callable[..., Any], totals: list[float]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            totals[0] += time.perf_counter() - began
    return wrapper


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--plot", metavar="FILE.png", help="also draw the replay (untimed)")
    options = parser.parse_args()
    prometheus = find_prometheus()
    promtool = find_promtool(prometheus)
    if prometheus is None or promtool is None:
        print("bench/replay.py needs prometheus and promtool on the PATH", file=sys.stderr)
        return 2
    end = (datetime.now(UTC) - timedelta(hours=3)).replace(minute=0, second=0, microsecond=0)
    start = end - timedelta(days=options.days)
    server = PrometheusServer(binary=prometheus, promtool=promtool)
    with tempfile.TemporaryDirectory() as workdir:
        began = time.perf_counter()
        server.backfill(history(start, end))
        server.start()
        print(f"backfill and start: {time.perf_counter() - began:.1f} s")
        path = Path(workdir) / "autoscaler.yaml"
        path.write_text(yaml.safe_dump(AUTOSCALER))
        replay_parser = argparse.ArgumentParser()
        add_arguments(replay_parser)
        args = replay_parser.parse_args([
            str(path), "--prometheus-url", server.url, "--initial-replicas", "3",
            "--from", start.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "--to", end.strftime("%Y-%m-%dT%H:%M:%SZ"), "--step", "15s",
            "--query", '0=sum(http_requests_per_second{namespace="shop"}) by (pod)',
            "--query", "1=sum(queue_depth)"])
        from prometheus_api_client import PrometheusConnect

        client = PrometheusConnect(url=server.url)
        decision, simulation = [0.0], [0.0]
        original_decide, original_parse = replay_sim.decide_snapshot, replay_sim.parse_snapshot
        original_simulate = replay_sim.simulate
        replay_sim.decide_snapshot = timed(original_decide, decision)  # type: ignore[assignment]
        replay_sim.parse_snapshot = timed(original_parse, decision)  # type: ignore[assignment]
        import cli.replay as replay_module
        replay_module.simulate = timed(original_simulate, simulation)  # type: ignore[assignment]
        try:
            began = time.perf_counter()
            result = replay_steps(args, client)
            total = time.perf_counter() - began
        finally:
            replay_sim.decide_snapshot, replay_sim.parse_snapshot = \
                original_decide, original_parse
            replay_module.simulate = original_simulate  # type: ignore[assignment]
            server.close()
    if options.plot:
        from cli.replay_plot import plot_replay

        plot_replay(options.plot, autoscaler=AUTOSCALER, steps=result.steps,
                    title=f"metricscale replay: api, {options.days} days at 15 s")
    steps = len(result.steps)
    reading = total - simulation[0]
    print(f"decisions: {steps:,} ({options.days} days at 15 s, 2 metrics)")
    print(f"total: {total:.2f} s ({steps / total:,.0f} decisions/s)")
    print(f"reading Prometheus: {reading:.2f} s ({reading / total:.0%})")
    print(f"simulation: {simulation[0]:.2f} s ({simulation[0] / total:.0%}), of which "
          f"parse+decide {decision[0]:.2f} s ({decision[0] / total:.0%} of the total), "
          f"building snapshots {simulation[0] - decision[0]:.2f} s")
    print(f"summary: {result.summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
