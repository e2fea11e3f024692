"""The Events a decision asks the controller to record on the autoscaler."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Event"]


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event the controller records on the autoscaler."""

    type: str  # Normal or Warning
    reason: str
    message: str
