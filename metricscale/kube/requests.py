"""The one request path: a KubeHTTP request, its failure mapped once, retried by a policy.

Both programs' typed operations (scale, status, events, leases, reviews, discovery, metrics
reads) call `KubeRequests.call`: statuses become `metricscale.kube.errors` here and nowhere
else, retries follow a `RetryPolicy`, and every attempt is reported to an optional observer
(the autoscaler times them in a histogram by call site).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from metricscale.kube.errors import (
    ConnectionFailed,
    ErrorContext,
    KubeError,
    error_from_response,
)
from metricscale.kube.http import JSON, KubeHTTP, Response
from metricscale.kube.retry import NO_RETRY, RetryPolicy

__all__ = ["Attempt", "KubeRequests", "decode_json"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Attempt:
    """One try of a request, as an observer sees it (`code` is "<error>" without an answer)."""

    operation: str
    verb: str
    resource: str
    code: str
    seconds: float


def decode_json(body: bytes) -> Any:
    """A success body: its JSON, or the text when it is not JSON (callers then refuse it)."""
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")


class KubeRequests:
    """Requests over a KubeHTTP with one error mapping and one retry loop."""

    def __init__(self, http: KubeHTTP, *, retry: RetryPolicy = NO_RETRY,
                 observe: Callable[[Attempt], None] | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 jitter: Callable[[], float] = random.random) -> None:
        self.http = http
        self.retry = retry
        self._observe = observe
        self._sleep = sleep
        self._jitter = jitter
        self.count = 0  # attempts sent so far, for tests and benchmarks

    async def send(
        self, verb: str, path: str, *, operation: str, resource: str,
        query: Sequence[tuple[str, str]] = (), body: Any = None, content_type: str = JSON,
        accept: str = JSON, context: ErrorContext | None = None, retry: RetryPolicy | None = None,
        client_timeout: aiohttp.ClientTimeout | None = None,
    ) -> Response:
        """A 2xx answer, read whole; any other answer, or none, raises its KubeError after the
        policy's retries."""
        policy = retry or self.retry
        failures = 0
        while True:
            self.count += 1
            started = time.perf_counter()
            code = "<error>"
            try:
                response = await self.http.request(verb, path, query=query, body=body,
                                                   content_type=content_type, accept=accept,
                                                   client_timeout=client_timeout)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                # The exception text may name the URL, never a body: safe to show.
                error: KubeError = ConnectionFailed(
                    f"{verb} {path}: {type(exc).__name__}: {exc}".rstrip(": "), status=0)
            else:
                code = str(response.status)
                if 200 <= response.status < 300:
                    return response
                error = error_from_response(response.status, headers=response.headers,
                                            body=response.body, verb=verb, context=context)
            finally:
                if self._observe is not None:
                    self._observe(Attempt(operation, verb, resource, code,
                                          time.perf_counter() - started))
            failures += 1
            delay = policy.delay(error, failures=failures, jitter=self._jitter())
            if delay is None:
                raise error
            logger.info("%s %s failed (%s), retry %d in %.3fs", verb, path, error, failures,
                        delay)
            await self._sleep(delay)

    async def call(self, verb: str, path: str, **options: Any) -> Any:
        """Like `send`, and the answer's JSON (or its text when it is not JSON)."""
        return decode_json((await self.send(verb, path, **options)).body)
