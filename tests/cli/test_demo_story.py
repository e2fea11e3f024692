"""The demo's story holds on a busy machine: each steady load sits inside the HPA's tolerance
with room on both sides, the lines it prints agree with themselves, a failure names the
Autoscaler that failed, and the replay's summary reads as figures, not raw floats."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import Any

import pytest

from cli import demo

TOLERANCE = Decimal("0.1")  # upstream's default, which the demo's controller keeps


@dataclass(frozen=True)
class Steady:
    what: str
    total: Decimal  # the load, in the metric's unit (requests/s or cores)
    per_pod_target: Decimal
    replicas: int
    arrives: str  # "" (held from the start), "up" or "down": how the story gets there

    @property
    def ratio(self) -> Decimal:
        return self.total / (self.replicas * self.per_pod_target)

    @property
    def pods_worth(self) -> Decimal:
        return self.total / self.per_pod_target


def _count(total: Decimal, per_pod_target: Decimal) -> int:
    """The count a steady `total` asks for at `per_pod_target` a pod (ceil, within min/max)."""
    wanted = int((total / per_pod_target).to_integral_value(rounding=ROUND_CEILING))
    return min(max(wanted, demo.MIN_REPLICAS), demo.MAX_REPLICAS)


def steady_states() -> list[Steady]:
    """Where the story holds a load steady: web at the start, at the top and after the fall;
    php-apache idle and busy."""
    cpu_target = demo.CPU_REQUEST * demo.CPU_TARGET_PERCENT / 100
    start = sum(demo.INITIAL_RATES.values(), Decimal(0))
    web = demo.TARGET_PER_POD
    return [
        Steady("web at the start", start, web, len(demo.INITIAL_RATES), ""),
        Steady("web at the top", demo.HIGH_LOAD, web, _count(demo.HIGH_LOAD, web), "up"),
        Steady("web after the fall", demo.LOW_LOAD, web, _count(demo.LOW_LOAD, web), "down"),
        Steady("php-apache idle", demo.CPU_IDLE, cpu_target,
               _count(demo.CPU_IDLE, cpu_target), ""),
        Steady("php-apache busy", demo.CPU_BUSY, cpu_target,
               _count(demo.CPU_BUSY, cpu_target), "up"),
        Steady("php-apache idle again", demo.CPU_IDLE, cpu_target,
               _count(demo.CPU_IDLE, cpu_target), "down"),
    ]


def holding_band(replicas: int) -> tuple[Decimal | None, Decimal | None]:
    """The usage ratios between which `replicas` stays (None: no bound that way). Upstream
    changes nothing within the tolerance, and beyond it asks for ceil(ratio * replicas): the
    count rises above 1 + tolerance and falls at or below (replicas - 1) / replicas (or below
    1 - tolerance, if that is lower); the minimum and maximum hold whatever the ratio."""
    high = None if replicas >= demo.MAX_REPLICAS else 1 + TOLERANCE
    low = None if replicas <= demo.MIN_REPLICAS else min(
        1 - TOLERANCE, Decimal(replicas - 1) / replicas)
    return low, high


@pytest.mark.parametrize("state", steady_states(), ids=lambda state: state.what)
def test_each_steady_load_holds_with_room_on_both_sides(state: Steady) -> None:
    """A reading off by more than the tolerance, either way, leaves the count where it is."""
    ratio = state.ratio
    low, high = holding_band(state.replicas)
    if low is not None:
        assert 1 - low / ratio > TOLERANCE, f"{state.what}: {ratio:.3f}, falls at {low:.3f}"
    if high is not None:
        assert high / ratio - 1 > TOLERANCE, f"{state.what}: {ratio:.3f}, rises past {high}"
    if not state.arrives and low is not None:  # held from the start: by the tolerance itself
        assert abs(ratio - 1) < TOLERANCE, f"{state.what}: {ratio:.3f} of the target"


@pytest.mark.parametrize("state", [s for s in steady_states() if s.arrives],
                         ids=lambda state: state.what)
def test_each_count_the_story_moves_to_is_reached_with_room(state: Steady) -> None:
    """Far from the current count the tolerance does not apply: the count asked for is
    ceil(load / target a pod). A scale-up gets there once the reading is more than
    `replicas - 1` pods' worth, a scale-down once it is at most `replicas` pods' worth; either
    with room for a reading off by more than the tolerance. (A scale-down's readings run high
    for a while: a removed pod's series stays in a rate() window, which the replay, selecting
    pods by name, sums. A 2-pod end inside the tolerance, 9 to 10 requests/s, would leave it
    at most 10%: the replay then ended at 3 on 10.07 requests/s with the load at 9.5.)"""
    worth = state.pods_worth
    if state.arrives == "up":
        assert worth / (state.replicas - 1) - 1 > TOLERANCE, f"{state.what}: {worth:.2f}"
    elif state.replicas > demo.MIN_REPLICAS:
        assert state.replicas / worth - 1 > TOLERANCE, f"{state.what}: {worth:.2f}"
    else:
        assert worth <= state.replicas


def test_the_story_names_the_counts_of_its_steady_states() -> None:
    by_name = {state.what: state.replicas for state in steady_states()}
    assert by_name["web at the start"] == 3
    assert demo.story_counts() == (by_name["web at the top"], by_name["web after the fall"],
                                   by_name["php-apache busy"])


# --- the lines the demo prints while it watches ---------------------------------------------------


class Store:
    """The two reads the Reporter makes of the fake cluster's store."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}

    def try_get(self, group: str, version: str, resource: str, name: str, *,
                namespace: str | None = None) -> dict[str, Any] | None:
        return self.objects.get(f"{resource}/{name}")


class Kube:
    def __init__(self) -> None:
        self.store = Store()

    def show(self, name: str, *, replicas: int, desired: int | None,
             reasons: Mapping[str, str] | None = None) -> None:
        self.store.objects[f"deployments/{name}"] = {"spec": {"replicas": replicas}}
        status: dict[str, Any] = {} if desired is None else {
            "desiredReplicas": desired, "currentReplicas": replicas,
            "conditions": [{"type": kind, "status": "True", "reason": reason,
                            "message": f"{kind} says {reason}"}
                           for kind, reason in (reasons or {}).items()]}
        self.store.objects[f"autoscalers/{name}"] = {"status": status}


class Load:
    def __init__(self, app: str) -> None:
        self.app = app
        self.load_text = "39/s"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _reporter(kube: Kube, clock: Clock | None = None, app: str = "web") -> Any:
    timing = {} if clock is None else {"clock": clock}
    return demo.Reporter(kube=kube, workload=Load(app), started=0.0,  # type: ignore[arg-type]
                         **timing)


def test_a_scale_line_waits_for_the_status_that_explains_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    kube = Kube()
    reporter = _reporter(kube)
    kube.show("web", replicas=1, desired=1, reasons={"AbleToScale": "ReadyForNewScale"})
    reporter.report()
    # The scale write lands before the status write: the old status says desired 1.
    kube.show("web", replicas=2, desired=1, reasons={"AbleToScale": "ReadyForNewScale"})
    reporter.report()
    kube.show("web", replicas=2, desired=2, reasons={"AbleToScale": "SucceededRescale"})
    assert reporter.report().replicas == 2
    # Down with a stabilized status still in place: 8 -> 7 must not say desired 8.
    kube.show("web", replicas=8, desired=8, reasons={"AbleToScale": "ScaleDownStabilized"})
    reporter.report()
    kube.show("web", replicas=7, desired=8, reasons={"AbleToScale": "ScaleDownStabilized"})
    reporter.report()
    kube.show("web", replicas=7, desired=7, reasons={"AbleToScale": "SucceededRescale"})
    reporter.report()
    lines = capsys.readouterr().out.splitlines()
    scaled = [line for line in lines if "scaled" in line]
    assert [line.split("replicas ")[1][:18] for line in scaled] == [
        "1 -> 2 scaled up  ", "2 -> 8 scaled up  ", "8 -> 7 scaled down"], lines
    assert "desired  2" in scaled[0] and "SucceededRescale" in scaled[0], scaled[0]
    assert "desired  7" in scaled[2] and "SucceededRescale" in scaled[2], scaled[2]
    assert (reporter.ups, reporter.downs) == (2, 1)


def test_a_scale_whose_status_never_comes_is_shown_as_it_is(
        capsys: pytest.CaptureFixture[str]) -> None:
    kube, clock = Kube(), Clock()
    reporter = _reporter(kube, clock)
    kube.show("web", replicas=3, desired=3)
    reporter.report()
    kube.show("web", replicas=4, desired=3)  # someone else scaled it
    reporter.report()
    clock.now += demo.STATUS_PATIENCE_SECONDS + 0.1
    assert reporter.report().replicas == 4
    [line] = [line for line in capsys.readouterr().out.splitlines() if "scaled" in line]
    assert "3 -> 4 scaled up" in line and "desired  3" in line


async def test_a_failed_wait_shows_the_status_of_the_autoscaler_it_waited_for(
        tmp_path: Path) -> None:
    kube, clock = Kube(), Clock()
    kube.show("web", replicas=2, desired=2, reasons={"ScalingActive": "ValidMetricFound"})
    kube.show("php-apache", replicas=1, desired=1,
              reasons={"ScalingActive": "FailedGetResourceMetric"})
    log = tmp_path / "autoscaler.log"
    log.write_text("the controller's last words\n")
    act = demo.Act(reporter=_reporter(kube, clock, "php-apache"), log_file=log,
                   alive=lambda: None)
    with pytest.raises(demo.DemoError) as failed:  # within=0: one look, then it is over
        await act.until(lambda o: False, within=0.0, what="a scale-up of php-apache")
    message = str(failed.value)
    assert "a scale-up of php-apache did not happen" in message
    assert "Autoscaler demo/php-apache" in message
    assert "FailedGetResourceMetric" in message and "ValidMetricFound" not in message
    assert "the controller's last words" in message


# --- the replay's summary ----------------------------------------------------------------------


def test_the_replay_summary_reads_as_figures() -> None:
    from cli.replay_sim import Summary

    summary = Summary(steps=19, scale_ups=3, scale_downs=4, min_replicas=2, max_replicas=8,
                      mean_replicas=5.052631578947368, replica_hours=0.028055555555555556,
                      seconds_above_target=7.0)
    shown = demo.readable_summary(summary)
    assert (shown.mean_replicas, shown.replica_hours, shown.seconds_above_target) == (
        5.05, 0.0281, 7.0)
    assert (shown.steps, shown.scale_ups, shown.max_replicas) == (19, 3, 8)


# --- the real control plane's story: upstream's HPA and ours, one pod a step ------------------


@dataclass(frozen=True)
class Walked:
    what: str
    count: int
    load: Decimal
    per_pod_target: Decimal
    last: bool  # where the walk stops

    @property
    def ratio(self) -> Decimal:
        return self.load / (self.count * self.per_pod_target)


def walked_counts() -> list[Walked]:
    """Every count the twins pass through on the real control plane, with the load then."""
    from testbed import demo_cluster

    passed: list[Walked] = []
    for name, profile in demo_cluster.PROFILES.items():
        for load, counts in zip(profile.loads, profile.walks(), strict=True):
            passed += [Walked(f"{name} at {n} under {load}", n, load, profile.per_pod,
                              n == counts[-1]) for n in counts]
    return passed


# The readings are exact on the real control plane (whole gauges; CPU counters stamped with
# their time), so a step needs only a clear margin past the tolerance, not room for a reading
# off by the tolerance itself.
STEP_MARGIN = Decimal("0.03")


@pytest.mark.parametrize("state", [w for w in walked_counts() if not w.last],
                         ids=lambda state: state.what)
def test_each_count_the_twins_pass_asks_for_the_next_clearly(state: Walked) -> None:
    """Beyond the tolerance with a margin, so both controllers step on from it whenever
    they sync; the step is one pod either way, whatever the count asked for."""
    ratio = state.ratio
    assert abs(ratio - 1) > TOLERANCE + STEP_MARGIN, f"{state.what}: {ratio:.3f}"
    assert _count(state.load, state.per_pod_target) != state.count, state.what


@pytest.mark.parametrize("state", [w for w in walked_counts() if w.last],
                         ids=lambda state: state.what)
def test_each_count_the_twins_stop_at_holds_with_room(state: Walked) -> None:
    """Inside the tolerance (or at the minimum, or where rounding up asks for it), so neither
    controller moves past it, with room for the margin either way."""
    ratio = state.ratio
    if abs(ratio - 1) <= TOLERANCE:
        assert abs(ratio - 1) < TOLERANCE - STEP_MARGIN / 2, f"{state.what}: {ratio:.3f}"
    else:
        assert _count(state.load, state.per_pod_target) == state.count, state.what
        low, _ = holding_band(state.count)
        assert low is None or ratio / low - 1 > STEP_MARGIN, f"{state.what}: {ratio:.3f}"


def test_the_real_story_walks_up_and_back_down_one_pod_at_a_time() -> None:
    from testbed import demo_cluster

    cpu_target = demo.CPU_REQUEST * demo.CPU_TARGET_PERCENT / 100
    assert [(p.start, p.per_pod) for p in demo_cluster.PROFILES.values()] == [
        (3, demo.TARGET_PER_POD), (1, cpu_target)]
    walks = demo_cluster.story_walks()
    assert walks["web"] == [3, 4, 5, 6, 7, 8, 7, 6, 5, 4, 3, 2]
    assert walks["php-apache"] == [1, 2, 3, 4, 5, 4, 3, 2, 1]
    # The same tops and ends as the fake cluster's story.
    up_to, down_to, cpu_up_to = demo.story_counts()
    assert (max(walks["web"]), walks["web"][-1], max(walks["php-apache"])) == (
        up_to, down_to, cpu_up_to)


def test_the_twins_have_the_same_spec_but_for_their_targets() -> None:
    from testbed import demo_cluster

    for name, metrics in (("web", demo_cluster.web_metrics()),
                          ("php-apache", demo_cluster.cpu_metrics())):
        upstream, ours = demo_cluster.twin_manifests(name, metrics, demo.FAST)
        assert (upstream["apiVersion"], upstream["kind"]) == (
            "autoscaling/v2", "HorizontalPodAutoscaler")
        assert (ours["apiVersion"], ours["kind"]) == ("metricscale.dev/v1alpha1", "Autoscaler")
        assert upstream["spec"]["scaleTargetRef"]["name"] == upstream["metadata"]["name"] == \
            f"{name}-upstream"
        assert ours["spec"]["scaleTargetRef"]["name"] == ours["metadata"]["name"] == name
        strip = {"scaleTargetRef": None}
        assert {**upstream["spec"], **strip} == {**ours["spec"], **strip}
        behavior = ours["spec"]["behavior"]
        for way in ("scaleUp", "scaleDown"):
            assert behavior[way]["policies"] == [
                {"type": "Pods", "value": 1, "periodSeconds": demo.FAST.sync_period_seconds}]
        assert behavior["scaleDown"]["stabilizationWindowSeconds"] == \
            demo.FAST.scale_down_window_seconds


def test_the_side_by_side_line_agrees_only_on_the_same_sizes() -> None:
    from testbed import demo_cluster

    upstream = [(0.0, 3), (10.0, 4), (11.0, 5), (20.0, 4)]
    ours = [(0.0, 3), (10.4, 4), (11.8, 5), (19.9, 4)]
    agreed = demo_cluster.compare_twins(upstream, ours, period=1)
    line = demo_cluster.format_side_by_side(agreed, what="CPU")
    assert line == ("Upstream's HPA and ours on CPU: AGREE: both went 3 -> 4 -> 5 -> 4 (3 steps; "
                    "like steps at most 0.8 s apart, the sync period is 1 s)")
    late = demo_cluster.compare_twins(upstream, [(0.0, 3), (16.0, 4), (17.0, 5), (21.0, 4)],
                                      period=1)
    assert late.agrees and "further apart than a sync period where" in \
        demo_cluster.format_side_by_side(late, what="CPU")
    differ = demo_cluster.compare_twins(upstream, [(0.0, 3), (10.0, 5), (20.0, 4)], period=1)
    assert demo_cluster.format_side_by_side(differ, what="CPU") == (
        "Upstream's HPA and ours on CPU: DIFFER: upstream's HPA went 3 -> 4 -> 5 -> 4, ours "
        "went 3 -> 5 -> 4")


def test_a_row_says_whether_the_twins_agree_at_that_moment() -> None:
    from testbed import demo_cluster

    row = demo_cluster.format_row(seconds=12.34, load="40/s", upstream=4, ours=5)
    assert row == "    12.3s    40/s               4     5  differ"
    assert demo_cluster.format_row(seconds=1, load="470m", upstream=5, ours=5).endswith("agree")
    assert "     -     -  agree" in demo_cluster.format_row(seconds=1, load="8/s", upstream=None,
                                                           ours=None)
    header = demo_cluster.TABLE_HEADER
    assert header.index("ours") + len("ours") == len(row.rsplit("  ", 1)[0])
