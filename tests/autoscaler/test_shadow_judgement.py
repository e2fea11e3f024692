"""Shadow mode's judgement (autoscaler.decision.shadow): when a shadow decision agrees with the
HPA's, when it differs, what is left out of the agreement rate, which rescales of
kube-controller-manager become scale events, and which differences are worth an Event."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from autoscaler.decision.settings import Settings
from autoscaler.decision.shadow import (
    AGREE,
    DIFFER,
    SHADOW_EVENT_REASON,
    UNJUDGED,
    WARMUP,
    Seen,
    ShadowDecision,
    ShadowState,
    consistency_wait,
    decision_moment,
    describe_entry,
    difference_event,
    hpa_decision,
    judgement_grace,
    next_decision_in,
    note_status,
    observe_status,
    parse_entry,
    phase_lead,
    record_decision,
    render_entry,
    rendered_history,
    settle,
    start_state,
    upstream_rescale,
    warmup_period,
)
from autoscaler.model.fields import ModelError, Quantity
from autoscaler.model.history import History, Recommendation
from autoscaler.model.spec import (
    Behavior,
    MetricIdentifier,
    ScalingPolicy,
    ScalingRules,
    parse_spec,
)
from autoscaler.model.status import (
    AutoscalerStatus,
    Condition,
    MetricStatus,
    MetricValueStatus,
    PodsMetricStatus,
)

T0 = datetime(2026, 11, 21, 10, 0, 0, tzinfo=UTC)
SYNC = timedelta(seconds=15)
GRACE = judgement_grace(SYNC)
KEEP = GRACE * 4
ABLE = (Condition("AbleToScale", "True", "ReadyForNewScale"),)
BEHAVIOR = Behavior(
    scale_up=ScalingRules(stabilization_window_seconds=0, select_policy="Max",
                          policies=(ScalingPolicy("Pods", 2, 60),)),
    scale_down=ScalingRules(stabilization_window_seconds=120,
                            policies=(ScalingPolicy("Percent", 50, 30),)))


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def status(current: int, desired: int, *, scaled_at: float | None = None,
           reconciled: bool = True) -> AutoscalerStatus:
    return AutoscalerStatus(current_replicas=current, desired_replicas=desired,
                            last_scale_time=at(scaled_at) if scaled_at is not None else None,
                            conditions=ABLE if reconciled else ())


def decision(seconds: float, current: int, replicas: int, *, warmup: bool = False,
             metrics: tuple[MetricStatus, ...] = ()) -> ShadowDecision:
    return ShadowDecision(at=at(seconds), current=current, replicas=replicas,
                          reason="pods metric qps above target" if replicas > current else "",
                          due=at(seconds) + GRACE, warmup=warmup, metrics=metrics)


def seen_at(state: ShadowState, seconds: float, current: int, desired: int,
            metrics: tuple[MetricStatus, ...] = ()) -> ShadowState:
    return note_status(state, Seen(current, desired, metrics), now=at(seconds), keep=KEEP)


def pods_metric(average: str) -> tuple[MetricStatus, ...]:
    """status.currentMetrics of one Pods metric `qps` at this average."""
    return (MetricStatus(type="Pods", pods=PodsMetricStatus(
        metric=MetricIdentifier(name="qps"),
        current=MetricValueStatus(average_value=Quantity.parse(average)))),)


def observe(state: ShadowState, seconds: float, before: AutoscalerStatus | None,
            after: AutoscalerStatus) -> tuple[ShadowState, list[str]]:
    state, verdicts = observe_status(state, before=before, after=after, behavior=BEHAVIOR,
                                     now=at(seconds), keep=KEEP)
    return state, [v.result for v in verdicts]


# ------------------------------------------------------------------------- agreement


def test_a_decision_the_hpas_status_already_shows_agrees_at_once() -> None:
    state = seen_at(ShadowState(), 0, 3, 3)
    state, verdicts = record_decision(state, decision(5, 3, 3))
    assert [v.result for v in verdicts] == [AGREE] and not state.pending


def test_a_decision_ahead_of_the_hpa_agrees_when_the_hpa_makes_it_within_the_grace() -> None:
    state = seen_at(ShadowState(), 0, 3, 3)
    state, verdicts = record_decision(state, decision(5, 3, 5))
    assert verdicts == [] and len(state.pending) == 1
    state, results = observe(state, 12, status(3, 3), status(3, 5, scaled_at=12))
    assert results == [AGREE] and not state.pending


def test_a_decision_the_hpa_never_makes_differs_once_the_grace_is_over() -> None:
    state = seen_at(ShadowState(), 0, 3, 3)
    state, _ = record_decision(state, decision(5, 3, 5))
    state, verdicts = settle(state, at(5) + GRACE)
    assert verdicts == [] and state.pending  # not yet: the HPA may still sync
    state, verdicts = settle(state, at(6) + GRACE)
    assert [(v.result, v.hpa.desired if v.hpa else None) for v in verdicts] == [(DIFFER, 3)]
    assert not state.pending


def test_the_hpas_decision_seen_while_ours_was_computed_still_counts() -> None:
    # The watch brought (3 -> 5) while the shadow read the metrics of its decision made at 5.
    state = seen_at(ShadowState(), 0, 3, 3)
    state = seen_at(state, 5.2, 3, 5)
    state, verdicts = record_decision(state, decision(5, 3, 5))
    assert [v.result for v in verdicts] == [AGREE]


def test_a_decision_the_hpa_made_before_and_replaced_does_not_count() -> None:
    # The HPA decided from 3 and moved on before the shadow's decision from 3: nothing from
    # those replicas to judge it by.
    state = seen_at(ShadowState(), 0, 3, 5)
    state = seen_at(state, 4, 5, 5)
    state, verdicts = record_decision(state, decision(5, 3, 5))
    assert verdicts == []
    state, verdicts = settle(state, at(6) + GRACE)
    assert [v.result for v in verdicts] == [UNJUDGED]


def test_a_different_size_from_other_replicas_does_not_agree() -> None:
    # Same size, but the HPA reached it from other replicas: not the same decision.
    state = seen_at(ShadowState(), 0, 4, 5)
    state, verdicts = record_decision(state, decision(5, 3, 5))
    assert verdicts == []


def test_the_hpas_decision_on_the_same_metric_values_is_the_one_to_agree_with() -> None:
    # The shadow read 13.5 a pod and kept 3 (a wider tolerance); the HPA had kept 3 on 10 a
    # pod a period before, and scales to 4 on 13.5: on the same inputs, they differ.
    state = seen_at(ShadowState(), 0, 3, 3, pods_metric("10"))
    state, verdicts = record_decision(state, decision(4, 3, 3, metrics=pods_metric("13.5")))
    assert verdicts == []
    state, verdicts = observe(state, 5, status(3, 3), status(3, 4, scaled_at=5)._replace(
        current_metrics=pods_metric("13.5")))
    assert verdicts == []
    state, settled = settle(state, at(5) + GRACE)
    assert [(v.result, v.hpa.desired if v.hpa else None) for v in settled] == [(DIFFER, 4)]
    assert not settled[0].moved  # a difference on the same values: a real one


def test_a_difference_on_values_read_apart_says_so() -> None:
    # A rate: the HPA had just scaled from 2 to 3; the shadow read 12 a pod and kept 3, the
    # HPA read 13.5 a moment later and scaled to 4. No decision of the HPA on the shadow's
    # values, and its only one from 3 differs: judged on values read apart.
    state = seen_at(ShadowState(), 0, 2, 3, pods_metric("15"))
    state, _ = record_decision(state, decision(4, 3, 3, metrics=pods_metric("12")))
    state = seen_at(state, 5, 3, 4, pods_metric("13.5"))
    state, settled = settle(state, at(4) + GRACE + timedelta(seconds=1))
    assert [(v.result, v.moved) for v in settled] == [(DIFFER, True)]


def test_a_later_sync_that_read_the_same_values_is_not_the_same_inputs() -> None:
    # The shadow read 12 a pod at 4 and kept 3 (a rate limit), as the HPA did at its next sync
    # (at 5, reading 12.1); a sync later (at 20) the HPA read 12 again and, its rate limit
    # over, scaled: another moment, not the decision on the same inputs.
    def judged(same_by: datetime | None) -> list[str]:
        state = seen_at(ShadowState(), 0, 3, 3, pods_metric("11"))
        state, _ = record_decision(state, decision(4, 3, 3, metrics=pods_metric("12"))._replace(
            same_by=same_by))
        state = seen_at(state, 5, 3, 3, pods_metric("12.1"))
        state = seen_at(state, 20, 3, 4, pods_metric("12"))
        state, settled = settle(state, at(4) + GRACE + timedelta(seconds=1))
        return [v.result for v in settled]

    assert judged(at(4) + SYNC) == [AGREE]
    assert judged(None) == [DIFFER]  # the control: any sync within the grace


def test_the_shadow_decides_as_of_the_hpas_sync_it_precedes() -> None:
    state = ShadowState()
    assert decision_moment(state, now=at(3), period=SYNC) == at(3)  # no phase known yet
    state = state._replace(upstream_at=at(10))
    # The HPA syncs at 25: from 23.5 (the lead), the decision is as of 25.
    assert decision_moment(state, now=at(23.5), period=SYNC) == at(25)
    assert decision_moment(state, now=at(23.9), period=SYNC) == at(25)
    # Woken long before it (a status write awaited): as of now.
    assert decision_moment(state, now=at(12), period=SYNC) == at(12)


def test_a_load_step_between_the_two_reads_is_not_a_difference() -> None:
    # The shadow read 10 a pod (before the step) and kept 3, as the HPA did on 10; the HPA's
    # next sync read 13.5 and scaled: the same inputs agreed.
    state = seen_at(ShadowState(), 0, 3, 3, pods_metric("10"))
    state, verdicts = record_decision(state, decision(4, 3, 3, metrics=pods_metric("10")))
    assert [v.result for v in verdicts] == [AGREE]


def test_without_the_same_metric_values_any_hpa_decision_within_the_grace_agrees() -> None:
    # A CPU rate moves between any two reads: the HPA's decision a sync later counts.
    state = seen_at(ShadowState(), 0, 3, 3, pods_metric("12.1"))
    state, _ = record_decision(state, decision(4, 3, 4, metrics=pods_metric("12.4")))
    state, verdicts = observe(state, 5, status(3, 3), status(3, 4, scaled_at=5)._replace(
        current_metrics=pods_metric("12.6")))
    assert verdicts == []  # not yet: the same inputs may still come
    state, settled = settle(state, at(5) + GRACE)
    assert [v.result for v in settled] == [AGREE]


def test_the_shadow_decides_just_before_the_hpas_next_sync() -> None:
    assert phase_lead(timedelta(seconds=15)) == timedelta(seconds=1.5)
    assert phase_lead(timedelta(seconds=5)) == timedelta(seconds=1)
    assert phase_lead(timedelta(seconds=1)) == timedelta(seconds=0.5)
    state = ShadowState()
    assert next_decision_in(state, now=at(3), period=SYNC) == SYNC  # no phase known yet
    state = state._replace(upstream_at=at(10))
    # The HPA syncs at 25, 40, ...: the shadow at 23.5, 38.5.
    assert next_decision_in(state, now=at(12), period=SYNC) == timedelta(seconds=11.5)
    assert next_decision_in(state, now=at(23.5), period=SYNC) == timedelta(seconds=15)
    # Never sooner than half a period: from 20, the sync at 23.5 is skipped.
    assert next_decision_in(state, now=at(20), period=SYNC) == timedelta(seconds=18.5)


def test_an_hpa_kube_controller_manager_never_reconciled_leaves_decisions_unjudged() -> None:
    assert hpa_decision(status(0, 0, reconciled=False)) is None
    state, _ = record_decision(ShadowState(), decision(5, 3, 3))
    state, verdicts = settle(state, at(6) + GRACE)
    assert [v.result for v in verdicts] == [UNJUDGED]


def test_an_hpa_that_could_not_compute_or_rescale_kept_its_size() -> None:
    failed = AutoscalerStatus(current_replicas=3, desired_replicas=0, conditions=(
        Condition("AbleToScale", "True", "SucceededGetScale"),
        Condition("ScalingActive", "False", "FailedGetPodsMetric")))
    assert hpa_decision(failed) == Seen(3, 3)
    refused = AutoscalerStatus(current_replicas=3, desired_replicas=2, conditions=(
        Condition("AbleToScale", "False", "FailedUpdateScale"),
        Condition("ScalingActive", "True", "ValidMetricFound")))
    assert hpa_decision(refused) == Seen(3, 3)
    assert hpa_decision(status(3, 5)) == Seen(3, 5)


def test_the_grace_is_a_sync_period_and_a_half_or_three_seconds_more() -> None:
    assert judgement_grace(timedelta(seconds=15)) == timedelta(seconds=22.5)
    assert judgement_grace(timedelta(seconds=5)) == timedelta(seconds=8)


# ------------------------------------------------------------------------- warm-up


def test_an_hpa_created_within_a_sync_period_starts_without_a_warm_up() -> None:
    spec = parse_spec({"scaleTargetRef": {"kind": "Deployment", "name": "web"},
                       "maxReplicas": 5}, "spec")
    state = start_state(created=T0, now=at(3), spec=spec, settings=Settings())
    assert state.warmup_until is None


def test_an_older_hpa_warms_up_for_its_longest_window_or_period() -> None:
    spec = parse_spec({"scaleTargetRef": {"kind": "Deployment", "name": "web"},
                       "maxReplicas": 5, "behavior": {
                           "scaleDown": {"stabilizationWindowSeconds": 60,
                                         "policies": [{"type": "Pods", "value": 1,
                                                       "periodSeconds": 900}]}}}, "spec")
    assert warmup_period(spec, Settings()) == timedelta(seconds=900)
    state = start_state(created=T0, now=at(3600), spec=spec, settings=Settings())
    assert state.warmup_until == at(3600 + 900)
    plain = parse_spec({"scaleTargetRef": {"kind": "Deployment", "name": "web"},
                        "maxReplicas": 5}, "spec")
    assert warmup_period(plain, Settings()) == timedelta(minutes=5)  # the flag's window
    assert start_state(created=None, now=T0, spec=plain,
                       settings=Settings()).warmup_until == at(300)


def test_warm_up_decisions_are_neither_agreement_nor_difference() -> None:
    state = seen_at(ShadowState(), 0, 3, 3)
    state, verdicts = record_decision(state, decision(5, 3, 5, warmup=True))
    assert [v.result for v in verdicts] == [WARMUP] and not state.pending
    state, event = difference_event(state, verdicts[0], reference="Deployment/shop/web")
    assert event is None


# ------------------------------------------------------------- upstream's scale events


def test_a_new_last_scale_time_is_kube_controller_managers_rescale() -> None:
    assert upstream_rescale(status(3, 3, scaled_at=0), status(3, 5, scaled_at=10)) == (3, 5)
    assert upstream_rescale(status(3, 5, scaled_at=10), status(5, 5, scaled_at=10)) is None
    assert upstream_rescale(None, status(3, 5, scaled_at=10)) is None  # before our start


def test_upstream_rescales_become_the_shadows_scale_events_when_there_is_a_behavior() -> None:
    state, _ = observe(ShadowState(), 10, status(3, 3), status(3, 5, scaled_at=10))
    state, _ = observe(state, 40, status(5, 5, scaled_at=10), status(5, 3, scaled_at=40))
    assert [(e.timestamp, e.replica_change) for e in state.history.scale_up_events] == \
        [(at(10), 2)]
    assert [(e.timestamp, e.replica_change) for e in state.history.scale_down_events] == \
        [(at(40), 2)]
    plain, _ = observe_status(ShadowState(), before=status(3, 3), after=status(3, 5, scaled_at=1),
                              behavior=None, now=at(1), keep=KEEP)
    assert plain.history.scale_up_events == ()  # upstream stores none without a behavior


def test_only_recent_hpa_decisions_are_remembered() -> None:
    state = ShadowState()
    for second in range(0, 1000, 15):
        state = seen_at(state, second, 3, 3 + second % 2)
    assert all(d.since >= at(990) - KEEP - timedelta(seconds=15) for d in state.seen)


# ------------------------------------------------------------------------- events


def test_a_persistent_difference_is_one_event_until_it_changes() -> None:
    state = seen_at(ShadowState(), 0, 3, 3)
    events = []
    for second in (5, 20, 35):
        state, _ = record_decision(state, decision(second, 3, 5))
        state, verdicts = settle(state, at(second + 1) + GRACE)
        for verdict in verdicts:
            state, event = difference_event(state, verdict, reference="Deployment/shop/web")
            events.append(event)
    assert [e is not None for e in events] == [True, False, False]
    first = events[0]
    assert first is not None and first.reason == SHADOW_EVENT_REASON
    assert "would scale Deployment/shop/web from 3 to 5" in first.message
    assert "the HPA kept 3" in first.message
    # Another size is another difference.
    state, _ = record_decision(state, decision(50, 3, 6))
    state, verdicts = settle(state, at(51) + GRACE)
    state, event = difference_event(state, verdicts[0], reference="Deployment/shop/web")
    assert event is not None and "from 3 to 6" in event.message


def test_a_difference_after_an_agreement_is_reported_again() -> None:
    state = seen_at(ShadowState(), 0, 3, 3)
    state, _ = record_decision(state, decision(5, 3, 5))
    state, verdicts = settle(state, at(6) + GRACE)
    state, event = difference_event(state, verdicts[0], reference="r")
    assert event is not None
    state, verdicts = record_decision(state, decision(40, 3, 3))
    state, event = difference_event(state, verdicts[0], reference="r")
    assert verdicts[0].result == AGREE and event is None and state.reported is None
    state, _ = record_decision(state, decision(55, 3, 5))
    state, verdicts = settle(state, at(56) + GRACE)
    state, event = difference_event(state, verdicts[0], reference="r")
    assert event is not None


# ------------------------------------------------------------------ waiting for the HPA


@pytest.mark.parametrize(("scale", "hpa", "waits"), [
    (5, (3, 5), False),   # the status shows the rescale that made the size
    (5, (5, 5), False),
    (5, (3, 3), True),    # the size moved, the status not yet
    (5, None, False),     # nothing to wait for
])
def test_a_size_the_hpas_status_does_not_show_is_waited_for(
        scale: int, hpa: tuple[int, int] | None, waits: bool) -> None:
    _, wait = consistency_wait(ShadowState(), scale_replicas=scale,
                               hpa=Seen(*hpa) if hpa else None, now=T0, limit=SYNC)
    assert wait is waits


def test_one_mismatch_is_waited_for_at_most_a_sync_period_and_only_once() -> None:
    state, wait = consistency_wait(ShadowState(), scale_replicas=5, hpa=Seen(3, 3), now=at(0),
                                   limit=SYNC)
    assert wait
    state, wait = consistency_wait(state, scale_replicas=5, hpa=Seen(3, 3), now=at(14), limit=SYNC)
    assert wait
    state, wait = consistency_wait(state, scale_replicas=5, hpa=Seen(3, 3), now=at(15), limit=SYNC)
    assert not wait
    state, wait = consistency_wait(state, scale_replicas=5, hpa=Seen(3, 3), now=at(30), limit=SYNC)
    assert not wait  # the same mismatch: kube-controller-manager does not act on it
    state, wait = consistency_wait(state, scale_replicas=5, hpa=Seen(5, 5), now=at(31), limit=SYNC)
    assert not wait and state.waited is None
    _, wait = consistency_wait(state, scale_replicas=6, hpa=Seen(5, 5), now=at(40), limit=SYNC)
    assert wait


# ------------------------------------------------------------------ the published entry


def test_an_entry_round_trips_with_its_history_and_latest_verdict() -> None:
    state = seen_at(ShadowState(history=History(
        recommendations=(Recommendation(at(0), 3), Recommendation(at(5), 5)))), 0, 3, 3)
    state, _ = record_decision(state, decision(5, 3, 5))
    state, _ = settle(state, at(6) + GRACE)
    text = render_entry(state, history=rendered_history(state.history, now=at(30),
                                                        horizon=timedelta(minutes=5)))
    entry = parse_entry(text, "data[shop.web]")
    assert entry.history is not None and entry.history.recommendations is not None
    assert [r.replicas for r in entry.history.recommendations] == [3, 5]
    assert entry.decision is not None
    assert (entry.decision["currentReplicas"], entry.decision["replicas"],
            entry.decision["hpaDesiredReplicas"], entry.decision["result"]) == (3, 5, 3, DIFFER)
    assert describe_entry(entry.decision).endswith(
        "from 3 replicas metricscale decides 5, the HPA 3 (from 3): differ")
    assert describe_entry(None) == "shadow mode has judged no decision of this HPA yet"


def test_alike_verdicts_keep_the_entry_unchanged() -> None:
    state = seen_at(ShadowState(), 0, 3, 3)
    texts = set()
    for second in (5, 20, 35):
        state, _ = record_decision(state, decision(second, 3, 3))
        texts.add(render_entry(state, history=None))
    assert len(texts) == 1


@pytest.mark.parametrize("text", ["not json", "[]", '{"decision": {"replicas": 3}}'])
def test_an_unreadable_entry_names_where_it_is(text: str) -> None:
    with pytest.raises(ModelError) as caught:
        parse_entry(text, "ConfigMap metricscale/metricscale-shadow.data[shop.web]")
    assert "metricscale-shadow.data[shop.web]" in str(caught.value)
