"""Watching a namespaced list of the real API server from a thread of its own (so a busy test
event loop cannot delay it): `ListWatch` lists, then watches from the list's resourceVersion,
and starts again from a new list when a watch ends or fails, until it is stopped.
`ValueWatch` records a number of each object and every change of it (a Deployment's
spec.replicas, an HPA's status.desiredReplicas); testbed.load.Load spreads load over the Ready
pods it watches.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from testbed.controlplane import ControlPlane

logger = logging.getLogger(__name__)

Change = tuple[float, int]


def close_stream(response: Any) -> None:
    """Unblocks a thread reading `response` (an open watch) by shutting its socket down."""
    with contextlib.suppress(Exception):
        response.fp.raw._sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(Exception):
        response.close()


class ListWatch:
    """The list at `path` (a query string may follow it), then its watch events, handed to
    `listed` and `changed` in the thread; `retry` seconds between a failed watch and the next
    list."""

    def __init__(self, cluster: ControlPlane, path: str, *, name: str,
                 retry: float = 0.2) -> None:
        self.cluster = cluster
        self.path = path
        self._retry = retry
        self._stop = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def listed(self, items: Sequence[Mapping[str, Any]]) -> None:
        """The objects of a fresh list (every one of them, after a watch that ended too)."""

    def changed(self, kind: str, obj: Mapping[str, Any]) -> None:
        """A watch event: ADDED, MODIFIED or DELETED."""

    def _run(self) -> None:
        context = self.cluster._context()  # as the admin
        separator = "&" if "?" in self.path else "?"
        while not self._stop.is_set():
            try:
                listed = self.cluster.get(self.path)
                self.listed(listed["items"])
                url = (f"{self.cluster.server}{self.path}{separator}watch=1&timeoutSeconds=120"
                       f"&resourceVersion={listed['metadata']['resourceVersion']}")
                with urllib.request.urlopen(url, context=context, timeout=300) as response:
                    self._response = response
                    for line in response:
                        if self._stop.is_set():
                            return
                        event = json.loads(line)
                        kind = event.get("type")
                        if kind == "ERROR" or not event.get("object"):
                            break  # e.g. 410 Gone: list again
                        if kind in {"ADDED", "MODIFIED", "DELETED"}:
                            self.changed(kind, event["object"])
            except Exception as error:  # the watch is retried until stopped
                if not self._stop.is_set():
                    logger.debug("watching %s: %s; watching again", self.path, error)
                    self._stop.wait(self._retry)

    def alive(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        close_stream(self._response)
        self._thread.join(timeout=30)


class ValueWatch(ListWatch):
    """Every change of `value(object)` per object name in the list at `path`. `value` returns
    None for an object whose number is not known yet (it is then not recorded); `on_change` is
    called, in the watch's thread, with the name and the new number. Each change is kept with
    the time `clock` gave when it was seen."""

    def __init__(self, cluster: ControlPlane, path: str,
                 value: Callable[[Mapping[str, Any]], int | None], *,
                 clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[str, int], None] | None = None,
                 name: str = "value watch") -> None:
        super().__init__(cluster, path, name=name)
        self._value = value
        self._clock = clock
        self._on_change = on_change
        self._changes: dict[str, list[Change]] = {}
        self._lock = threading.Lock()

    def listed(self, items: Sequence[Mapping[str, Any]]) -> None:
        for item in items:
            self._saw(item)

    def changed(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind != "DELETED":
            self._saw(obj)

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

    def __enter__(self) -> ValueWatch:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


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
