"""`metricscale explain --live NAMESPACE/NAME` against the fake API server: it captures the same
inputs a reconcile reads, with the persisted history, and explains the controller's decision."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from pathlib import Path

import pytest

from cli.main import main
from tests.e2e.test_autoscaler_support import (
    GROUP,
    PLURAL,
    VERSION,
    Workload,
    autoscaler,
    controller,
    install_crd,
    metrics_backend,
    pods_metric,
    replicas_of,
    status_of,
    until,
)
from tests.fakes.kube_api import FakeKubeAPI


async def test_explain_live_captures_the_inputs_and_history_and_agrees_with_the_controller(
        fake_kube: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    install_crd(fake_kube)
    kubeconfig = fake_kube.write_kubeconfig(tmp_path / "kubeconfig")
    saved = tmp_path / "snapshot.json"
    async with metrics_backend(fake_kube, tmp_path / "metrics") as backend, \
            Workload(fake_kube, "web", replicas=2, total=Decimal(60),
                     publish=backend.publisher("http_requests")):
        fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
            "web", target="web", metrics=[pods_metric("http_requests", "10")], max_replicas=6))
        async with controller(fake_kube):
            await until(lambda: replicas_of(fake_kube, "web") == 6
                        and status_of(fake_kube, "web").get("desiredReplicas") == 6,
                        within=15, what="the controller settles at 6")
        capsys.readouterr()
        code = await asyncio.to_thread(main, [
            "explain", "--live", "shop/web", "--kubeconfig", str(kubeconfig),
            "--save-snapshot", str(saved)])
    out = capsys.readouterr().out
    assert code == 0
    decision = json.loads(out)
    assert decision["desiredReplicas"] == 6
    assert decision["scaleUpdated"] is False
    # The controller runs with --leader-elect=false and published its settings all the same.
    assert decision["settingsSource"] == "controller"
    assert [m["current"] for m in decision["metrics"]] == ["10"]
    snapshot = json.loads(saved.read_text())
    assert snapshot["kind"] == "DecisionSnapshot"
    assert snapshot["scale"]["spec"]["replicas"] == 6
    assert len(snapshot["pods"]["items"]) == 6
    assert snapshot["metrics"][0]["kind"] == "MetricValueList"
    # The persisted history, read back as a new leader would: the last recommendation counts
    # as made now.
    recommendations = snapshot["history"]["recommendations"]
    assert recommendations[-1] == {"timestamp": snapshot["now"], "replicas": 6}


async def test_explain_live_names_what_it_could_not_read(
        fake_kube: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    install_crd(fake_kube)
    kubeconfig = fake_kube.write_kubeconfig(tmp_path / "kubeconfig")
    code = await asyncio.to_thread(main, ["explain", "--live", "shop/missing", "--kubeconfig",
                                          str(kubeconfig)])
    assert code == 2
    assert 'cannot read Autoscaler shop/missing: autoscalers.metricscale.dev "missing" not ' \
           'found' in capsys.readouterr().err
    assert await asyncio.to_thread(main, ["explain", "--live", "no-slash"]) == 2


async def test_explain_live_without_published_settings_says_defaults_are_assumed(
        fake_kube: FakeKubeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    install_crd(fake_kube)
    kubeconfig = fake_kube.write_kubeconfig(tmp_path / "kubeconfig")
    fake_kube.create(GROUP, VERSION, PLURAL, autoscaler(
        "web", target="web", metrics=[pods_metric("http_requests", "10")], max_replicas=6))
    await asyncio.to_thread(main, ["explain", "--live", "shop/web", "--kubeconfig",
                                   str(kubeconfig), "-o", "text"])
    assert "no settings published by the controller; upstream defaults are assumed" in \
        capsys.readouterr().out
    await asyncio.to_thread(main, ["explain", "--live", "shop/web", "--kubeconfig",
                                   str(kubeconfig),
                                   "--horizontal-pod-autoscaler-downscale-stabilization", "20s"])
    assert json.loads(capsys.readouterr().out)["settingsSource"] == "flags"
