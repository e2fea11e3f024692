"""`metricscale replay --plot`: the replay as a PNG or SVG (matplotlib, imported only here).

Top: each metric as the decision saw it, against its target (dashed). Below: replicas,
simulated (and compared, and observed when Prometheus has kube-state-metrics), with each
simulated scale-up (^) and scale-down (v) marked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from cli.replay_sim import ReplayInputError, Step

INSTALL_HINT = ("--plot needs matplotlib: pip install 'metricscale[plot]' "
                "(or pip install 'matplotlib>=3.7')")


def metric_targets(autoscaler: Mapping[str, Any],
                   requests: Mapping[str, str] | None = None) -> list[float | None]:
    """Each metric's target in the unit the replay shows its value in (None: unknown)."""
    from metricscale.core.quantity import parse_quantity

    out: list[float | None] = []
    for spec in autoscaler["spec"]["metrics"]:
        kind = spec.get("type", "")
        body = spec.get(kind[:1].lower() + kind[1:]) or {}
        target = body.get("target") or {}
        text = target.get("averageValue") or target.get("value")
        try:
            if text is not None:
                out.append(float(parse_quantity(str(text))))
            elif target.get("averageUtilization") is not None and requests and \
                    body.get("name") in requests:
                request = float(parse_quantity(requests[body["name"]]))
                out.append(request * float(target["averageUtilization"]) / 100)
            else:
                out.append(None)
        except ValueError:
            out.append(None)
    return out


def metric_labels(autoscaler: Mapping[str, Any]) -> list[str]:
    labels = []
    for spec in autoscaler["spec"]["metrics"]:
        kind = spec.get("type", "")
        body = spec.get(kind[:1].lower() + kind[1:]) or {}
        name = (body.get("metric") or {}).get("name") or body.get("name") or "?"
        labels.append(f"{kind} {name}")
    return labels


def plot_replay(path: str, *, autoscaler: Mapping[str, Any], steps: Sequence[Step],
                compare: Sequence[Step] | None = None,
                observed: Sequence[int | None] | None = None,
                requests: Mapping[str, str] | None = None, title: str = "") -> int:
    """Write the figure to `path` (.png or .svg); return the number of line series drawn.

    Each series carries a `replay-…` gid (the id of its group in an SVG)."""
    if not path.lower().endswith((".png", ".svg")):
        raise ReplayInputError(f"--plot {path!r}: the file must end in .png or .svg")
    try:
        import matplotlib
    except ImportError:
        raise ReplayInputError(INSTALL_HINT) from None
    matplotlib.use("Agg")
    from matplotlib import pyplot
    from matplotlib.figure import Figure

    times: list[datetime] = [s.time for s in steps]
    figure: Figure = pyplot.figure(figsize=(11, 6.5))
    try:
        top, bottom = figure.subplots(2, 1, sharex=True, height_ratios=[1, 1])
        series = 0
        targets = metric_targets(autoscaler, requests)
        for index, (label, target) in enumerate(zip(metric_labels(autoscaler), targets,
                                                    strict=True)):
            values = [float("nan") if s.values[index] is None else s.values[index]
                      for s in steps]
            line = top.plot(times, values, label=f"{label} (per ready pod / as seen)",
                            gid=f"replay-metric-{index}")[0]
            series += 1
            if target is not None:
                top.plot(times, [target] * len(times), linestyle="--",
                         color=line.get_color(), label=f"{label} target {target:g}",
                         gid=f"replay-target-{index}")
                series += 1
        top.set_ylabel("metric")
        top.legend(loc="upper left", fontsize="small")
        top.grid(alpha=0.3)
        top.set_title(title or "metricscale replay")

        bottom.step(times, [s.decided_replicas for s in steps], where="post",
                    label="simulated", linewidth=2, gid="replay-replicas-simulated")
        series += 1
        if compare is not None:
            bottom.step(times, [s.decided_replicas for s in compare], where="post",
                        label="compared", linestyle="--", gid="replay-replicas-compared")
            series += 1
        if observed is not None:
            bottom.step(times, [float("nan") if v is None else v for v in observed],
                        where="post", label="observed", color="black", alpha=0.6,
                        gid="replay-replicas-observed")
            series += 1
        ups = [s for s in steps if s.decided_replicas > s.current_replicas]
        downs = [s for s in steps if s.decided_replicas < s.current_replicas]
        if ups:
            bottom.scatter([s.time for s in ups], [s.decided_replicas for s in ups],
                           marker="^", color="tab:red", zorder=3, label="scale up")
        if downs:
            bottom.scatter([s.time for s in downs], [s.decided_replicas for s in downs],
                           marker="v", color="tab:green", zorder=3, label="scale down")
        from matplotlib.ticker import MaxNLocator

        bottom.yaxis.set_major_locator(MaxNLocator(integer=True))
        bottom.set_ylabel("replicas")
        bottom.set_xlabel("time (UTC)")
        bottom.legend(loc="upper left", fontsize="small")
        bottom.grid(alpha=0.3)
        figure.autofmt_xdate()
        figure.tight_layout()
        figure.savefig(path)
    finally:
        pyplot.close(figure)
    return series
