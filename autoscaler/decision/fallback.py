"""Fallback (KEP-5679, KEDA's `fallback`): what a metric whose reads keep failing proposes.

Part of the decision: a metric with `fallback` that fails `failureThreshold` reads in a row
(or every read for `failureDurationSeconds`) proposes the fallback's replicas instead of
failing; the count of failed reads is kept in `history.metricFailures`. The Fallback condition
and its events say when a fallback applies; an autoscaler without fallbacks never has them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from autoscaler.decision.conditions import FALLBACK, TRUE, set_condition
from autoscaler.decision.events import Event
from autoscaler.decision.outcome import Draft
from autoscaler.decision.phrases import phrase_replicas
from autoscaler.model.history import MetricFailure
from autoscaler.model.objects import Autoscaler
from autoscaler.model.spec import MetricFallback
from autoscaler.model.times import format_time

__all__ = ["count_failure", "fallback_replicas", "falls_back", "report_fallback"]


def count_failure(before: MetricFailure | None, *, metric: int, now: datetime) -> MetricFailure:
    """One more failed read of `metric` in a row, since the first of them."""
    return MetricFailure(metric=metric, failures=(before.failures if before else 0) + 1,
                         since=before.since if before else now)


def falls_back(fallback: MetricFallback, failure: MetricFailure, now: datetime) -> bool:
    """KEP-5679: after failureThreshold failed reads in a row (or failureDurationSeconds)."""
    if failure.failures >= fallback.failure_threshold:
        return True
    seconds = fallback.failure_duration_seconds
    return seconds is not None and (now - failure.since).total_seconds() >= seconds


def fallback_replicas(fallback: MetricFallback, *, current: int) -> int:
    """KEDA's fallback behaviors."""
    if fallback.behavior == "currentReplicas":
        return current
    if fallback.behavior == "currentReplicasIfHigher":
        return max(current, fallback.replicas)
    if fallback.behavior == "currentReplicasIfLower":
        return min(current, fallback.replicas)
    return fallback.replicas


def _reads(count: int) -> str:
    return "1 read" if count == 1 else f"{count} reads"


def _fallback_cause(fallback: MetricFallback, failure: MetricFailure | None,
                    failures: int) -> str:
    """Why a metric falls back, in words that stay the same for as long as the outage does:
    the threshold it reached or the time it has failed for, never the running count (a
    condition whose message changed at every sync would be rewritten at every sync; the count
    is in the history)."""
    if failures >= fallback.failure_threshold or failure is None \
            or fallback.failure_duration_seconds is None:
        return f"failed {fallback.failure_threshold} or more reads in a row"
    return f"failed every read for {fallback.failure_duration_seconds} s or more"


def report_fallback(draft: Draft, *, fallbacks: Sequence[tuple[int, int, int]],
                    failures: Sequence[MetricFailure], autoscaler: Autoscaler,
                    now: datetime) -> None:
    """The Fallback condition while a metric proposes its fallback (events on entering and
    leaving it); never present for an autoscaler without fallbacks.

    `fallbacks` are the (metric, proposal, failed reads) in use, `failures` the metrics with a
    fallback whose reads fail.
    """
    was = draft.true_condition(FALLBACK)
    if not fallbacks:
        if was is not None:
            draft.lift_condition(
                FALLBACK, event=Event("Normal", "FallbackEnded", "every metric reads again: "
                                      "the fallback no longer applies"),
                explanation="The metrics read again: no fallback applies.")
        return
    steady, counted, timed = [], [], []
    failing = {failure.metric: failure for failure in failures}
    for index, proposal, count in fallbacks:
        fallback = autoscaler.spec.metrics[index].fallback
        assert fallback is not None
        proposes = f"proposes {phrase_replicas(proposal)} (fallback {fallback.behavior})"
        failure = failing.get(index)
        steady.append(f"metric {index} {_fallback_cause(fallback, failure, count)} and "
                      f"{proposes}")
        counted.append(f"metric {index} failed {_reads(count)} in a row and {proposes}")
        since = f", since {format_time(failure.since)}" if failure is not None else ""
        timed.append(f"metric {index} failed {_reads(count)} in a row{since}, and "
                     f"{proposes}")
    message = "; ".join(steady)
    draft.conditions = set_condition(draft.conditions, type=FALLBACK, status=TRUE,
                                     reason="FallbackActive", message=message, now=now)
    draft.explanation.append(f"Fallback: {'; '.join(timed)}.")
    if was is None:
        # One event on entering, with the count at that moment (the threshold, or fewer when
        # the reads failed for failureDurationSeconds first).
        draft.events.append(Event("Warning", "FallbackActive", "; ".join(counted)))
