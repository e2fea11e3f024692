"""Stall detection of the informer: a watch that sends neither events nor bookmarks restarts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from metricscale.kube.http import KubeHTTP
from metricscale.kube.informer import (
    BOOKMARK_INTERVAL_SECONDS,
    DEFAULT_STALL_TIMEOUT,
    Informer,
    InformerCollector,
    InformerEvent,
    PathSource,
    collection_path,
    project_raw,
)
from metricscale.kube.retry import Backoff
from testbed.fakes.kube_api import FakeKubeAPI, StallWatch

FAST: dict[str, Any] = {"backoff": Backoff(initial=0.01, cap=0.02), "jitter": lambda: 0.0}
STALL = 0.8


def deployments(session: KubeHTTP) -> PathSource:
    return PathSource(session, collection_path(group="apps", version="v1", plural="deployments"))


def test_the_default_stall_timeout_outlasts_the_apiservers_bookmark_interval() -> None:
    assert DEFAULT_STALL_TIMEOUT > BOOKMARK_INTERVAL_SECONDS


async def test_a_stalled_rewatch_is_restarted_and_the_change_arrives(
        fake_kube: FakeKubeAPI, kube_session: KubeHTTP) -> None:
    """Bound: the running 1 s watch ends (<= 1 s), the stalled re-watch is given up after the
    stall timeout (0.8 s), and the re-list that follows is immediate: 5 s leaves room for a
    loaded CI machine while staying far below the 120 s inactivity timeout."""
    fake_kube.create_deployment("web", namespace="shop", replicas=2)
    informer: Informer[Mapping[str, Any]] = Informer(
        PathSource(kube_session, collection_path(group="apps", version="v1",
                                                 plural="deployments")),
        project=project_raw, watch_timeout_seconds=1, stall_timeout=STALL, **FAST)
    changed = asyncio.Event()

    def record(event: InformerEvent[Mapping[str, Any]]) -> None:
        if event.kind == "MODIFIED":
            changed.set()

    informer.subscribe(record)
    async with informer:
        assert await informer.wait_synced(5)
        stall = fake_kube.add_fault(r"/deployments$", StallWatch(), method="GET")
        fake_kube.store.mutate("apps", "v1", "deployments", "web",
                               lambda obj: obj["spec"].update(replicas=5), namespace="shop")
        started = time.monotonic()
        await changed.wait()
        assert stall.hits == 1
        assert time.monotonic() - started >= STALL  # it did wait out the stall
    assert informer.restarts.get("stalled") == 1
    assert informer.get("shop", "web")["spec"]["replicas"] == 5  # type: ignore[index]


async def test_a_cache_silent_past_the_stall_timeout_is_stale_until_it_hears_again(
        fake_kube: FakeKubeAPI, kube_session: KubeHTTP) -> None:
    now = [100.0]
    informer: Informer[Mapping[str, Any]] = Informer(
        deployments(kube_session), project=project_raw, stall_timeout=STALL,
        clock=lambda: now[0], **FAST)
    assert informer.stale_reason() is not None  # not synced yet
    assert informer.last_event_age() is None
    await informer.list_once()
    assert informer.stale_reason() is None
    now[0] += STALL + 0.1
    reason = informer.stale_reason()
    assert reason is not None and "no event or bookmark" in reason
    assert abs((informer.last_event_age() or 0.0) - (STALL + 0.1)) < 1e-9
    await informer.list_once()
    assert informer.stale_reason() is None


async def test_cache_series_show_age_sync_and_restarts_by_reason(
        fake_kube: FakeKubeAPI, kube_session: KubeHTTP) -> None:
    informer: Informer[Mapping[str, Any]] = Informer(
        deployments(kube_session), project=project_raw, name="deployments",
        watch_timeout_seconds=1, **FAST)
    registry = CollectorRegistry()
    registry.register(InformerCollector(lambda: [informer]))
    text = generate_latest(registry).decode()
    assert 'metricscale_cache_synced{cache="deployments"} 0.0' in text
    assert "metricscale_cache_last_event_age_seconds{" not in text
    await informer.list_once()
    await informer.step()  # one 1 s watch that the server closes
    text = generate_latest(registry).decode()
    assert 'metricscale_cache_synced{cache="deployments"} 1.0' in text
    assert 'metricscale_cache_last_event_age_seconds{cache="deployments"}' in text
    assert 'metricscale_cache_watch_restarts_total{cache="deployments",reason="closed"} 1.0' \
        in text
    assert 'metricscale_cache_stale{cache="deployments"} 0.0' in text
