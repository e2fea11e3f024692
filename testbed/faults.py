"""The faults a test injects on requests to a Kubernetes API server, and the rule that picks
the requests: one vocabulary for the fault proxy in front of the real kube-apiserver
(testbed.faultproxy) and for the fake API server (testbed.fakes.kube_api)."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DropConnection", "Fault", "FaultAction", "Latency", "ServerError", "StallWatch",
           "TooManyRequests"]


@dataclass(frozen=True)
class Latency:
    """Wait, then serve (or forward) the request as usual."""

    seconds: float


@dataclass(frozen=True)
class TooManyRequests:
    """429 with a Retry-After of `retry_after` seconds."""

    retry_after: int = 1


@dataclass(frozen=True)
class ServerError:
    """A Status of `code` (5xx); an empty `message` leaves the server's own wording."""

    code: int = 500
    message: str = ""


@dataclass(frozen=True)
class DropConnection:
    """Close the connection without an answer."""


@dataclass(frozen=True)
class StallWatch:
    """Answer 200 with a watch's headers, then send nothing until the client goes away."""


FaultAction = Latency | TooManyRequests | ServerError | DropConnection | StallWatch


@dataclass
class Fault:
    """Applies `action` to the requests whose path (with its query) matches `pattern`
    (re.search), of `method` if given, `remaining` times (None: every matching request)."""

    pattern: re.Pattern[str]
    action: FaultAction
    method: str | None = None
    remaining: int | None = 1
    hits: int = 0

    def matches(self, method: str, path: str) -> bool:
        if self.remaining is not None and self.remaining <= 0:
            return False
        if self.method is not None and self.method.upper() != method:
            return False
        return self.pattern.search(path) is not None
