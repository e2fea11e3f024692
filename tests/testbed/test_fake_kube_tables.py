"""Fake kube-apiserver: Tables (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`) for lists,
single objects and watches, with a CRD's additionalPrinterColumns, so `kubectl get msa` prints
the CRD's own columns.

Pins apiextensions-apiserver/pkg/registry/customresource/tableconvertor (the columns, JSONPath
cells by type, dates as ages) and apiserver/pkg/endpoints/handlers/watch.go (a Table per watch
event, the column definitions only in the first).
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.fakes.kube_api import FakeKubeAPI
from testbed.fakes.kube_http import KubeHTTPClient
from testbed.fakes.tools import require_tool

REPO = Path(__file__).resolve().parents[2]
AUTOSCALERS = "/apis/metricscale.dev/v1alpha1/namespaces/demo/autoscalers"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
MERGE = "application/merge-patch+json"
COLUMNS = ["Name", "Reference", "Targets", "MinPods", "MaxPods", "Replicas", "Age"]


async def _autoscaler(fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    crd = yaml.safe_load((REPO / "manifests" / "autoscaler" / "crd.yaml").read_text())
    fake_kube.create("apiextensions.k8s.io", "v1", "customresourcedefinitions", crd)
    await kube_http.post(AUTOSCALERS, {
        "apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
        "metadata": {"name": "web"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                    "name": "web"}, "minReplicas": 2, "maxReplicas": 10}})
    await kube_http.patch(f"{AUTOSCALERS}/web/status", {"status": {
        "currentReplicas": 3, "desiredReplicas": 3, "reference": "Deployment/web",
        "targets": "12/10"}}, content_type=MERGE)


def _cells(table: dict[str, Any]) -> list[list[Any]]:
    return [row["cells"][:-1] for row in table["rows"]]  # the age depends on the clock


async def test_a_list_table_has_the_crds_printer_columns(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    await _autoscaler(fake_kube, kube_http)
    table = (await kube_http.get(AUTOSCALERS, headers={"Accept": TABLE})).json
    assert table["kind"] == "Table"
    assert [c["name"] for c in table["columnDefinitions"]] == COLUMNS
    assert [c["type"] for c in table["columnDefinitions"]][-1] == "date"
    assert _cells(table) == [["web", "Deployment/web", "12/10", 2, 10, 3]]
    assert table["rows"][0]["cells"][-1].endswith("s")  # an age, not a timestamp
    assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"


async def test_a_single_object_can_be_read_as_a_table(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    await _autoscaler(fake_kube, kube_http)
    table = (await kube_http.get(f"{AUTOSCALERS}/web", headers={"Accept": TABLE})).json
    assert table["kind"] == "Table" and _cells(table) == [["web", "Deployment/web", "12/10",
                                                            2, 10, 3]]


async def test_a_watch_sends_a_table_per_event_with_headers_only_first(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    await _autoscaler(fake_kube, kube_http)
    events: list[dict[str, Any]] = []
    opened = asyncio.Event()  # the first event (ADDED) is in: the watch is open

    async def read() -> None:
        async for line in kube_http.watch(AUTOSCALERS, {"resourceVersion": "0"},
                                          headers={"Accept": TABLE}):
            events.append(line)
            opened.set()
            if len(events) == 2:
                return

    reader = asyncio.create_task(read())
    await asyncio.wait_for(opened.wait(), 30)
    await kube_http.patch(f"{AUTOSCALERS}/web/status", {"status": {"currentReplicas": 4}},
                          content_type=MERGE)
    await asyncio.wait_for(reader, 5)
    first, second = (event["object"] for event in events)
    assert [c["name"] for c in first["columnDefinitions"]] == COLUMNS
    assert second["columnDefinitions"] == []
    assert second["rows"][0]["cells"][5] == 4


@pytest.mark.kubectl
async def test_kubectl_get_prints_the_crds_columns(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient, kubeconfig: Path) -> None:
    kubectl = require_tool("kubectl")
    await _autoscaler(fake_kube, kube_http)
    result = await asyncio.to_thread(
        subprocess.run, [kubectl, "--kubeconfig", str(kubeconfig), "get", "msa", "-n", "demo"],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    header, row = result.stdout.splitlines()
    assert header.split() == ["NAME", "REFERENCE", "TARGETS", "MINPODS", "MAXPODS", "REPLICAS",
                              "AGE"]
    assert row.split()[:6] == ["web", "Deployment/web", "12/10", "2", "10", "3"]
