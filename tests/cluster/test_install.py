"""`kubectl apply -k manifests` on a real control plane, and what a user checks afterwards."""

from __future__ import annotations

import json

from testbed.install import APISERVICES, Installation


def test_every_apiservice_is_available_through_the_real_aggregator(
        installation: Installation) -> None:
    for group, version in APISERVICES:
        available, message = installation.cluster.apiservice_available(group, version)
        assert available, f"{version}.{group}: {message}"


def test_kubectl_get_raw_lists_the_three_metric_groups(installation: Installation) -> None:
    for group, version in APISERVICES:
        listed = json.loads(installation.cluster.kubectl(
            "get", "--raw", f"/apis/{group}/{version}").stdout)
        assert listed["kind"] == "APIResourceList"
        assert listed["groupVersion"] == f"{group}/{version}"
