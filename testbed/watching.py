"""A number of each object of a namespaced list, and every change of it, from a watch in a
thread of its own (so a busy test event loop cannot delay it): a Deployment's spec.replicas, an
HPA's status.desiredReplicas.

The list is read, then watched from its resourceVersion; a watch that ends or fails is started
again from a new list until the recorder is stopped. Each change is kept with the time `clock`
gave when it was seen.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from testbed.controlplane import ControlPlane
from testbed.load import close_stream

logger = logging.getLogger(__name__)

Change = tuple[float, int]


class ValueWatch:
    """Every change of `value(object)` per object name in the list at `path`. `value` returns
    None for an object whose number is not known yet (it is then not recorded); `on_change` is
    called, in the watch's thread, with the name and the new number."""

    def __init__(self, cluster: ControlPlane, path: str,
                 value: Callable[[Mapping[str, Any]], int | None], *,
                 clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[str, int], None] | None = None,
                 name: str = "value watch") -> None:
        self.cluster = cluster
        self.path = path
        self._value = value
        self._clock = clock
        self._on_change = on_change
        self._changes: dict[str, list[Change]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        context = self.cluster._context()  # as the admin
        while not self._stop.is_set():
            try:
                listed = self.cluster.get(self.path)
                for item in listed["items"]:
                    self._saw(item)
                url = (f"{self.cluster.server}{self.path}?watch=1&timeoutSeconds=120"
                       f"&resourceVersion={listed['metadata']['resourceVersion']}")
                with urllib.request.urlopen(url, context=context, timeout=300) as response:
                    self._response = response
                    for line in response:
                        if self._stop.is_set():
                            return
                        event = json.loads(line)
                        if event.get("type") == "ERROR":
                            break  # e.g. 410 Gone: list again
                        if event.get("type") in {"ADDED", "MODIFIED"}:
                            self._saw(event["object"])
            except Exception as error:  # the watch is retried until stopped
                if not self._stop.is_set():
                    logger.debug("watching %s: %s; watching again", self.path, error)
                    self._stop.wait(0.2)

    def _saw(self, obj: Mapping[str, Any]) -> None:
        number = self._value(obj)
        if number is None:
            return
        name = str(obj["metadata"]["name"])
        with self._lock:
            seen = self._changes.setdefault(name, [])
            if seen and seen[-1][1] == number:
                return
            seen.append((self._clock(), number))
        if self._on_change is not None:
            self._on_change(name, number)

    def sequence(self, name: str) -> list[Change]:
        """Every change of `name`'s number so far, oldest first."""
        with self._lock:
            return list(self._changes.get(name, []))

    def now(self, name: str) -> int | None:
        """`name`'s number as last seen (None before the first)."""
        sequence = self.sequence(name)
        return sequence[-1][1] if sequence else None

    def since(self, name: str, moment: float) -> list[Change]:
        """The number at `moment`, then every change after it."""
        seen = self.sequence(name)
        before = [change for change in seen if change[0] <= moment]
        return before[-1:] + [change for change in seen if change[0] > moment]

    def alive(self) -> bool:
        return self._thread.is_alive()

    def __enter__(self) -> ValueWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        close_stream(self._response)
        self._thread.join(timeout=30)


def spec_replicas(obj: Mapping[str, Any]) -> int:
    """A Deployment's (or any scalable's) spec.replicas; the API's default is 1."""
    return int((obj.get("spec") or {}).get("replicas", 1))


def desired_replicas(obj: Mapping[str, Any]) -> int | None:
    """An HPA's status.desiredReplicas once kube-controller-manager has reconciled it (before
    that, its status has no conditions and desiredReplicas is the API's zero)."""
    status = obj.get("status") or {}
    if not status.get("conditions"):
        return None
    return int(status.get("desiredReplicas", 0))


def deployment_replicas(cluster: ControlPlane, namespace: str, **options: Any) -> ValueWatch:
    """Every change of spec.replicas of the namespace's Deployments."""
    return ValueWatch(cluster, f"/apis/apps/v1/namespaces/{namespace}/deployments",
                      spec_replicas, name=f"deployments of {namespace}", **options)


def hpa_decisions(cluster: ControlPlane, namespace: str, **options: Any) -> ValueWatch:
    """Every change of each HPA's status.desiredReplicas in the namespace, once reconciled."""
    return ValueWatch(
        cluster, f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers",
        desired_replicas, name=f"HPAs of {namespace}", **options)
