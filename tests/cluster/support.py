"""What the tests on the real control plane share: waiting for the cluster to get somewhere, and
the Deployment they scale."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any


async def until(check: Callable[[], object] | Callable[[], Awaitable[object]], *, what: str,
                within: float = 180) -> None:
    """Poll `check` (plain or async) until it holds. `within` guards against a hang; it is not
    a measure (the cluster's sync periods are; the test's own timeout is 900 s)."""
    deadline = time.monotonic() + within
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within:.0f} s: {what}")
        await asyncio.sleep(0.25)


def deployment(namespace: str, *, name: str = "web", replicas: int = 1,
               labels: Mapping[str, str] | None = None,
               cpu_request: str | None = None) -> dict[str, Any]:
    """Deployment `name` selecting app=`name` (its pods carry `labels` besides), one container
    `app` of an image nothing pulls (the kubelet stand-in runs pods without images)."""
    container: dict[str, Any] = {"name": "app", "image": "registry.invalid/app:1"}
    if cpu_request is not None:
        container["resources"] = {"requests": {"cpu": cpu_request}}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name, **(labels or {})}},
                                  "spec": {"containers": [container]}}}}
