"""The leader publishes its decision settings on the Lease it writes (for `explain --live`)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

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
from testbed.fakes.kube_api import FakeKubeAPI

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
CONFIG = LeaderElectionConfig(resource_namespace="ops")
SETTINGS = Settings(downscale_stabilization_window=timedelta(seconds=20))


@pytest.fixture
async def client(fake_kube: FakeKubeAPI) -> AsyncIterator[KubeClient]:
    async with open_kube_http(fake_kube.api_client_configuration()) as http:
        yield KubeClient(http, registry=CollectorRegistry(), reporting_instance="a")


def stored_annotations(fake_kube: FakeKubeAPI) -> dict[str, str]:
    lease = fake_kube.store.try_get("coordination.k8s.io", "v1", "leases",
                                    "metricscale-autoscaler", namespace="ops")
    assert lease is not None
    annotations: dict[str, str] = lease["metadata"].get("annotations") or {}
    return annotations


async def test_created_lease_carries_the_settings_as_compact_json(
        fake_kube: FakeKubeAPI, client: KubeClient) -> None:
    elector = LeaderElector(client, config=CONFIG, identity="a", namespace="ops",
                            clock=lambda: T0, settings=SETTINGS)
    assert await elector.try_acquire_or_renew() is True
    value = stored_annotations(fake_kube)[SETTINGS_ANNOTATION]
    assert value == json.dumps(render_settings(SETTINGS), separators=(",", ":"))
    assert json.loads(value)["downscaleStabilizationWindowSeconds"] == 20
    assert parse_settings_annotation(value) == SETTINGS


async def test_renewal_publishes_the_writers_settings(
        fake_kube: FakeKubeAPI, client: KubeClient) -> None:
    first = LeaderElector(client, config=CONFIG, identity="a", namespace="ops",
                          clock=lambda: T0, settings=Settings())
    await first.try_acquire_or_renew()
    later = T0 + timedelta(seconds=2)
    # The same identity with new settings (a reconfigured leader) renews: a PUT.
    renewed = LeaderElector(client, config=CONFIG, identity="a", namespace="ops",
                            clock=lambda: later, settings=SETTINGS)
    assert await renewed.try_acquire_or_renew() is True
    annotations = stored_annotations(fake_kube)
    assert parse_settings_annotation(annotations[SETTINGS_ANNOTATION]) == SETTINGS


async def test_without_settings_no_annotation_is_written(
        fake_kube: FakeKubeAPI, client: KubeClient) -> None:
    elector = LeaderElector(client, config=CONFIG, identity="a", namespace="ops",
                            clock=lambda: T0)
    await elector.try_acquire_or_renew()
    assert SETTINGS_ANNOTATION not in stored_annotations(fake_kube)


async def test_without_election_the_settings_are_published_and_the_holder_left_alone(
        fake_kube: FakeKubeAPI, client: KubeClient) -> None:
    """--leader-elect=false: the single replica publishes its settings on the Lease all the
    same; a lease an elector holds keeps its holder and spec."""
    await publish_settings(client, namespace="ops", name="metricscale-autoscaler",
                           settings=SETTINGS)
    assert parse_settings_annotation(stored_annotations(fake_kube)[SETTINGS_ANNOTATION]) == \
        SETTINGS
    lease = fake_kube.store.try_get("coordination.k8s.io", "v1", "leases",
                                    "metricscale-autoscaler", namespace="ops")
    assert lease is not None and not lease["spec"].get("holderIdentity")
    # An elector takes the unheld lease at once, and a later publish leaves its holder alone.
    elector = LeaderElector(client, config=CONFIG, identity="a", namespace="ops",
                            clock=lambda: T0, settings=Settings())
    assert await elector.try_acquire_or_renew() is True
    await publish_settings(client, namespace="ops", name="metricscale-autoscaler",
                           settings=SETTINGS)
    lease = fake_kube.store.try_get("coordination.k8s.io", "v1", "leases",
                                    "metricscale-autoscaler", namespace="ops")
    assert lease is not None and lease["spec"]["holderIdentity"] == "a"
    assert parse_settings_annotation(stored_annotations(fake_kube)[SETTINGS_ANNOTATION]) == \
        SETTINGS


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
