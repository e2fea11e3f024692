"""Posting TokenReviews and SubjectAccessReviews to kube-apiserver, retried as the Go webhook
clients retry them; what may be logged about a token."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp

from adapter.auth.authentication import token_cache_key
from adapter.auth.reviews import REVIEW_RETRY_DELAYS_SECONDS, should_retry_review
from metricscale.kube.errors import KubeError
from metricscale.kube.http import KubeHTTP
from metricscale.kube.requests import KubeRequests
from metricscale.kube.retry import honour_retry_after

__all__ = ["REVIEW_TIMEOUT_SECONDS", "SUBJECT_ACCESS_REVIEWS_PATH", "TOKEN_REVIEWS_PATH",
           "ReviewClient", "ReviewFailed", "Sleep", "token_label"]

logger = logging.getLogger(__name__)

TOKEN_REVIEWS_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"
SUBJECT_ACCESS_REVIEWS_PATH = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
# The webhook clients' per-call timeout and backoff jitter (wait.Backoff{Jitter: 0.2}).
REVIEW_TIMEOUT_SECONDS = 10.0
_REVIEW_JITTER = 0.2
# A Retry-After longer than this is not waited for: the caller is waiting on the answer.
_MAX_RETRY_AFTER_SECONDS = 5.0
_TOKEN_DIGEST_SHOWN = 12

Sleep = Callable[[float], Awaitable[None]]


class ReviewFailed(Exception):
    """A TokenReview or SubjectAccessReview could not be made (after retries, if retryable)."""

    def __init__(self, message: str, *, status: int | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


def token_label(token: str) -> str:
    """What may be logged about a token: a short prefix of its SHA-256 digest."""
    return f"sha256:{token_cache_key(token)[:_TOKEN_DIGEST_SHOWN]}"


class ReviewClient:
    """POSTs review objects to kube-apiserver, retrying as the Go webhook clients do.

    Connection errors, timeouts, 429 and 5xx are retried (500 ms, ×1.5, 5 attempts in all,
    20 % jitter, 10 s per attempt); anything else fails at once. A Retry-After is waited (at
    most 5 s) when it is longer than the step. Requests go out on the shared request path,
    which never logs a body (a TokenReview answer holds the token). The session arrives when
    the app starts (`api`); before that every review fails.
    """

    def __init__(self, *, sleep: Sleep = asyncio.sleep, jitter: Callable[[], float] = random.random,
                 timeout: float = REVIEW_TIMEOUT_SECONDS) -> None:
        self.api: KubeHTTP | None = None
        self._sleep = sleep
        self._jitter = jitter
        self._timeout = timeout

    async def create(self, path: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """The created object as kube-apiserver returned it; raises ReviewFailed."""
        attempts = len(REVIEW_RETRY_DELAYS_SECONDS) + 1
        for attempt in range(attempts):
            try:
                return await self._post_once(path, body)
            except ReviewFailed as error:
                if attempt == attempts - 1 or not should_retry_review(error.status):
                    raise
                delay = REVIEW_RETRY_DELAYS_SECONDS[attempt]
                delay *= 1 + _REVIEW_JITTER * self._jitter()
                delay = honour_retry_after(delay, error.retry_after,
                                           ceiling=_MAX_RETRY_AFTER_SECONDS)
                logger.debug("retrying %s in %.2fs: %s", path, delay, error)
                await self._sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _post_once(self, path: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        api = self.api
        if api is None:
            raise ReviewFailed("the Kubernetes API client is not open yet")
        try:
            answer = await KubeRequests(api).send(
                "POST", path, operation="review", resource=path.rsplit("/", 1)[-1], body=body,
                client_timeout=aiohttp.ClientTimeout(total=self._timeout))
        except KubeError as error:
            if not error.status:  # no answer: the text names the URL, never the body
                raise ReviewFailed(f"POST {path}: {error}") from None
            raise ReviewFailed(f"POST {path}: the API server answered {error.status}",
                               status=error.status, retry_after=error.retry_after) from None
        status, payload = answer.status, answer.body
        try:
            parsed = json.loads(payload)
        except ValueError:
            raise ReviewFailed(f"POST {path}: the answer is not JSON", status=status) from None
        if not isinstance(parsed, Mapping):
            raise ReviewFailed(f"POST {path}: the answer is not an object", status=status)
        return parsed
