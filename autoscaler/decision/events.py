"""The Events a decision asks the controller to record on the autoscaler."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Event"]


class Event(NamedTuple):
    """A Kubernetes Event the controller records on the autoscaler."""

    type: str  # Normal or Warning
    reason: str
    message: str
