"""The leader publishes its decision settings on the Lease it writes (for `explain --live`), on
the real kube-apiserver."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from autoscaler.controller.leader import LeaderElectionConfig, LeaderElector, publish_settings
from autoscaler.decision.settings import (
    SETTINGS_ANNOTATION,
    Settings,
    parse_settings_annotation,
    render_settings,
    render_settings_annotation,
    resolve_settings,
)
from autoscaler.kube.operations import KubeClient
from metricscale.kube.http import open_kube_http
from testbed.controlplane import ControlPlane

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
LEASE = "metricscale-autoscaler"
SETTINGS = Settings(downscale_stabilization_window=timedelta(seconds=20))


@pytest.fixture
async def client(control_plane: ControlPlane) -> AsyncIterator[KubeClient]:
    async with open_kube_http(control_plane.api_client_configuration()) as http:
        yield KubeClient(http, registry=CollectorRegistry(), reporting_instance="a")


def stored(cluster: ControlPlane, namespace: str) -> dict[str, Any]:
    lease: dict[str, Any] = cluster.get(
        f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{LEASE}")
    return lease


def stored_annotations(cluster: ControlPlane, namespace: str) -> dict[str, str]:
    annotations: dict[str, str] = stored(cluster, namespace)["metadata"].get("annotations") or {}
    return annotations


def elector(client: KubeClient, namespace: str, *, at: datetime,
            settings: Settings | None = None) -> LeaderElector:
    return LeaderElector(client, config=LeaderElectionConfig(resource_namespace=namespace),
                         identity="a", namespace=namespace, clock=lambda: at,
                         settings=settings)


async def test_created_lease_carries_the_settings_as_compact_json(
        control_plane: ControlPlane, namespace: str, client: KubeClient) -> None:
    assert await elector(client, namespace, at=T0, settings=SETTINGS).try_acquire_or_renew()
    value = stored_annotations(control_plane, namespace)[SETTINGS_ANNOTATION]
    assert value == json.dumps(render_settings(SETTINGS), separators=(",", ":"))
    assert json.loads(value)["downscaleStabilizationWindowSeconds"] == 20
    assert parse_settings_annotation(value) == SETTINGS


async def test_renewal_publishes_the_writers_settings(
        control_plane: ControlPlane, namespace: str, client: KubeClient) -> None:
    await elector(client, namespace, at=T0, settings=Settings()).try_acquire_or_renew()
    later = T0 + timedelta(seconds=2)
    # The same identity with new settings (a reconfigured leader) renews: a PUT.
    assert await elector(client, namespace, at=later, settings=SETTINGS).try_acquire_or_renew()
    annotations = stored_annotations(control_plane, namespace)
    assert parse_settings_annotation(annotations[SETTINGS_ANNOTATION]) == SETTINGS


async def test_without_settings_no_annotation_is_written(
        control_plane: ControlPlane, namespace: str, client: KubeClient) -> None:
    await elector(client, namespace, at=T0).try_acquire_or_renew()
    assert SETTINGS_ANNOTATION not in stored_annotations(control_plane, namespace)


async def test_without_election_the_settings_are_published_and_the_holder_left_alone(
        control_plane: ControlPlane, namespace: str, client: KubeClient) -> None:
    """--leader-elect=false: the single replica publishes its settings on the Lease all the
    same; a lease an elector holds keeps its holder and spec."""
    await publish_settings(client, namespace=namespace, name=LEASE,
                           settings=SETTINGS)
    published = stored_annotations(control_plane, namespace)[SETTINGS_ANNOTATION]
    assert parse_settings_annotation(published) == SETTINGS
    assert not stored(control_plane, namespace)["spec"].get("holderIdentity")
    # An elector takes the unheld lease at once, and a later publish leaves its holder alone.
    assert await elector(client, namespace, at=T0, settings=Settings()).try_acquire_or_renew()
    await publish_settings(client, namespace=namespace, name=LEASE,
                           settings=SETTINGS)
    assert stored(control_plane, namespace)["spec"]["holderIdentity"] == "a"
    published = stored_annotations(control_plane, namespace)[SETTINGS_ANNOTATION]
    assert parse_settings_annotation(published) == SETTINGS


WINDOW = {"downscale_stabilization_window": timedelta(seconds=60)}


@pytest.mark.parametrize(("published", "given", "expected", "source"), [
    (render_settings_annotation(SETTINGS), {}, SETTINGS, "controller"),
    (render_settings_annotation(SETTINGS), WINDOW,
     Settings(downscale_stabilization_window=timedelta(seconds=60)), "controller and flags"),
    (None, WINDOW, Settings(downscale_stabilization_window=timedelta(seconds=60)), "flags"),
    ("not json", {}, Settings(), "defaults"),
    (None, {}, Settings(), "defaults"),
])
def test_explain_and_replay_decide_with_the_published_settings_under_the_given_flags(
        published: str | None, given: dict[str, timedelta], expected: Settings,
        source: str) -> None:
    assert resolve_settings(published=published, given=given) == (expected, source)
