"""`metricscale explain --live NS/NAME --shadow`: what shadow mode published for an HPA (its
history and latest verdict, in the ConfigMap beside its Lease), read back, or said to be
missing; and the text and JSON that show it."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

import pytest

from autoscaler.controller.capture import ShadowPublished, read_shadow
from autoscaler.explain import add_arguments
from metricscale.kube.errors import ErrorContext, Forbidden, NotFound

ENTRY = json.dumps({
    "decision": {"since": "2026-11-21T10:00:00Z", "currentReplicas": 2, "replicas": 3,
                 "hpaCurrentReplicas": 2, "hpaDesiredReplicas": 3, "result": "agree",
                 "reason": "pods metric qps above target"},
    "history": {"recommendations": [{"timestamp": "2026-11-21T10:00:00Z", "replicas": 3}],
                "scaleUpEvents": [{"timestamp": "2026-11-21T10:00:00Z", "replicaChange": 1,
                                   "outdated": False}],
                "scaleDownEvents": []}})


class ConfigMapAPI:
    """get_json of one ConfigMap (or the error reading it)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.paths: list[str] = []

    async def get_json(self, path: str, *, query: Sequence[tuple[str, str]] = (),
                       operation: str, resource: str,
                       context: ErrorContext | None = None) -> Any:
        self.paths.append(path)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    async def resolve_scale_target(self, ref: Any) -> Any:
        raise AssertionError("not asked")

    async def get_scale(self, target: Any, *, namespace: str, name: str) -> Any:
        raise AssertionError("not asked")


async def read(answer: Any) -> tuple[ShadowPublished, list[str]]:
    api = ConfigMapAPI(answer)
    published = await read_shadow(api, lease_namespace="metricscale",
                                  lease_name="metricscale-shadow", namespace="shop", name="web")
    return published, api.paths


async def test_the_entry_of_the_hpa_gives_its_history_and_latest_verdict() -> None:
    published, paths = await read({"data": {"shop.web": ENTRY, "shop.other": "{}"}})
    assert paths == ["/api/v1/namespaces/metricscale/configmaps/metricscale-shadow"]
    assert published.history is not None
    assert [e.replica_change for e in published.history.scale_up_events] == [1]
    assert published.lines[0] == ("shadow: the history and the latest verdict of ConfigMap "
                                  "metricscale/metricscale-shadow")
    assert published.lines[1] == ("shadow mode, since 2026-11-21T10:00:00Z: from 2 replicas "
                                  "metricscale decides 3, the HPA 3 (from 2): agree")
    assert published.rendered["decision"]["result"] == "agree"


@pytest.mark.parametrize(("answer", "words"), [
    ({"data": {"shop.other": "{}"}}, "has no entry for shop/web"),
    ({}, "has no entry for shop/web"),
    (NotFound("configmaps \"metricscale-shadow\" not found", status=404, reason="NotFound"),
     "cannot be read (configmaps \"metricscale-shadow\" not found)"),
    (Forbidden("forbidden", status=403, reason="Forbidden"), "cannot be read (forbidden)"),
    ({"data": {"shop.web": "{"}}, "is not JSON"),
])
async def test_what_cannot_be_read_is_said_and_explained_as_a_first_sync(
        answer: Any, words: str) -> None:
    published, _ = await read(answer)
    assert published.history is None
    assert words in published.lines[0] and published.lines[0].endswith(
        "explained as a first sync")


def test_shadow_is_a_flag_of_explain_live() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--live", "shop/web", "--shadow"])
    assert args.shadow and not args.hpa
