"""Pause, by annotation (KEDA's `autoscaling.keda.sh/paused*`, under metricscale.dev/).

* `metricscale.dev/paused: "true"`: decide and report as usual, never write a scale;
* `metricscale.dev/paused-replicas: "N"`: set the target to N once, then hold it there
  (N outside [minReplicas, maxReplicas] is allowed, as in KEDA: the operator said so);
* `metricscale.dev/paused-scale-in: "true"` / `paused-scale-out: "true"`: that direction is
  held. Each annotation holds its own direction, whatever the other says, as KEDA turns each
  into `selectPolicy: Disabled` of its own direction of the HPA: with both, neither direction
  moves.

`paused-replicas` wins over the others; `paused` over the one-direction holds. A value that is
not `true`/`false` (or, for `paused-replicas`, a whole number) pauses fully and says why: a
typo must not let an autoscaler loose that someone meant to stop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from autoscaler.decision.conditions import PAUSED as PAUSED_CONDITION
from autoscaler.decision.conditions import TRUE, set_condition
from autoscaler.decision.events import Event
from autoscaler.decision.outcome import Draft, Limit
from autoscaler.decision.phrases import phrase_replicas

__all__ = [
    "PAUSED",
    "PAUSED_REPLICAS",
    "PAUSED_SCALE_IN",
    "PAUSED_SCALE_OUT",
    "PAUSE_ANNOTATIONS",
    "Pause",
    "PausedProposal",
    "apply_pause",
    "read_pause",
    "report_pause",
]

PAUSED = "metricscale.dev/paused"
PAUSED_REPLICAS = "metricscale.dev/paused-replicas"
PAUSED_SCALE_IN = "metricscale.dev/paused-scale-in"
PAUSED_SCALE_OUT = "metricscale.dev/paused-scale-out"
PAUSE_ANNOTATIONS = (PAUSED, PAUSED_REPLICAS, PAUSED_SCALE_IN, PAUSED_SCALE_OUT)


@dataclass(frozen=True)
class Pause:
    """What the pause annotations ask for: one mode, with the reason and words to report."""

    mode: str  # "full", "replicas", "scale-in", "scale-out", "scale-in-and-out"
    reason: str  # the Paused condition's reason
    message: str
    replicas: int | None = None
    problem: str | None = None  # an annotation that could not be read (then mode is "full")

    def holds(self, *, current: int, desired: int) -> bool:
        """Whether this pause keeps `current` instead of `desired` (not for "replicas")."""
        if self.mode in ("full", "scale-in-and-out"):
            return desired != current
        if self.mode == "scale-in":
            return desired < current
        if self.mode == "scale-out":
            return desired > current
        return False


def _flag(value: str | None) -> bool | None:
    """True/False for an on/off annotation, None when it is not one."""
    if value is None:
        return False
    lowered = value.strip().lower()
    if lowered == "true":
        return True
    if lowered in ("false", ""):
        return False
    return None


def read_pause(annotation: Callable[[str], str | None]) -> Pause | None:
    """The pause the annotations ask for, or None (`annotation(key)` reads one)."""
    raw_replicas = annotation(PAUSED_REPLICAS)
    if raw_replicas is not None and raw_replicas.strip() != "":
        text = raw_replicas.strip()
        if text.isdigit() and text.isascii() and len(text) <= 9:
            count = int(text)
            return Pause("replicas", "PausedAtReplicas",
                         f"paused at {phrase_replicas(count)} by annotation {PAUSED_REPLICAS}",
                         replicas=count)
        problem = f"annotation {PAUSED_REPLICAS}: {text!r} is not a whole number of replicas"
        return Pause("full", "InvalidPauseAnnotation",
                     f"paused, because {problem}; scaling resumes when it is fixed or removed",
                     problem=problem)
    paused = _read_flag(annotation, PAUSED)
    if isinstance(paused, Pause):
        return paused
    if paused:
        return Pause("full", "Paused", f"paused by annotation {PAUSED}")
    scale_in = _read_flag(annotation, PAUSED_SCALE_IN)
    if isinstance(scale_in, Pause):
        return scale_in
    scale_out = _read_flag(annotation, PAUSED_SCALE_OUT)
    if isinstance(scale_out, Pause):
        return scale_out
    if scale_in and scale_out:
        return Pause("scale-in-and-out", "ScaleInAndOutPaused",
                     f"scale-in and scale-out are paused by annotations {PAUSED_SCALE_IN} and "
                     f"{PAUSED_SCALE_OUT}")
    if scale_in:
        return Pause("scale-in", "ScaleInPaused", f"scale-in is paused by annotation "
                                                  f"{PAUSED_SCALE_IN}")
    if scale_out:
        return Pause("scale-out", "ScaleOutPaused", f"scale-out is paused by annotation "
                                                    f"{PAUSED_SCALE_OUT}")
    return None


def _read_flag(annotation: Callable[[str], str | None], key: str) -> bool | Pause:
    """An on/off annotation's value, or the full pause an unreadable value asks for."""
    value = annotation(key)
    flag = _flag(value)
    if flag is None:
        problem = f"annotation {key}: {value!r} is neither \"true\" nor \"false\""
        return Pause("full", "InvalidPauseAnnotation",
                     f"paused, because {problem}; scaling resumes when it is fixed or removed",
                     problem=problem)
    return flag


def report_pause(draft: Draft, pause: Pause | None, *, now: datetime) -> None:
    """The Paused condition while paused (and the events of pausing and resuming); without a
    pause annotation no condition is added, so an unpaused autoscaler's status is upstream's."""
    was = draft.true_condition(PAUSED_CONDITION)
    if pause is None:
        if was is not None:
            draft.lift_condition(
                PAUSED_CONDITION, event=Event("Normal", "Resumed", "the pause annotations "
                                              "were removed: scaling resumes"),
                explanation="The pause was lifted: the autoscaler scales again.")
        return
    draft.conditions = set_condition(draft.conditions, type=PAUSED_CONDITION, status=TRUE,
                                     reason=pause.reason, message=pause.message, now=now)
    if was is None or was.reason != pause.reason:
        draft.events.append(Event("Warning" if pause.problem else "Normal", pause.reason,
                                  pause.message))


class PausedProposal(NamedTuple):
    """Where a decision goes once the pause has had its say."""

    desired: int
    reason: str
    rescale: bool
    shown: int  # status.desiredReplicas when the size is kept


def apply_pause(draft: Draft, pause: Pause | None, *, desired: int, reason: str,
                rescale: bool) -> PausedProposal:
    """`paused-replicas` sets the size to its N; the other modes keep the current size where
    they hold the proposal's direction (status.desiredReplicas still shows the proposal)."""
    shown = draft.current
    if pause is not None and pause.mode == "replicas":
        assert pause.replicas is not None
        if pause.replicas != desired:
            draft.limits.append(Limit("PausedReplicas", desired, pause.replicas, pause.message))
        draft.explanation.append(f"Paused at {phrase_replicas(pause.replicas)} "
                                 f"({pause.message}); the metrics' {desired} is not applied.")
        desired, reason = pause.replicas, f"paused at {phrase_replicas(pause.replicas)}"
        rescale = desired != draft.current
    elif pause is not None and rescale and pause.holds(current=draft.current, desired=desired):
        draft.limits.append(Limit("Paused", desired, draft.current, pause.message))
        draft.explanation.append(f"Without the pause the target would go from {draft.current} "
                                 f"to {desired}: {pause.message}, so it stays.")
        shown, rescale = desired, False
    return PausedProposal(desired, reason, rescale, shown)
