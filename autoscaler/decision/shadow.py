"""Shadow mode's judgement: what kube-controller-manager's HPA controller decided (as its
status shows it) beside what our decision says on the same inputs; agreement, the warm-up,
the differences worth an Event, and the entry `explain --live --shadow` reads back.

Upstream keeps its stabilization history in memory only, so the shadow keeps its own from
what it observes, and starts as kube-controller-manager does after a restart: the first sync
of an HPA records its current size as a recommendation, and there are no scale events. The
recommendations are our own (each shadow sync records the unstabilized desired count, as
upstream's sync does); the scale events are upstream's: each rescale kube-controller-manager
makes shows in the HPA's status (a new `lastScaleTime`, with `currentReplicas` the size it
scaled from and `desiredReplicas` the size it scaled to), and is stored as
`storeScaleEvent` stores it, at the moment the shadow sees it. Our own decisions write
nothing and so store no event.

Judging: a shadow decision "from C replicas, S" is judged against the HPA's decision on the
same inputs: from C, on the same metric values (the HPA's status.currentMetrics says what
upstream read), at the HPA's sync next to it (a later sync that happened to read the same
values decided at another moment). It agrees when that decision is S, and differs when it is
not; where the metrics moved between the two reads (a CPU rate), it agrees with any of the
HPA's decisions from C within `judgement_grace` (a sync period and a half), and differs
otherwise. A shadow
that synced just after the HPA would only ever decide from the sizes the HPA had already
chosen and never judge the HPA's own steps, so the shadow syncs just before it: `phase_lead`
ahead of the next sync the HPA's status writes announce (`next_decision_in`), and decides as
of that sync (`decision_moment`), so that a window or a rate limit ending within the lead ends
for both. Decisions made
before the shadow's history can be the HPA's (the warm-up) and decisions with nothing to be
judged by are counted apart, so the agreement rate reads agree / (agree + differ).

All of it is pure: values in, values out, `now` given.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from autoscaler.decision import behavior as rules
from autoscaler.decision.events import Event
from autoscaler.decision.persistence import history_horizon, render_persisted_history
from autoscaler.decision.settings import Settings
from autoscaler.model.fields import ModelError, read_int, read_object, read_str
from autoscaler.model.history import History, parse_history
from autoscaler.model.spec import AutoscalerSpec, Behavior
from autoscaler.model.status import AutoscalerStatus, MetricStatus
from autoscaler.model.times import format_time_precise, parse_time

__all__ = [
    "AGREE",
    "DIFFER",
    "RESULTS",
    "SHADOW_EVENT_REASON",
    "SHADOW_NAME",
    "UNJUDGED",
    "WARMUP",
    "HpaDecision",
    "Seen",
    "ShadowDecision",
    "ShadowEntry",
    "ShadowState",
    "Verdict",
    "consistency_wait",
    "decision_moment",
    "describe_entry",
    "difference_event",
    "entry_key",
    "hpa_decision",
    "judgement_grace",
    "next_decision_in",
    "note_status",
    "observe_status",
    "parse_entry",
    "phase_lead",
    "record_decision",
    "render_entry",
    "rendered_history",
    "settle",
    "start_state",
    "upstream_rescale",
    "warmup_period",
]

AGREE = "agree"
DIFFER = "differ"
WARMUP = "warmup"  # made before the shadow's history can be the HPA's: not judged
UNJUDGED = "unjudged"  # nothing to judge against (never reconciled upstream; scale unread)
RESULTS = (AGREE, DIFFER, WARMUP, UNJUDGED)

SHADOW_EVENT_REASON = "ShadowDisagreement"
# The Lease of a shadow, and the ConfigMap beside it that holds what explain reads.
SHADOW_NAME = "metricscale-shadow"

# How long the HPA's statuses are remembered after they were replaced, in graces.
_KEEP_GRACES = 4


def judgement_grace(sync_period: timedelta) -> timedelta:
    """How long after a shadow decision the HPA's may still come: a sync period (its next
    sync), and half a period more (at least 3 s) for the status write, the watch, a busy
    kube-controller-manager."""
    return sync_period + max(sync_period / 2, timedelta(seconds=3))


def warmup_period(spec: AutoscalerSpec, settings: Settings) -> timedelta:
    """How long a fresh history can differ from one kube-controller-manager has kept: the
    longest stabilization window and the longest policy period of the HPA."""
    longest = history_horizon(spec, settings)
    behavior = spec.behavior
    if behavior is not None:
        periods = [rules.longest_policy_period(behavior.scale_up),
                   rules.longest_policy_period(behavior.scale_down)]
        longest = max(longest, timedelta(seconds=max(periods)))
    return longest


class Seen(NamedTuple):
    """An HPA decision as its status shows it: from `current` replicas, `desired`, on these
    metric values (status.currentMetrics: what upstream read)."""

    current: int
    desired: int
    metrics: tuple[MetricStatus, ...] = ()


class HpaDecision(NamedTuple):
    """One decision of the HPA as its status shows it: from `current` replicas, `desired`, on
    `metrics`; in force from `since` (when the shadow saw it) until the next one."""

    since: datetime
    current: int
    desired: int
    metrics: tuple[MetricStatus, ...] = ()


class ShadowDecision(NamedTuple):
    """What the shadow decided at `at`: from `current` replicas, `replicas`."""

    at: datetime
    current: int
    replicas: int
    reason: str
    due: datetime  # judged by then
    warmup: bool = False
    why: tuple[str, ...] = ()  # the decision's explanation, for the log of a difference
    metrics: tuple[MetricStatus, ...] = ()  # the metric values it decided on
    # The HPA's decision on the same inputs is the one of its next sync, seen by then (a
    # later sync that read the same values decided at another moment); None: any within `due`.
    same_by: datetime | None = None


class Verdict(NamedTuple):
    decision: ShadowDecision
    result: str  # AGREE, DIFFER, WARMUP or UNJUDGED
    hpa: HpaDecision | None  # the HPA's decision it was judged against (the latest one)
    # Judged against a decision the HPA made on other metric values (the values moved between
    # the two reads: no decision of the HPA had the shadow's); False: on the same values.
    moved: bool = False


class ShadowState(NamedTuple):
    """What the shadow remembers of one HPA."""

    history: History = History()
    upstream_at: datetime | None = None  # the latest status write of the HPA seen
    seen: tuple[HpaDecision, ...] = ()  # the HPA's decisions, oldest first
    pending: tuple[ShadowDecision, ...] = ()
    warmup_until: datetime | None = None
    reported: tuple[int, int, int | None] | None = None  # the difference last put in an Event
    waited: tuple[int, int] | None = None  # (scale, HPA desired) last waited for
    waiting_since: datetime | None = None
    last: Verdict | None = None  # the latest verdict
    last_since: datetime | None = None  # since when verdicts have been like `last`


def start_state(*, created: datetime | None, now: datetime, spec: AutoscalerSpec,
                settings: Settings) -> ShadowState:
    """The state of an HPA first seen now. An HPA created within a sync period starts its
    history with ours (kube-controller-manager's first sync is at most that far away);
    an older one has a history we never saw, so decisions warm up for a whole window."""
    if created is not None and now - created <= settings.sync_period:
        return ShadowState()
    return ShadowState(warmup_until=now + warmup_period(spec, settings))


# --------------------------------------------------------------------------------------------
# What the HPA decided


def hpa_decision(status: AutoscalerStatus) -> Seen | None:
    """(from, to) of the HPA's latest decision as its status shows it, or None while
    kube-controller-manager never reconciled it (every sync sets AbleToScale). When it could
    not compute (ScalingActive False: no usable metric, a scale-down a failing metric blocks)
    or not rescale (AbleToScale False), upstream leaves desiredReplicas at its old value and
    keeps the size: its decision is to keep currentReplicas."""
    if not status.conditions:
        return None
    if any(c.type in {"AbleToScale", "ScalingActive"} and c.status == "False"
           for c in status.conditions):
        return Seen(status.current_replicas, status.current_replicas, status.current_metrics)
    return Seen(status.current_replicas, status.desired_replicas, status.current_metrics)


def upstream_rescale(before: AutoscalerStatus | None,
                     after: AutoscalerStatus) -> tuple[int, int] | None:
    """(from, to) of a rescale kube-controller-manager made between two statuses: a new
    lastScaleTime, set only by a successful rescale. None for the first status seen (an
    event from before the shadow's start is not known, as after upstream's restart)."""
    if before is None or after.last_scale_time is None:
        return None
    if after.last_scale_time == before.last_scale_time:
        return None
    if after.current_replicas == after.desired_replicas:
        return None
    return after.current_replicas, after.desired_replicas


def _note(state: ShadowState, seen: Seen | None, *, now: datetime,
          keep: timedelta) -> tuple[ShadowState, HpaDecision | None]:
    """The HPA's decision `seen` now: appended when it is new; older ones pruned."""
    if seen is None:
        return state, None
    decisions = state.seen
    last = decisions[-1] if decisions else None
    if last is not None and Seen(last.current, last.desired, last.metrics) == seen:
        return state, None
    added = HpaDecision(since=now, current=seen.current, desired=seen.desired,
                        metrics=seen.metrics)
    decisions = (*decisions, added)
    cutoff = now - keep
    # Keep the one in force at the cutoff and everything after it.
    first = 0
    for index in range(1, len(decisions)):
        if decisions[index].since <= cutoff:
            first = index
    return state._replace(seen=decisions[first:]), added


def note_status(state: ShadowState, seen: Seen | None, *, now: datetime,
                keep: timedelta) -> ShadowState:
    """The HPA's decision as read now (the first sight of an HPA; the watch brings the rest
    to observe_status)."""
    return _note(state, seen, now=now, keep=keep)[0]


def _in_force(decisions: Iterable[HpaDecision], at: datetime) -> HpaDecision | None:
    found = None
    for decision in decisions:
        if decision.since <= at:
            found = decision
    return found


def _candidates(decision: ShadowDecision,
                seen: tuple[HpaDecision, ...]) -> list[HpaDecision]:
    """The HPA's decisions from the same replicas in force at some moment from
    `decision.at` to `decision.due`."""
    found = []
    for index, hpa in enumerate(seen):
        ended = seen[index + 1].since if index + 1 < len(seen) else None
        if hpa.since > decision.due or (ended is not None and ended <= decision.at):
            continue
        if hpa.current == decision.current:
            found.append(hpa)
    return found


def _judge(decision: ShadowDecision, seen: tuple[HpaDecision, ...], *,
           final: bool) -> Verdict | None:
    """The verdict on a decision, or None while it cannot be given yet.

    The HPA's decision on the same inputs (the same replicas, the same metric values in its
    status.currentMetrics, at the HPA's sync next to the decision: in force when it was made,
    or seen before `same_by`) is the one to agree with: it agrees at once, and once the grace
    is over it decides. Without one (metrics that moved between the two reads: a CPU rate),
    the decision agrees with any of the HPA's from the same replicas within the grace: the
    two controllers then decided up to a sync period apart."""
    candidates = _candidates(decision, seen)
    same = [hpa for hpa in candidates if hpa.metrics == decision.metrics
            and (decision.same_by is None or hpa.since < decision.same_by)]
    agreeing = next((hpa for hpa in same if hpa.desired == decision.replicas), None)
    if agreeing is not None:
        return Verdict(decision, AGREE, agreeing)
    if not final:
        return None
    if same:
        return Verdict(decision, DIFFER, same[0])
    agreeing = next((hpa for hpa in candidates if hpa.desired == decision.replicas), None)
    if agreeing is not None:
        return Verdict(decision, AGREE, agreeing, moved=True)
    if candidates:
        return Verdict(decision, DIFFER, candidates[-1], moved=True)
    # Not one decision of the HPA from these replicas in a sync period and a half: upstream
    # did not sync it (a status write always follows a change of size).
    return Verdict(decision, UNJUDGED, _in_force(seen, decision.at))


def _with_verdicts(state: ShadowState, verdicts: list[Verdict],
                   now: datetime) -> ShadowState:
    for verdict in verdicts:
        last = state.last
        same = last is not None and (
            last.result, last.decision.current, last.decision.replicas,
            last.hpa.desired if last.hpa else None) == (
            verdict.result, verdict.decision.current, verdict.decision.replicas,
            verdict.hpa.desired if verdict.hpa else None)
        state = state._replace(last=verdict,
                               last_since=state.last_since if same else now)
    return state


def _judged(state: ShadowState, verdicts: list[Verdict], now: datetime) -> ShadowState:
    """The state without the judged pending decisions, with the verdicts recorded."""
    if not verdicts:
        return state
    judged = [v.decision for v in verdicts]
    pending = tuple(p for p in state.pending if not any(p is j for j in judged))
    return _with_verdicts(state._replace(pending=pending), verdicts, now)


def observe_status(state: ShadowState, *, before: AutoscalerStatus | None,
                   after: AutoscalerStatus, behavior: Behavior | None, now: datetime,
                   keep: timedelta) -> tuple[ShadowState, list[Verdict]]:
    """A status of the HPA seen now: its rescale stored as upstream's scale event, its
    decision remembered, and the pending shadow decisions it agrees with judged."""
    rescale = upstream_rescale(before, after)
    if rescale is not None:
        history = state.history
        up, down = rules.store_scale_event(
            behavior, up_events=history.scale_up_events, down_events=history.scale_down_events,
            previous_replicas=rescale[0], new_replicas=rescale[1], now=now)
        state = state._replace(history=history._replace(scale_up_events=up,
                                                        scale_down_events=down))
    # kube-controller-manager writes the status at the end of a sync, and syncs an HPA again a
    # sync period after (upstream's rate limiter): its phase.
    state = state._replace(upstream_at=now)
    state, added = _note(state, hpa_decision(after), now=now, keep=keep)
    if added is None or not state.pending:
        return state, []
    verdicts = [v for v in (_judge(p, state.seen, final=False) for p in state.pending)
                if v is not None]
    return _judged(state, verdicts, now), verdicts


def record_decision(state: ShadowState,
                    decision: ShadowDecision) -> tuple[ShadowState, list[Verdict]]:
    """A shadow decision made at `decision.at`: judged at once when the HPA decided the same
    on the same inputs (or it is a warm-up one), else pending until `decision.due`."""
    if decision.warmup:
        verdict: Verdict | None = Verdict(decision, WARMUP, _in_force(state.seen, decision.at))
    else:
        verdict = _judge(decision, state.seen, final=False)
    if verdict is None:
        return state._replace(pending=(*state.pending, decision)), []
    return _with_verdicts(state, [verdict], decision.at), [verdict]


def settle(state: ShadowState, now: datetime) -> tuple[ShadowState, list[Verdict]]:
    """The pending decisions whose time is up, judged with what the HPA decided by then."""
    verdicts = [_judge(p, state.seen, final=True) for p in state.pending if p.due < now]
    found = [v for v in verdicts if v is not None]
    return _judged(state, found, now), found


def phase_lead(period: timedelta) -> timedelta:
    """How long before the HPA's sync the shadow syncs: enough for its reads to come first
    (a second, or a tenth of the period), at most half a period."""
    return min(period / 2, max(timedelta(seconds=1), period / 10))


def decision_moment(state: ShadowState, *, now: datetime, period: timedelta) -> datetime:
    """The moment a decision made now is made as of: the HPA's next sync, when it is at most
    twice `phase_lead` away (the shadow decided just before it), so that the windows and rate
    limits are the ones upstream applies at that sync; otherwise now."""
    if state.upstream_at is None:
        return now
    synced = state.upstream_at
    periods = max(0, (now - synced) // period) + 1
    upcoming = synced + periods * period
    return upcoming if upcoming - now <= 2 * phase_lead(period) else now


def next_decision_in(state: ShadowState, *, now: datetime, period: timedelta) -> timedelta:
    """When to decide next, after a decision now: `phase_lead` before the HPA's next sync, as
    its latest status write announces it (upstream syncs an HPA a period after its previous
    sync, a little later rather than earlier, so the lead only grows between two writes);
    without a write seen, a period from now. Never sooner than half a period."""
    if state.upstream_at is None:
        return period
    synced = state.upstream_at
    periods = max(0, (now - synced) // period) + 1
    target = synced + periods * period - phase_lead(period)
    if target - now < period / 2:
        target += period
    return target - now


def consistency_wait(state: ShadowState, *, scale_replicas: int, hpa: Seen | None,
                     now: datetime, limit: timedelta) -> tuple[ShadowState, bool]:
    """Whether to wait before deciding: the target's size is not the one the HPA's status
    says it decided, so either kube-controller-manager's rescale is on its way (the status
    write follows the scale write; the shadow must see the scale event before deciding from
    the new size, or it would decide without upstream's rate limit) or someone else changed
    the size (kube-controller-manager's next sync reads it). Each such mismatch is waited for
    once, at most `limit` (a sync period)."""
    if hpa is None or scale_replicas == hpa.desired:
        if state.waited is None:
            return state, False
        return state._replace(waited=None, waiting_since=None), False
    mismatch = (scale_replicas, hpa.desired)
    if state.waited != mismatch or state.waiting_since is None:
        return state._replace(waited=mismatch, waiting_since=now), True
    return state, now - state.waiting_since < limit


# --------------------------------------------------------------------------------------------
# Events: one per difference, not one per sync


def difference_event(state: ShadowState, verdict: Verdict, *,
                     reference: str) -> tuple[ShadowState, Event | None]:
    """The Event for a verdict, rate-limited: a difference is reported when it changes (the
    shadow's size, the HPA's, or the size they start from), and again only after an
    agreement; agreement, warm-up and unjudged decisions post nothing."""
    if verdict.result == AGREE:
        return (state._replace(reported=None) if state.reported is not None else state), None
    if verdict.result != DIFFER:
        return state, None
    decision = verdict.decision
    theirs = verdict.hpa.desired if verdict.hpa is not None else None
    key = (decision.current, decision.replicas, theirs)
    if state.reported == key:
        return state, None
    ours = (f"would scale {reference} from {decision.current} to {decision.replicas}"
            f" ({decision.reason})" if decision.replicas != decision.current
            else f"would keep {reference} at {decision.current}")
    hpa = verdict.hpa
    if hpa is None:
        upstream = "the HPA decided nothing"
    elif hpa.current == decision.current:
        upstream = (f"the HPA kept {hpa.desired}" if hpa.desired == hpa.current
                    else f"the HPA scaled it to {hpa.desired}")
    else:
        upstream = f"the HPA last decided {hpa.desired} from {hpa.current}"
    message = (f"shadow mode: metricscale {ours}; {upstream} "
               f"(from {decision.current} replicas at "
               f"{format_time_precise(decision.at)})")
    return state._replace(reported=key), Event("Normal", SHADOW_EVENT_REASON, message)


# --------------------------------------------------------------------------------------------
# The published entry: what `explain --live --shadow` reads


class ShadowEntry(NamedTuple):
    """One HPA's entry of the shadow's ConfigMap."""

    history: History | None
    decision: Mapping[str, Any] | None  # the latest verdict, as rendered


def entry_key(namespace: str, name: str) -> str:
    """The ConfigMap key of an HPA: a namespace has no dot, so the first dot splits it."""
    return f"{namespace}.{name}"


def _render_verdict(verdict: Verdict, since: datetime | None) -> dict[str, Any]:
    decision = verdict.decision
    rendered: dict[str, Any] = {
        "since": format_time_precise(since or decision.at),
        "currentReplicas": decision.current,
        "replicas": decision.replicas,
        "result": verdict.result,
    }
    if decision.reason:
        rendered["reason"] = decision.reason
    if verdict.hpa is not None:
        rendered["hpaCurrentReplicas"] = verdict.hpa.current
        rendered["hpaDesiredReplicas"] = verdict.hpa.desired
    return rendered


def render_entry(state: ShadowState, *, history: Mapping[str, Any] | None) -> str:
    """The entry's JSON (compact, stable key order): the history as persisted (see
    render_persisted_history) and the latest verdict."""
    entry: dict[str, Any] = {}
    if history is not None:
        entry["history"] = dict(history)
    if state.last is not None:
        entry["decision"] = _render_verdict(state.last, state.last_since)
    return json.dumps(entry, separators=(",", ":"), sort_keys=True)


def rendered_history(history: History, *, now: datetime, horizon: timedelta) -> dict[str, Any]:
    """The entry's `history`: the compact form a Lease-less reader restores."""
    return render_persisted_history(history._replace(scale_watch=None), now=now,
                                    horizon=horizon)


def parse_entry(text: str, path: str) -> ShadowEntry:
    """An entry read back; raises ModelError naming `path` when it is not one."""
    try:
        raw = json.loads(text)
    except ValueError as err:
        raise ModelError(path, f"is not JSON: {err}") from None
    obj = read_object(raw, path)
    history = parse_history(obj["history"], f"{path}.history") \
        if obj.get("history") is not None else None
    decision = None
    if obj.get("decision") is not None:
        where = f"{path}.decision"
        decision = read_object(obj["decision"], where)
        read_int(decision, "currentReplicas", where, required=True)
        read_int(decision, "replicas", where, required=True)
        read_str(decision, "result", where)
        parse_time(decision.get("since"), f"{where}.since")
    return ShadowEntry(history=history, decision=decision)


def describe_entry(decision: Mapping[str, Any] | None) -> str:
    """One line for explain: the latest judged shadow decision."""
    if decision is None:
        return "shadow mode has judged no decision of this HPA yet"
    ours = decision.get("replicas")
    current = decision.get("currentReplicas")
    theirs = decision.get("hpaDesiredReplicas")
    result = decision.get("result")
    line = (f"shadow mode, since {decision.get('since')}: from {current} replicas metricscale "
            f"decides {ours}")
    if theirs is not None:
        line += (f", the HPA {theirs} (from {decision.get('hpaCurrentReplicas')})")
    return f"{line}: {result}"
