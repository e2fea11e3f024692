"""What TokenReviews and SubjectAccessReviews share: cache lifetimes and bounds, the retry
policy, the error of an answer of the wrong shape, and a small LRU cache whose entries expire
(the caller supplies the time)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

# --authentication-token-webhook-cache-ttl (success and failure alike; transport errors are not
# answers and are never cached) and --authorization-webhook-cache-{un,}authorized-ttl.
TOKEN_CACHE_TTL_SECONDS = 10.0
AUTHORIZED_TTL_SECONDS = 10.0
UNAUTHORIZED_TTL_SECONDS = 10.0
CACHE_MAX_ENTRIES = 8192
# Requester-controlled attributes this long or longer are not cached (a DoS guard upstream).
MAX_CACHED_ATTRIBUTES_BYTES = 10_000
# The webhook clients' backoff: 500 ms, factor 1.5, 5 attempts in all (jitter is the caller's).
REVIEW_RETRY_DELAYS_SECONDS = (0.5, 0.75, 1.125, 1.6875)


class ReviewResponseError(ValueError):
    """A TokenReview or SubjectAccessReview answer is not the shape the API promises."""


def should_retry_review(status_code: int | None) -> bool:
    """Retry connection errors (None), 429 and 5xx; anything else will not change on retry."""
    return status_code is None or status_code == 429 or status_code >= 500


K = TypeVar("K")
V = TypeVar("V")


class TTLCache(Generic[K, V]):
    """LRU-bounded cache whose entries expire ``ttl`` seconds after being stored."""

    def __init__(self, *, max_entries: int = CACHE_MAX_ENTRIES) -> None:
        self._max_entries = max_entries
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K, *, now: float) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires, value = entry
        if now >= expires:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V, *, ttl: float, now: float) -> None:
        if ttl <= 0:
            return
        self._entries[key] = (now + ttl, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
