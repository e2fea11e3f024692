"""Backoff and retries for Kubernetes requests, with the one Retry-After rule.

The rule: a Retry-After (header or `Status.details.retryAfterSeconds`, read by
`errors.parse_retry_after`) is a floor. A client never waits less than the server asked, nor
less than its own backoff step. A policy with a ceiling (`RetryPolicy.max_retry_after`) does not
wait for an answer that asks for more: it hands the error back, and the caller requeues.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from metricscale.kube.errors import KubeError, KubeUnavailable

__all__ = ["NO_RETRY", "Backoff", "RetryPolicy", "honour_retry_after", "is_retryable"]


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with equal jitter: half the step fixed, half random."""

    initial: float = 0.5
    factor: float = 2.0
    cap: float = 30.0

    @property
    def _steps_to_cap(self) -> int:
        """How many growths take `initial` to `cap`: past them the step stays at the cap, and
        `factor ** failures` itself would overflow a float after about 1,000 failures (an
        informer failing for hours), so the exponent stops there."""
        if self.factor <= 1 or self.initial <= 0 or self.initial >= self.cap:
            return 0
        return math.ceil(math.log(self.cap / self.initial, self.factor))

    def delay(self, failures: int, *, jitter: float, retry_after: float | None = None) -> float:
        """Seconds to wait after `failures` consecutive failures (>= 1); `jitter` is in [0, 1).

        Never less than `retry_after`, when the server sent one.
        """
        step = min(self.cap, self.initial * self.factor ** min(max(0, failures - 1),
                                                               self._steps_to_cap))
        return honour_retry_after(step / 2 + step / 2 * jitter, retry_after)


def honour_retry_after(delay: float, retry_after: float | None, *,
                       ceiling: float | None = None) -> float:
    """The one Retry-After rule: wait at least what the server asked for (up to `ceiling`,
    for a caller that would rather come back sooner than park), never less than `delay`."""
    if retry_after is None:
        return delay
    if ceiling is not None:
        retry_after = min(retry_after, ceiling)
    return max(delay, retry_after)


def is_retryable(error: KubeError) -> bool:
    """What can succeed on retry: 429, 5xx and requests that got no answer."""
    return isinstance(error, KubeUnavailable)


@dataclass(frozen=True)
class RetryPolicy:
    """How often one request is tried: `attempts` in all, for retryable errors only, waiting a
    `Backoff(initial, factor, cap)` in between.

    The defaults fit a controller's requests: a few quick tries, then the caller requeues.
    """

    attempts: int = 3
    initial: float = 0.1
    factor: float = 2.0
    cap: float = 2.0
    max_retry_after: float = 10.0

    @property
    def backoff(self) -> Backoff:
        return Backoff(initial=self.initial, factor=self.factor, cap=self.cap)

    def delay(self, error: KubeError, *, failures: int, jitter: float) -> float | None:
        """Seconds to wait before the next try after `failures` (>= 1) failures, or None when
        the error goes back to the caller (not retryable, attempts spent, or a Retry-After
        beyond `max_retry_after`)."""
        if failures >= self.attempts or not is_retryable(error):
            return None
        if error.retry_after is not None and error.retry_after > self.max_retry_after:
            return None
        return self.backoff.delay(failures, jitter=jitter, retry_after=error.retry_after)


NO_RETRY = RetryPolicy(attempts=1)
